"""`python -m launcher.runs` (list and compare) on run directories written here: what the
list and the comparison say, the picture, and a table of bad flags and damaged files (one
line and exit 2 where the command cannot go on, the damage named in the run's row where the
list can; never a traceback)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from launcher import runs

from run_dir_tools import finished_run_dir, garbage


def pixels(path):
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).astype(int)


@pytest.fixture
def root(tmp_path):
    """Two finished runs, `a` (4 ranks) and `b` (2 ranks, another learning rate), and the
    `latest` link to b."""
    root = tmp_path / "runs"
    for name, loss0, lr, world in (("a", 6.0, 1e-3, 4), ("b", 5.0, 3e-3, 2)):
        run = finished_run_dir(root / name, loss0=loss0, lr=lr, ranks=world)
        env = {"world_size": world, "backend": "gloo", "devices": [], "versions": {"torch": "2.13"}}
        (run / "env.json").write_text(json.dumps(env))
    (root / "latest").symlink_to("b")
    return root


def test_runs_lists_and_compares(root, tmp_path, capsys):
    assert runs.main([str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "status", "steps", "loss", "eval", "loss", "tokens/s",
                                "mfu", "wall", "engine", "world", "exit"]  # fmt: skip
    assert [line.split()[:4] for line in lines[1:]] == [
        ["a", "completed", "20", "5.0000"],
        ["b", "completed", "20", "4.0000"],
    ]  # the link `latest` is not listed as a run of its own
    # mfu, wall (summary.json's 75 s as the closing block shows it), engine, world, exit
    assert lines[1].split()[-5:] == ["-", "1:15", "ddp", "4", "0"]
    plot = tmp_path / "cmp.png"
    assert runs.main(["compare", "a", "latest", "--root", str(root), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    # every setting that differs, the launch's world size among them; run.id is no setting
    assert "trainer.lr      0.001  0.003" in out and "run.id" not in out
    assert "env.world_size  4      2" in out and "settings that differ (2):" in out
    loss_row = next(line for line in out.splitlines() if line.startswith("loss "))
    assert loss_row.split() == ["loss", "5", "4", "-20.0%"]
    assert out.rstrip().endswith(f"loss curves: {plot}")
    assert (pixels(plot).sum(axis=2) < 3 * 250).mean() > 0.01


def test_the_picture_goes_beside_the_runs_or_into_the_folder_given(root, tmp_path, capsys):
    """Named after both runs (`latest` as the run it links to), beside them by default."""
    assert runs.main(["compare", str(root / "a"), str(root / "latest")]) == 0
    assert (root / "compare_a_vs_b.png").is_file()
    folder = tmp_path / "pictures"
    folder.mkdir()
    assert runs.main(["compare", "a", "b", "--root", str(root), "--plot", str(folder)]) == 0
    assert (folder / "compare_a_vs_b.png").is_file()
    assert capsys.readouterr().out.rstrip().endswith(str(folder / "compare_a_vs_b.png"))


def test_two_identical_curves_both_show(root, tmp_path):
    """b's curve exactly on a's: b's hollow markers still show in a colour of their own."""
    (root / "b" / "metrics.jsonl").write_text((root / "a" / "metrics.jsonl").read_text())
    plot = tmp_path / "same.png"
    assert runs.main(["compare", "a", "b", "--root", str(root), "--plot", str(plot)]) == 0
    rgb = pixels(plot)
    red = (rgb[..., 0] > 180) & (rgb[..., 1] < 90) & (rgb[..., 2] < 90)  # b's #d62728
    blue = (rgb[..., 2] > 150) & (rgb[..., 0] < 90)  # a's #1f77b4
    assert red.sum() > 200 and blue.sum() > 200


def write_bad(path, form: str) -> None:
    if form == "garbage":
        garbage(path)
    elif form == "a list":
        path.write_text("[1, 2]" if path.suffix == ".json" else "- a\n- b\n")
    elif form == "a folder":
        path.unlink()
        path.mkdir()
    elif form == "a dangling link":
        path.unlink()
        path.symlink_to(path.parent / "nowhere")
    elif form == "empty":
        path.write_text("")


