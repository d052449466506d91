"""The forms a user types (issue 53): `--help` shows each with an example that composes, and
every wrong form of each (`exp=profile`, `+model=gpt2`, a key without `=`, a flag's dashes,
a group removed) is one line naming the right one, exit 2, through the train front door."""

from __future__ import annotations

import re
import sys

import pytest

from launcher.config import compose
from launcher.config.compose import HELP, config_groups, default_groups, wrong_form_problem
from launcher.config.sweep import compose_points
from launcher.train.front_door import main

from in_process import restored_logging  # noqa: F401 - a fixture
from paths import REPO

pytestmark = pytest.mark.usefixtures("restored_logging")
RIGHT = "python -m launcher.train --help shows each form"


def run_main(monkeypatch, capsys, args: list[str]) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["launcher.train", *args])
    try:
        main()
    except SystemExit as ended:
        code = ended.code
    else:
        code = 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def help_forms() -> list[tuple[str, str]]:
    """(form, example) of each line under "What you type" in train.yaml's help."""
    text = (REPO / "conf" / "train.yaml").read_text()
    block = text.split("What you type on the command line, one example each:\n", 1)[1]
    rows = []
    for line in block.splitlines():
        found = re.match(r"\s+(\S+(?: \S+)?)\s{2,}.+?\s{2,}(\S+(?: \S+)?)$", line)
        if not found:
            break
        rows.append((found[1], found[2]))
    return rows


def test_help_shows_each_form_with_an_example_that_composes(monkeypatch, capsys):
    forms = help_forms()
    assert [f for f, _ in forms] == ["+exp=NAME", "group=option", "key=value", "-m key=a,b"]
    for form, example in forms:
        if example.startswith("-m "):
            plan, points = compose_points([example.removeprefix("-m ")], multirun=True)
            assert len(points) == 2, form
        else:
            compose([example])
    code, out, _ = run_main(monkeypatch, capsys, ["--help"])
    assert code == 0 and "+exp=NAME      add an experiment" in out
    listed = [ln.split(":")[0] for ln in out.split("== Experiments (+exp=NAME)", 1)[1]
              .split("== Config", 1)[0].splitlines() if ":" in ln]  # fmt: skip
    # every group once, an added one (exp) as it is typed, with its +
    assert sorted(g.lstrip("+") for g in listed) == sorted(config_groups())
    assert [g for g in listed if g.startswith("+")] == ["+exp"]
    assert default_groups() == config_groups() - {"exp"}


# (what was typed, what the one line must say: the right form)
WRONG_FORMS = [
    (["exp=profile"], f"exp=profile: an experiment is added, with a +: write +exp=profile "
                      f"({RIGHT})"),
    (["+model=gpt2"], "+model=gpt2: model is a group every run has one option of; choose "
                      "another with model=gpt2, without the +"),
    (["++strategy=zero1"], "choose another with strategy=zero1, without the +"),
    (["model"], f"model: an override is key=value; write model=<option> ({RIGHT})"),
    (["trainer.max_steps", "50"], "trainer.max_steps: an override is key=value; write "
                                  "trainer.max_steps=<value>"),
    (["trainer.max_steps:50"], "write trainer.max_steps=50"),
    (["+trainer.max_steps=50"], "+trainer.max_steps=50: trainer.max_steps exists already; "
                                "write trainer.max_steps=50, without the +"),
    (["--trainer.max_steps=50"], "--trainer.max_steps=50: not a flag this command takes; an "
                                 "override is written without dashes: trainer.max_steps=50"),
    (["-x"], "-x: not a flag this command takes"),
    (["=50"], "=50: the key before = is missing"),
    (["~model"], "~model: every run needs a model; choose another option with model=<option>"),
    (["~logger"], "every run needs a logger"),
    (["~trainer"], "~trainer: trainer cannot be removed; set its keys instead"),
    (["~trainer.max_steps"], "trainer.max_steps: TrainerConfig (DictConfig) does not support "
                             "deletion"),
    (["~exp"], "~exp: no exp was added (+exp=NAME), so none can be removed"),
    (["--cfg=nope"], "argument --cfg/-c: invalid choice: 'nope'"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "said"), WRONG_FORMS, ids=[" ".join(a) for a, _ in WRONG_FORMS])
def test_a_wrong_form_is_one_line_naming_the_right_one(monkeypatch, capsys, args, said):
    code, out, err = run_main(monkeypatch, capsys, [*args, "--cfg", "job"])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and said in err, err


def test_the_right_forms_still_compose():
    compose(["+exp=profile", "~exp", "+exp=throughput"])  # an added experiment can go again
    assert compose(["+exp=profile", "model=gpt2", "trainer.max_steps=5"]).trainer.max_steps == 5
    assert compose(["++trainer.max_steps=5"]).trainer.max_steps == 5  # Hydra's force form


@pytest.mark.parametrize("group", sorted(default_groups()))
def test_a_sweep_over_a_group_is_a_right_form_and_its_wrong_form_still_one_line(group):
    """`nccl=default,debug` is a sweep (the check of the points says whether it may vary);
    with a + it is still a wrong form, named without a value a sweep cannot print."""
    options = sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml"))[:2]
    swept = f"{group}={','.join(options)}"
    assert wrong_form_problem(swept) is None
    said = wrong_form_problem(f"+{swept}")
    assert said == (f"+{swept}: {group} is a group every run has one option of; choose another "
                    f"with {group}=<option>, without the + ({HELP})")  # fmt: skip
