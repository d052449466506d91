"""`python -m launcher.analyze` under bad input, in-process: its flags, the paths it is
given, every trace in its wrong forms and an analysis/ folder it cannot write, each refused
in one line, exit 2, nothing written. (A damaged hang record: test_fault_logic.py.)"""

from __future__ import annotations

import pytest
from refusals import refusal

from launcher.analyze.__main__ import main as analyze_main


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def refused(capsys, argv: list[str]) -> str:
    return refusal(capsys, lambda: analyze_main(argv))


FLAGS = [
    ([], "the following arguments are required: paths"),
    (["--bogus", "RUN"], "unrecognized arguments: --bogus"),
    (["NOWHERE", "--no-wandb"], "no such folder; give a run directory (runs/<id>)"),
    (["A_FILE", "--no-wandb"], "no such folder; give a run directory"),
    (["RUN", "--no-wandb"], "no traces/rank*/ here or in its sweep points; run with profiler"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "words"), FLAGS, ids=[" ".join(a) or "none" for a, _ in FLAGS])
def test_a_bad_argument_or_path_is_one_line(tmp_path, capsys, argv, words):
    (tmp_path / "file").write_text("not a run")
    where = {"RUN": tmp_path, "NOWHERE": tmp_path / "nowhere", "A_FILE": tmp_path / "file"}
    line = refused(capsys, [str(where.get(a, a)) for a in argv])
    assert words in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("rank0.1.pt.trace.json", '{"traceEvents": [', "JSONDecodeError"),
        ("rank0.1.pt.trace.json", "", "JSONDecodeError"),
        ("rank0.1.pt.trace.json", "\xff\xfe garbage", "JSONDecodeError"),
        ("rank0.1.pt.trace.json.gz", "not gzip", "BadGzipFile"),
        ("rank0.1.pt.trace.json", "[]", "no traceEvents list"),
        (
            "rank0.1.pt.trace.json",
            '{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "launcher/step 1"}]}',
            "malformed event: KeyError",
        ),
    ],
)
def test_analyze_refuses_a_damaged_trace(tmp_path, capsys, name, content, reason):
    folder = tmp_path / "traces" / "rank0"
    folder.mkdir(parents=True)
    (folder / name).write_text(content)
    assert analyze_main([str(tmp_path), "--no-wandb"]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: {folder / name}: not a readable profiler trace (")
    assert reason in line
    assert not (tmp_path / "analysis").exists()


def test_analyze_refuses_an_unwritable_analysis_folder(tmp_path, capsys):
    (tmp_path / "traces" / "rank0").mkdir(parents=True)
    (tmp_path / "analysis").write_text("")  # a file where the folder goes
    assert analyze_main([str(tmp_path), "--no-wandb"]) == 2
    assert one_error_line(capsys) == (
        f"error: {tmp_path}/analysis: {tmp_path}/analysis is not a writable directory; "
        "make the run directory writable"
    )
