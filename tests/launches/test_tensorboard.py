"""logger=tensorboard: real event files, read back with TensorBoard's own event reader (the
accumulator its server uses), against metrics.jsonl and the sweep summary.

The session's DDP sweep (2 points, W&B offline and TensorBoard together) is read back; a
copy of the session's DDP run, resumed, shows every step once; the missing package is
checked in-process.

TensorBoard stores every scalar as a 32-bit float, so values are compared with
metrics.jsonl's at float32 precision: float32(jsonl value) == the stored value, exactly.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from launcher.observe.tensorboard_sink import code_block

from launch import explain, metrics, summary, torchrun
from reference import copy_run
from reference_runs import DDP_RUN, DDP_SWEEP_POINTS, DDP_SWEEP_STEPS
from tb_readback import read_runs  # noqa: E402 - needs tensorboard
from wandb_readback import history

pytest.importorskip("tensorboardX", reason="in the test extra: pip install -e '.[test]'")


pytest.importorskip("tensorboard", reason="in the test extra: pip install -e '.[test]'")


POINTS = DDP_SWEEP_POINTS


STEPS = DDP_SWEEP_STEPS


def expected_scalars(run_dir) -> dict[str, list]:
    """metrics.jsonl as TensorBoard should hold it: every non-null figure but `step`, at
    its record's step, rounded to float32."""
    out: dict[str, list] = {}
    for record in metrics(run_dir):
        for key, value in record.items():
            if key != "step" and value is not None:
                out.setdefault(key, []).append((record["step"], float(np.float32(value))))
    return out


def assert_scalars_equal_metrics(scalars: dict, run_dir) -> None:
    want = expected_scalars(run_dir)
    assert set(scalars) == set(want), set(scalars) ^ set(want)
    for tag, values in want.items():
        assert scalars[tag] == values, tag  # same steps, each once, float32-equal values


@pytest.fixture(scope="module")
def sweep(ddp_sweep, tmp_path_factory):
    """The session's DDP sweep (tests/reference_runs.py): 2 points with W&B offline and
    TensorBoard together, read back once."""
    return {"tmp": tmp_path_factory.mktemp("tb"), "dir": ddp_sweep, "runs": read_runs(ddp_sweep)}


def test_one_event_directory_per_point_and_one_for_the_summary(sweep):
    """TensorBoard finds one run per sweep point (so it overlays them) and the summary's;
    rank 0 alone writes, one event file each."""
    assert set(sweep["runs"]) == {f"{p}/tb" for p in POINTS} | {"tb"}
    files = sorted(p.parent.relative_to(sweep["dir"]) for p in sweep["dir"].rglob("*tfevents*"))
    assert [str(f) for f in files] == sorted([f"{p}/tb" for p in POINTS] + ["tb"])


@pytest.mark.parametrize("point", POINTS)
def test_every_scalar_equals_metrics_jsonl(sweep, point):
    run_dir = sweep["dir"] / point
    scalars = sweep["runs"][f"{point}/tb"]["scalars"]
    assert_scalars_equal_metrics(scalars, run_dir)
    assert [s for s, _ in scalars["loss"]] == list(range(1, STEPS + 1))
    assert [s for s, _ in scalars["eval/loss"]] == [STEPS]
    assert {"step_time_s/p50", "step_time_s/slowest_rank", "comm/exposed_s"} <= set(scalars)


def test_config_env_and_summary_as_text(sweep):
    run_dir = sweep["dir"] / POINTS[0]
    texts = sweep["runs"][f"{POINTS[0]}/tb"]["text"]
    config = code_block((run_dir / "config.yaml").read_text(), "yaml")
    env = code_block((run_dir / "env.json").read_text(), "json")
    assert (texts["config/text_summary"], texts["env/text_summary"]) == ([(0, config)], [(0, env)])
    ((step, table),) = texts["summary/text_summary"]
    assert step == STEPS and "| status | completed |" in table
    assert f"| tokens_per_s | {summary(run_dir)['tokens_per_s']:.6g} |" in table


def test_sweep_summary_table_and_plot(sweep):
    from PIL import Image

    sweep_dir = sweep["dir"]
    summary_run = sweep["runs"]["tb"]
    ((step, table),) = summary_run["text"]["sweep/summary/text_summary"]
    assert step == 0 and table == (sweep_dir / "sweep_summary.md").read_text()
    assert table.count("| bucket_cap_mb=") == 2 and "**best**" in table
    ((step, (width, height, png)),) = summary_run["images"]["sweep/plot"]
    with Image.open(sweep_dir / "sweep_summary.png") as image:
        want = np.asarray(image.convert("RGB"))
    got = np.asarray(Image.open(io.BytesIO(png)))
    assert (step, (height, width)) == (0, want.shape[:2])
    assert np.array_equal(got, want)


def test_wandb_gets_the_same_runs_beside_tensorboard(sweep):
    """Both loggers at once: every point is a W&B run too, with the same rows."""
    for point in POINTS:
        run_dir = sweep["dir"] / point
        (found,) = (run_dir / "wandb").glob("offline-run-*")
        rows = history(found, sweep["tmp"])
        want = metrics(run_dir)
        assert [r["step"]["num"] for r in rows] == [m["step"] for m in want]
        assert [r["item"].get("loss") for r in rows] == [m.get("loss") for m in want]
    assert len(list((sweep["dir"] / "wandb").glob("offline-run-*"))) == 1  # the sweep summary


def test_resumed_run_shows_every_step_once(ddp_run, tmp_path):
    """A copy of the shared DDP run (24 steps, checkpoints at 12 and 24, TensorBoard on) whose
    step-24 checkpoint is unreadable (as after a crash before it was complete), extended to
    26 steps: it resumes from step 12 and redoes 13-24. metrics.jsonl keeps the redone steps
    only, and so does TensorBoard (purge_step): every timing of steps 13-24 is the second
    attempt's, and no step shows twice."""
    run_dir = copy_run(ddp_run, tmp_path / "r")
    model = run_dir / "checkpoints" / "step_00000024" / "model.pt"
    model.write_bytes(b"\0" * model.stat().st_size)
    args = [*DDP_RUN, "logger=tensorboard", f"run.root={tmp_path}", "run.id=r"]
    second = torchrun([*args, "trainer.max_steps=26"])
    assert second.returncode == 0, explain(second)
    assert "resumed from step 12" in second.stderr, explain(second)
    assert len(list((run_dir / "tb").glob("*tfevents*"))) == 2  # one file per attempt
    runs = read_runs(run_dir)
    assert set(runs) == {"tb"}
    assert_scalars_equal_metrics(runs["tb"]["scalars"], run_dir)
    assert [s for s, _ in runs["tb"]["scalars"]["loss"]] == list(range(1, 27))
    texts = runs["tb"]["text"]
    assert [s for s, _ in texts["config/text_summary"]] == [0, 12]  # each attempt's config
    ((step, table),) = texts["summary/text_summary"]  # the first attempt's was purged
    assert step == 26 and "| resumed_from_step | 12 |" in table
