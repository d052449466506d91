"""The knob matrix, launched: every launched row of tests/knob_rows.py is a point of one
multirun launch per engine (`+knob=a,b,...` over a config group written from the rows),
on top of the defaults users run (2 ranks, loader workers, 2 micro-batches per step),
next to a `reference` point of the same launch: the same model, seed and data.

Each row's proof is checked against that reference: `equal` rows within their `rel` at
every step (0: bit for bit), `finite` rows finite and their last loss within `rel`.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from knob_rows import BASE, ENGINES, launched
from launch import (
    FAST_USER_LOADER,
    base_env,
    explain,
    losses,
    summary,
    sweep_of_points,
    torchrun_cmd,
)
from paths import REPO
from run_dir_tools import not_blank
from text_corpus import article_folder
from wandb_readback import private_wandb_env

DOCS = REPO / "docs"
VOCAB = 512  # FAST's BPE vocabulary: the token files' range


def fixtures(tmp: Path) -> dict[str, str]:
    """The files the data rows read: token files (uint16 and uint32) and a WikiText-like
    folder; `{docs}` is this project's documentation."""
    tokens = np.random.default_rng(0).integers(0, VOCAB, 200_000)
    tokens.astype(np.uint16).tofile(tmp / "tokens16.bin")
    tokens.astype(np.uint32).tofile(tmp / "tokens32.bin")
    return {
        "docs": str(DOCS),
        "memmap": str(tmp / "tokens16.bin"),
        "memmap32": str(tmp / "tokens32.bin"),
        "wikitext": str(article_folder(tmp / "wikitext")),
    }


def knob_points(rows, files: dict[str, str]) -> dict[str, list[str]]:
    """{point: its whole command line}: `reference` (the base) and each row (the base and
    the row's keys, so the row's value wins)."""
    names = ["reference", *(r.name for r in rows)]
    overrides = [(), *(r.overrides for r in rows)]
    return {
        name: [*FAST_USER_LOADER, *BASE, *(o.format(**files) for o in keys)]
        for name, keys in zip(names, overrides, strict=True)
    }


@pytest.mark.timeout(1200)  # about 30 points, 3 of them compiling: 4-7 minutes on 2 cores
@pytest.mark.parametrize("engine", ENGINES)
def test_every_knob_runs_with_its_proof(engine, tmp_path):
    rows = launched(engine)
    args = sweep_of_points(tmp_path / "conf", knob_points(rows, fixtures(tmp_path)), "knob")
    args += [f"strategy={engine}", f"run.root={tmp_path / 'runs'}", "run.id=m"]
    cmd = torchrun_cmd(args, nproc=2)
    env = base_env(**private_wandb_env(tmp_path))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, explain(proc)
    sweep = tmp_path / "runs" / "m"
    ref = losses(sweep / "knob=reference")
    assert sorted(ref) == [1, 2, 3, 4] and all(math.isfinite(v) for v in ref.values())
    assert not (sweep / "knob=reference" / "traces").exists()  # the profiler is off by default
    assert not (sweep / "knob=reference" / "report.png").exists()  # run.report=false (FAST)
    if any(r.name == "run_report_on" for r in rows):
        assert not_blank(sweep / "knob=run_report_on" / "report.png") > 0.05
    wrong = []
    for r in rows:
        run = sweep / f"knob={r.name}"
        got = losses(run)
        if summary(run)["status"] != "completed" or sorted(got) != sorted(ref):
            wrong.append(f"{r.name}: {summary(run)['status']}, steps {sorted(got)}")
        elif not all(math.isfinite(v) for v in got.values()):
            wrong.append(f"{r.name}: non-finite loss {got}")
        elif r.expect == "equal":
            off = {s: got[s] for s in ref if got[s] != pytest.approx(ref[s], rel=r.rel, abs=0)}
            if off:
                wrong.append(f"{r.name}: {off} against {ref} (rel {r.rel:g})")
        elif got[4] != pytest.approx(ref[4], rel=r.rel, abs=0):
            wrong.append(f"{r.name}: last loss {got[4]} against {ref[4]} (rel {r.rel:g})")
    assert not wrong, "\n".join(wrong)
