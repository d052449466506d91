"""launcher.tune carries on past a candidate that crashes or is refused: each is rejected
with its reason in the report and on the console, the other candidates are timed, and the
tuning ends as usual (one real 2-rank launch with planted candidates: tests/tune_planted.py).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from launch import base_env, explain
from paths import TESTS
from tune_runs import SMALL, TUNE_TIMEOUT, report

PLANTED = TESTS / "tune_planted.py"


def test_crashing_and_refused_candidates_are_rejected_and_tuning_goes_on(tmp_path):
    tokens = tmp_path / "tokens.bin"  # ids up to 999 for a vocabulary of 512
    np.random.default_rng(0).integers(0, 1000, 100_000).astype(np.uint16).tofile(tokens)
    args = [a for a in SMALL if not a.startswith("trainer.seq_len")]
    args += [f"run.root={tmp_path}", "run.id=planted", "tune.max_rounds=1"]
    args += ["trainer.seq_len=32", "trainer.global_batch_size=2", "trainer.micro_batch_size=1"]
    args += ["strategy.bucket_cap_mb=0.0005", "tune.skip=[data.num_workers,strategy.comm_hook]"]
    args += [f"data.paths=[{tokens}]", "data.vocab_size=512"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*cmd, str(PLANTED), *args],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=TUNE_TIMEOUT,
    )
    assert proc.returncode == 0, explain(proc)
    (r,) = report(tmp_path / "planted")["rounds"]
    by_name = {c["name"]: c for c in r["candidates"]}
    crashed, refused = by_name["model.dropout=0.125"], by_name["trainer.micro_batch_size=3"]
    bad_data = by_name["data.source=memmap"]
    assert crashed["verdict"] == "rejected" and "IndexError" in crashed["reason"], crashed
    assert refused["verdict"] == "rejected" and "refused" in refused["reason"], refused
    assert "trainer.micro_batch_size=3" in refused["reason"]
    assert bad_data["verdict"] == "rejected" and "exit 2 (bad input)" in bad_data["reason"]
    assert "outside the vocabulary" in bad_data["reason"] or "vocab" in bad_data["reason"]
    for c in (crashed, bad_data):  # not repeated: rejected once
        assert c["trials"] == [f"r1-{c['name']}-1"], c
    console = proc.stdout + proc.stderr
    assert "tune: trial r1-model.dropout=0.125-1 crashed: IndexError" in console
    assert "tune: trial r1-trainer.micro_batch_size=3-1 refused:" in console
    # The real candidates after them were timed, each in both repeats (static_graph among
    # them); whether one is kept is a timing decision, test_tune.py's.
    real = [c for c in r["candidates"] if c["evidence"] != "planted"]
    assert "strategy.static_graph=true" in {c["name"] for c in real}
    for c in real:
        assert len(c["trials"]) == 2 and c["step_time_p50_s"] is not None, c
        assert not c["reason"].startswith("failed"), c
    md = (tmp_path / "planted" / "tune" / "report.md").read_text()
    assert "IndexError" in md
