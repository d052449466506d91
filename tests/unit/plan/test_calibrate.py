"""launcher.plan.calibrate: the compute model and the links fitted to measured runs, exact
where the runs determine them (runs made up from known coefficients), and what no run can
tell apart left out and said; a shape far from the runs marked extrapolated."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from launcher.config import compose
from launcher.plan import comm
from launcher.plan.calibrate import (
    Features,
    cpu_share,
    fit_compute,
    fit_links,
    fitted_topology,
    nnls,
)
from launcher.plan.measured import RunRecord, Sample
from launcher.plan.memory import train_state
from launcher.plan.presets import Link, Topology
from launcher.plan.shape import shape_of

RATE, OPTIMIZER, SCORES = 20e9, 3e-9, 2e-11  # FLOP/s; seconds an optimizer element, a score
FIXED = {"ddp": (2e-3, 5e-3), "fsdp2": (4e-3, 9e-3)}  # (a layer and micro-step, a step)


def made_up(engine: str, overrides: list[str]):
    """A run of `engine` at `overrides` whose compute is exactly the model's."""
    shape = shape_of(compose([f"strategy={engine}", "model.vocab_size=512", *overrides]), 2)
    x = Features.of(shape, engine, train_state(shape.cfg, 2)["optimizer"])
    micro, step = FIXED[engine]
    compute = x.flops / RATE + x.optimizer * OPTIMIZER + x.scores * SCORES
    compute += x.micro_layers * micro + step
    record = RunRecord(f"run {engine} {overrides}", shape, engine, 2, 2, 2, None,
                       step_s=compute, exposed_s=0.0, wait_s=0.0, comm_s=None)  # fmt: skip
    return record, x


SHAPES = [[], ["trainer.micro_batch_size=2"], ["model.n_embd=128"], ["trainer.seq_len=256"],
          ["model.n_layer=4"]]  # fmt: skip


def test_every_coefficient_is_recovered_where_the_runs_tell_them_apart():
    runs = [made_up("ddp", s) for s in SHAPES] + [made_up("fsdp2", s) for s in SHAPES[:2]]
    fit = fit_compute([r for r, _ in runs], [x for _, x in runs])
    assert fit.left_out == []
    assert fit.coef["rate:fp32"] == pytest.approx(RATE, rel=1e-6)
    assert fit.coef["optimizer"] == pytest.approx(OPTIMIZER, rel=1e-6)
    assert fit.coef["scores"] == pytest.approx(SCORES, rel=1e-6)
    for engine, (micro, step) in FIXED.items():
        assert fit.coef[f"micro:{engine}"] == pytest.approx(micro, rel=1e-6)
        assert fit.coef[f"step:{engine}"] == pytest.approx(step, rel=1e-6)
    far, x = made_up("fsdp2", ["model.n_layer=8", "model.n_embd=256"])
    seconds, notes = fit.predict(x)
    assert seconds == pytest.approx(far.step_s, rel=1e-6)
    assert any("flops" in n and "beyond 4x" in n for n in notes)  # 16x the FLOPs: said


def test_one_run_is_all_flop_rate_and_says_so():
    """One run cannot split its fixed costs from its FLOP rate: the rate takes the whole
    compute (the old `--from`), and the others are named as left out."""
    run, x = made_up("ddp", [])
    fit = fit_compute([run], [x])
    assert fit.coef == {"rate:fp32": pytest.approx(x.flops / run.step_s)}
    assert set(fit.left_out) == {"step:ddp", "micro:ddp", "optimizer", "scores"}
    other, y = made_up("fsdp2", [])
    assert fit.predict(y)[1] == ["no run of fsdp2: its fixed costs taken as ddp's"]


