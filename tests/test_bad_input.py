"""Bad input: one clear line naming the key or file and the fix, exit code 2, nothing started."""

from __future__ import annotations

import os
import sys

import pytest

from launcher.data.shm import shm_available_bytes
from launcher.train import main

from launch import FAST, torchrun


def run_main(monkeypatch, capsys, args: list[str]) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["launcher.train", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, capsys.readouterr().err


CASES = [
    (["trainer.max_stpes=3"], "trainer.max_stpes: unknown key (did you mean trainer.max_steps"),
    (["+trainer.foo=1"], "trainer.foo: unknown key"),
    (["trainer.max_steps=abc"], "trainer.max_steps:"),
    (["model=gpt3"], "model=gpt3: no such option; choose one of: gpt2, gpt2-large"),
    (["trainer.precision=fp64"], "trainer.precision=fp64: not one of fp32, bf16, fp16"),
    (["trainer.compile=fast"], "trainer.compile=fast: not one of off, default"),
    (
        ["trainer.global_batch_size=10", "trainer.micro_batch_size=4"],
        "trainer.global_batch_size=10 is not divisible by trainer.micro_batch_size=4",
    ),
    (["trainer.seq_len=2048"], "trainer.seq_len=2048 exceeds model.n_positions=1024"),
    (
        ["data=text_files", "data.paths=[/nonexistent/*.txt]"],
        "data.paths: no file matches '/nonexistent/*.txt'",
    ),
    (
        ["data=memmap", "data.paths=[/nonexistent/train.bin]"],
        "data.paths: /nonexistent/train.bin does not exist",
    ),
    (["strategy.bucket_cap_mb=-1"], "strategy.bucket_cap_mb=-1.0: must be a positive size"),
    (["data.num_workers=0"], "data.persistent_workers=true needs data.num_workers>0"),
    (
        ["strategy.comm_hook=powersgd2"],
        "strategy.comm_hook=powersgd2: not one of none, fp16, bf16, powersgd",
    ),
    (["strategy.powersgd_rank=0"], "strategy.powersgd_rank=0: must be at least 1"),
    (["strategy.powersgd_warmup_steps=-1"], "strategy.powersgd_warmup_steps=-1: must be 0 or more"),
    (
        ["strategy.powersgd_min_compression_rate=0.5"],
        "strategy.powersgd_min_compression_rate=0.5: must be at least 1",
    ),
    (
        ["strategy.comm_hook=powersgd", "trainer.precision=fp16"],
        "strategy.comm_hook=powersgd does not work with trainer.precision=fp16",
    ),
    (
        ["nccl.env.NCCL_ALOG=Ring"],
        "nccl.env.NCCL_ALOG: unknown key (did you mean nccl.env.NCCL_ALGO",
    ),
    (
        ["nccl=nvlnk"],
        "nccl=nvlnk: no such option; choose one of: debug, default, ethernet, infiniband, nvlink",
    ),
]


@pytest.mark.parametrize(("args", "expected"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_override_is_one_line(monkeypatch, capsys, args, expected):
    code, err = run_main(monkeypatch, capsys, args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]


def test_resume_path_without_checkpoint(monkeypatch, capsys, tmp_path):
    code, err = run_main(monkeypatch, capsys, [f"resume={tmp_path}"])
    assert code == 2
    assert err.strip() == (
        f"error: resume={tmp_path}: no complete checkpoint there; give a run directory, "
        "its checkpoints/ folder or a step_<n> folder, or use resume=auto"
    )


def test_shm_too_small_names_both_numbers_and_fixes(monkeypatch, capsys):
    size, free = shm_available_bytes()
    # Choose a prefetch depth whose need exceeds what /dev/shm has free right now.
    batch_bytes = 2 * 4 * 128 * 8
    prefetch = free // (2 * batch_bytes * 2) + 1
    code, err = run_main(
        monkeypatch, capsys, ["data.num_workers=2", f"data.prefetch_factor={prefetch}"]
    )
    assert code == 2
    line = err.strip()
    assert len(line.splitlines()) == 1
    for fix in ("--shm-size", "--ipc=host", "medium: Memory", "data.num_workers"):
        assert fix in line, line


def test_bad_input_under_torchrun_starts_nothing(tmp_path):
    """World size 2 makes a global batch of 6 with micro-batch 2 impossible: rank 0 says
    so once, and no run directory is created."""
    proc = torchrun([*FAST, f"run.root={tmp_path}", "trainer.global_batch_size=6"], timeout=120)
    assert proc.returncode != 0
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert ours == [
        "error: trainer.global_batch_size=6 is not divisible by trainer.micro_batch_size=2 x "
        "world size 2 = 4; choose a global batch that is a multiple of 4"
    ]
    assert not os.listdir(tmp_path)
