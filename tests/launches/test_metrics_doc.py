"""docs/metrics.md in step with what runs write: every key of a `metrics.jsonl` record is a
name of its table, and every name of its table is a key some run writes.

The keys come from the session's shared reference runs (tests/reference_runs.py: every
engine's run of the strategy sweep, the DDP run with its evals), read, not launched again;
the keys a knob those runs leave off adds (the non-finite and out-of-memory policies' counts)
come from the recorder itself with those knobs on.
"""

from __future__ import annotations

import re

from launcher.observe.recorder import Recorder
from launcher.runtime.process import Runtime

from in_process import CPU, trainer
from launch import metrics
from paths import REPO

METRICS_DOC = REPO / "docs" / "metrics.md"


def documented_names() -> set[str]:
    """The names of docs/metrics.md's table: each backticked name of a row's first cell;
    a `/p90`-style suffix (in the first cell or the row's text) names the first name's
    spread (`step_time_s/p50`, `/p90`: step_time_s/p90; `data_wait_s` ... `/p50`:
    data_wait_s/p50)."""
    names = set()
    for line in METRICS_DOC.read_text().split("| name | meaning |", 1)[1].splitlines()[2:]:
        if not line.startswith("| `"):
            break
        first, meaning = line.strip().strip("|").split("|", 1)
        full = [n for n in re.findall(r"`([^`]+)`", first) if not n.startswith("/")]
        base = full[0].removesuffix("/p50")
        names |= set(full)
        names |= {base + suffix for suffix in re.findall(r"`(/\w+)`", first + meaning)}
    return names


def knob_keys() -> set[str]:
    """The keys a record holds with trainer.on_nonfinite=rewind and trainer.on_oom=retry."""
    rt = Runtime(0, 0, 1, CPU, None, run_id="r")
    t = trainer(on_nonfinite="rewind", on_oom="retry")
    recorder = Recorder(rt, t, [], tokens_per_step=64, flops_per_token=6.0,
                        mfu=lambda tokens_per_s: None, micro_batch=4)  # fmt: skip
    return {*recorder.bad_step_counts(), *recorder.micro_batch_figures()}


def test_the_metrics_doc_names_every_key_a_run_writes(strategy_sweep, ddp_run):
    runs = [ddp_run, *sorted(p for p in strategy_sweep.iterdir() if p.name.startswith("strategy="))]
    assert len(runs) == 7  # the DDP run and the sweep's six engines
    written = {key for run in runs for record in metrics(run) for key in record}
    written |= knob_keys()
    documented = documented_names()
    assert sorted(written - documented) == []  # a key no row explains
    assert sorted(documented - written) == []  # a row no run writes