# (file, form, what the list shows in b's status column, what compare's one line says)
DAMAGED = [
    ("summary.json", "garbage", "summary.json is not JSON", "summary.json is not JSON"),
    ("summary.json", "empty", "summary.json is not JSON", "summary.json is not JSON"),
    ("summary.json", "a list", "summary.json is not a JSON object", "not a JSON object"),
    ("summary.json", "a folder", "summary.json is a folder", "summary.json is a folder"),
    ("summary.json", "a dangling link", "summary.json unreadable", "summary.json unreadable"),
    ("env.json", "garbage", "completed", "env.json is not JSON"),
    ("env.json", "a folder", "completed", "env.json is a folder"),
    ("config.yaml", "garbage", "completed", "config.yaml unreadable"),
    ("config.yaml", "a list", "completed", "config.yaml is not a mapping of settings"),
]


@pytest.mark.parametrize(("name", "form", "listed", "refused"), DAMAGED)
def test_a_damaged_file_is_named_never_a_traceback(root, tmp_path, capsys, name, form, listed,
                                                    refused):  # fmt: skip
    write_bad(root / "b" / name, form)
    assert runs.main([str(root)]) == 0  # the list goes on, the damage in b's row
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["b"].split(None, 1)[1].startswith(listed), rows["b"]
    assert rows["a"].split()[1] == "completed"
    if name == "config.yaml":
        assert rows["b"].split()[-3] == "?"  # its engine cannot be read
    plot = tmp_path / "cmp.png"
    assert runs.main(["compare", "a", "b", "--root", str(root), "--plot", str(plot)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {root / 'b'}: ") and refused in err
    assert not plot.exists()


@pytest.mark.parametrize("form", ["garbage", "a folder", "empty"])
def test_a_damaged_or_missing_curve_still_compares(root, tmp_path, capsys, form):
    """metrics.jsonl is read line by line (a killed run leaves half a line): what cannot be
    read is no curve, and the rest of the comparison stands."""
    write_bad(root / "b" / "metrics.jsonl", form)
    (root / "a" / "summary.json").unlink()  # a still running: settings and its curve only
    plot = tmp_path / "cmp.png"
    assert runs.main(["compare", "a", "b", "--root", str(root), "--plot", str(plot)]) == 0
    assert plot.is_file() and "settings that differ" in capsys.readouterr().out
    assert runs.main([str(root)]) == 0
    assert runs.NO_SUMMARY in capsys.readouterr().out


# (arguments, what the one line says); "R" stands for the runs root, "T" for tmp_path
BAD_FLAGS = [
    (["--nope"], "unrecognized arguments: --nope; see `python -m launcher.runs --help`"),
    (["R", "R"], "unrecognized arguments"),
    (["T/missing"], "T/missing: no such folder; give the run.root"),
    (["R/a/config.yaml"], "R/a/config.yaml: not a folder"),
    (["compare", "a"], "the following arguments are required: b"),
    (["compare", "a", "b", "--plot"], "argument --plot: expected one argument"),
    (["compare", "a", "b", "--root"], "argument --root: expected one argument"),
    (["compare", "a", "b", "--bogus", "1"], "unrecognized arguments: --bogus 1"),
    (["compare", "nope", "b"], "nope: not a run directory (no config.yaml there nor under R)"),
    (["compare", "a", "T"], "not a run directory"),
    (["compare", "a", "b", "--plot", "T/x.txt"], "--plot T/x.txt: give a .png file name"),
    (["compare", "a", "b", "--plot", "/proc/x.png"], "cannot write in /proc"),
    (["compare", "a", "b", "--plot", "T/no/such/x.png"], "cannot write in T/no/such"),
]


@pytest.mark.parametrize(("argv", "said"), BAD_FLAGS)
def test_a_bad_flag_is_one_line_and_exit_2(root, tmp_path, capsys, argv, said):
    def place(text: str) -> str:
        return (
            text.replace("T/", f"{tmp_path}/")
            .replace("R/", f"{root}/")
            .replace(" R)", f" {root})")
            .replace("T", str(tmp_path))
            if text != "R"
            else str(root)
        )

    args = [place(a) if a not in ("compare", "a", "b") else a for a in argv]
    if args[:1] == ["compare"] and "--root" not in args:
        args += ["--root", str(root)]
    if argv[-1:] == ["--root"]:
        args = argv  # the flag without its value
    assert runs.main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("error: ") and place(said) in captured.err, captured.err