def test_ranks_sharing_cores_slow_their_collectives():
    """4 ranks on 2 cores: each step of a ring waits for both its ends to be scheduled, so
    the collectives take twice as long; a run's are divided by its share before fitting."""
    assert (cpu_share(4, 2), cpu_share(2, 2), cpu_share(1, 2), cpu_share(8, None)) == (2, 1, 1, 1)
    link = Link("true", 0.5e9, 2e-4, "-")
    one_core_each = comm.collective_s("all_reduce", 1e6, Topology(1, 2, link))
    shared = Sample("all_reduce", 2, 2, 1e6, 2 * one_core_each, 1, "r", "ddp")
    fit = fit_links([shared], Link("gloo", 1.5e9, 50e-6, "-"), {"r": 2.0})
    assert comm.collective_s("all_reduce", 1e6, Topology(1, 2, fit.by_op[("ddp", "all_reduce")])) \
        == pytest.approx(one_core_each)  # fmt: skip


def test_ranks_sharing_cores_compute_on_their_share_of_a_core():
    """A run of 2 ranks a node on 1 core took twice its compute: divided by its share
    before fitting, it gives the coefficients a core each gives."""
    runs = [made_up("ddp", s) for s in SHAPES]
    (first, x), rest = runs[0], runs[1:]
    crowded = replace(first, per_node=2, cores=1, step_s=2 * first.step_s)
    fit = fit_compute([crowded, *(r for r, _ in rest)], [x, *(y for _, y in rest)])
    assert fit.coef["rate:fp32"] == pytest.approx(RATE, rel=1e-6)
    assert fit.coef["micro:ddp"] == pytest.approx(FIXED["ddp"][0], rel=1e-6)


def test_nnls_keeps_coefficients_non_negative():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert nnls(a, np.array([3.0, 5.0, 7.0])) == pytest.approx([1.0, 2.0])
    assert nnls(a, np.array([3.0, 2.0, 1.0])) == pytest.approx([2.0, 0.0])  # slope < 0: none


def test_a_link_is_fitted_per_engine_and_collective_over_the_sizes_measured():
    """t = 2(n-1) alpha + 2(n-1)/n B / busbw for an all-reduce: two sizes give both; one
    size scales the preset's alpha and 1/busbw alike; an engine's own runs time its
    collectives, every engine's together the others', and a kind not measured takes the
    all-reduce's."""
    alpha, busbw = 2e-4, 0.5e9
    true = Topology(1, 2, Link("true", busbw, alpha, "-"))
    samples = [Sample("all_reduce", 2, 2, size, comm.collective_s("all_reduce", size, true),
                      1, "r", "ddp") for size in (1e4, 1e6)]  # fmt: skip
    slow = Sample("all_reduce", 2, 2, 1e6, 0.5, 1, "z", "deepspeed zero_stage=1")
    preset = Link("gloo", 1.5e9, 50e-6, "-")
    fit = fit_links([*samples, slow], preset, {"r": 1.0, "z": 1.0})
    assert fit.by_op[("ddp", "all_reduce")].alpha == pytest.approx(alpha)
    assert fit.by_op[("ddp", "all_reduce")].busbw == pytest.approx(busbw)
    assert fit.chosen("ddp", "all_gather") == ("ddp", "all_reduce")
    assert fit.chosen("fsdp2", "all_reduce") == ("", "all_reduce")  # every engine's runs
    topo = fitted_topology(Topology(1, 2, preset), fit, "ddp")
    assert comm.collective_s("all_gather", 1e6, topo) == pytest.approx(
        comm.collective_s("all_gather", 1e6, true))  # fmt: skip
    zero1 = fitted_topology(Topology(1, 2, preset), fit, "deepspeed zero_stage=1")
    assert comm.collective_s("all_reduce", 1e6, zero1) == pytest.approx(0.5)
    single = fit_links(samples[1:], preset, {"r": 1.0}).by_op[("ddp", "all_reduce")]
    assert single.alpha / preset.alpha == pytest.approx(preset.busbw / single.busbw)
    assert comm.collective_s("all_reduce", 1e6, Topology(1, 2, single)) == pytest.approx(
        samples[1].seconds)  # fmt: skip
