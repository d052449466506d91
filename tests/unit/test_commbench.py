"""`torchrun ... -m launcher.commbench` under bad input, in-process: each flag's bad values
refused in one line, exit 2, before any process group (its figures: launches/test_comm.py)."""

from __future__ import annotations

import pytest
from refusals import refusal

from launcher import commbench

CASES = [
    (["--iters", "0"], "argument --iters: 0: must be at least 1"),
    (["--warmup", "-1"], "argument --warmup: -1: must be at least 0"),
    (["--factor", "1"], "argument --factor: 1: must be at least 2"),
    (["--factor", "x"], "argument --factor: 'x' is not a whole number"),
    (["--min-bytes", "abc"], "argument --min-bytes: 'abc' is not a size; write e.g. 1K, 16M"),
    (["--min-bytes", "0"], "argument --min-bytes: 0: must be at least 1 byte"),
    (["--max-bytes", "nan"], "argument --max-bytes: nan: must be at least 1 byte"),
    (["--max-bytes", "1K", "--min-bytes", "1M"], "--min-bytes (1048576 B) is more than"),
    (["--dtypes", "fp8"], "argument --dtypes: 'fp8' is not one of fp32, bf16, fp16"),
    (["--dtypes", "fp32,,bf16"], "argument --dtypes: '' is not one of"),
    (["--out", "/proc/x.json"], "--out /proc/x.json: not a file that can be written"),
    (["--out", "/nonexistent/x.json"], "--out /nonexistent/x.json: not a file that can be"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    ([], "run it under torchrun, e.g. torchrun --standalone --nproc_per_node=8"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "words"), CASES, ids=[" ".join(a) or "no torchrun" for a, _ in CASES]
)
def test_a_bad_flag_is_one_line(capsys, monkeypatch, tmp_path, argv, words):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert words in refusal(capsys, lambda: commbench.main(argv))
    assert not list(tmp_path.iterdir())  # nothing written
