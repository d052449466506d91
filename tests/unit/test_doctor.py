"""`python -m launcher.doctor` under bad input, in-process: its own flags refused in one
line; every problem of the overrides listed (not only the first), each in the words the
trainer refuses it with; no /dev/shm need shown for a config that has none; exit 2 as the
trainer's, 0 for a config that runs here."""

from __future__ import annotations

import json
import sys

import pytest

from launcher import doctor
from launcher.train.front_door import main as train_main

from in_process import restored_logging  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("restored_logging")


def trainer_line(monkeypatch, capsys, args: list[str]) -> str:
    """The one line the train front door refuses `args` with (exit 2)."""
    monkeypatch.setattr(sys, "argv", ["launcher.train", *args])
    with pytest.raises(SystemExit) as exit_info:
        train_main()
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.count("\n") == 0, err
    return err.removeprefix("error: ")


def report(capsys, args: list[str]) -> tuple[int, list[str], str]:
    """(exit code, the report's PROBLEM lines, stderr) of doctor.main(args)."""
    code = doctor.main(args)
    out, err = capsys.readouterr()
    problems = [
        ln.removeprefix("PROBLEM     ") for ln in out.splitlines() if ln.startswith("PROBLEM")
    ]
    return code, problems, err


FLAGS = [
    (["--jsn"], "error: --jsn: not a flag of launcher.doctor (--json, --help); overrides are"),
    (["-v", "data.num_workers=2"], "error: -v: not a flag of launcher.doctor"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "line"), FLAGS, ids=[a[0] for a, _ in FLAGS])
def test_a_bad_flag_is_one_line(capsys, args, line):
    code, problems, err = report(capsys, args)
    assert code == 2 and problems == [] and err.strip().startswith(line), err
    assert err.count("\n") == 1


# Bad values of every kind the trainer refuses: each alone, then all at once.
BAD = [
    ["trainer.max_steps=-1"],
    ["data.num_workers=-3"],
    ["trainer.precision=fp8"],
    ["+trainer.foo=1"],
    ["model.n_head=0"],
    ["model.init_from=/nonexistent/gpt2"],
    ["run.root=/proc/runs"],
    ["trainer.global_batch_size=10", "trainer.micro_batch_size=4"],
]


@pytest.mark.parametrize("args", BAD, ids=lambda a: " ".join(a))
def test_each_problem_is_the_trainers_line(monkeypatch, capsys, args):
    expected = trainer_line(monkeypatch, capsys, args)
    code, problems, _ = report(capsys, args)
    assert code == 2 and problems == [expected]


def test_every_problem_is_listed_not_only_the_first(monkeypatch, capsys):
    """The three bad values the issue met, and more of their kind: each key's own problem,
    all of them; no negative /dev/shm need for -3 workers (none is shown)."""
    args = ["trainer.max_steps=-1", "data.num_workers=-3", "trainer.precision=fp8",
            "strategy.bucket_cap_mb=-1", "+trainer.foo=1"]  # fmt: skip
    singles = {trainer_line(monkeypatch, capsys, [a]) for a in args}
    code, problems, _ = report(capsys, args)
    assert code == 2 and set(problems) == singles and len(problems) == len(args)
    assert doctor.main(["--json", *args]) == 2
    facts = json.loads(capsys.readouterr().out)
    assert facts["shm"]["need_bytes"] is None and len(facts["problems"]) == len(args)
    doctor.main(args)
    out = capsys.readouterr().out
    assert "this config needs an unknown amount until the problems below are fixed" in out
    assert "-" not in out.split("/dev/shm")[1].split("\n")[0].split("needs")[1]


def test_every_override_that_does_not_compose_is_listed(monkeypatch, capsys):
    """Overrides that do not compose: each one, as an error line and a problem; the ones
    that compose are judged too (a key of a chosen option with its option)."""
    args = ["trainer.max_stpes=3", "model=nope", "strategy=zero2", "strategy.zero_stage=2",
            "data.num_workers=-2"]  # fmt: skip
    code, problems, err = report(capsys, args)
    assert code == 2
    assert [ln.removeprefix("error: ") for ln in err.splitlines()] == problems[:2]
    assert problems[0].startswith("trainer.max_stpes: unknown key")
    assert problems[1].startswith("model=nope: no such option")
    assert problems[2:] == ["data.num_workers=-2: must be 0 or more"]


def test_a_config_that_runs_here_is_ok(capsys):
    code, problems, err = report(capsys, ["data.num_workers=2"])
    assert (code, problems) == (0, [])
    assert "this config needs 64.0 KiB (2 workers x prefetch 2 x 1 ranks on this node)" in (
        doctor.main(["data.num_workers=2"]) == 0 and capsys.readouterr().out
    )
