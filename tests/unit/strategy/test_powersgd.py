"""PowerSGD on fabricated buckets and a real one-rank gloo group: the rank-r projection and
its exact error, error feedback, warm start, warm-up, and its state through checkpoints."""

from __future__ import annotations

import torch

from launcher.checkpoint.protocol import (
    step_name,
)
from launcher.strategy.ddp.comm_hooks import make_hook
from launcher.strategy.ddp.powersgd import PowerSGDState, load_state, powersgd_hook, save_state

from in_process import CPU


class Bucket:
    """What powersgd_hook uses of DDP's GradBucket: one flat buffer whose views are the
    gradients of `params` (in order), and whether it is the step's last bucket."""

    def __init__(self, params: list[torch.nn.Parameter], grads: list[torch.Tensor], last=True):
        self._params = params
        self._buffer = torch.cat([g.reshape(-1) for g in grads]).to(torch.float64)
        self._grads, offset = [], 0
        for g in grads:
            self._grads.append(self._buffer[offset : offset + g.numel()].view(g.shape))
            offset += g.numel()
        self._last = last

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._grads

    def parameters(self) -> list[torch.nn.Parameter]:
        return self._params

    def is_last(self) -> bool:
        return self._last


# name, shape, compressed at rank 2 with min_compression_rate 2 ((n + m) r 2 < n m)?
SHAPES = [("w", (16, 12), True), ("b", (5,), False), ("small", (3, 3), False)]


SHAPES.append(("conv", (8, 2, 5), True))  # folded to 8 x 10


def make_state(start_step=0, **kwargs):
    params = [torch.nn.Parameter(torch.zeros(shape)) for _, shape, _ in SHAPES]
    state = PowerSGDState(
        [(name, p) for (name, _, _), p in zip(SHAPES, params, strict=True)],
        matrix_rank=2,
        start_step=start_step,
        min_compression_rate=2.0,
        plain_hook=make_hook(None, None),
        epsilon=kwargs.pop("epsilon", 0.0),
        **kwargs,
    )
    return state, params


def random_grads(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for _, shape, _ in SHAPES]


def run_hook(state, params, grads, last=True) -> list[torch.Tensor]:
    bucket = Bucket(params, grads, last)
    out = powersgd_hook(state, bucket).wait()
    assert out is bucket.buffer()
    return [g.clone() for g in bucket.gradients()]


def projection(matrix: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """One power-iteration step's rank-r approximation: M projected onto span(M Q)."""
    basis, _ = torch.linalg.qr(matrix @ q)
    return basis @ basis.T @ matrix


def test_powersgd_one_rank_is_rank_r_projection_with_exact_error(gloo_world):
    """At world size 1 each compressed matrix comes back as P Q^T = M projected onto the
    span of M Q0 (Q0 the seeded initial Q), rank r; vectors and small matrices come back
    exactly; the error kept is M - P Q^T; the step counts the last bucket."""
    state, params = make_state()
    grads = random_grads(0)
    out = run_hook(state, params, grads)
    assert state.step == 1
    for (name, shape, compressed), g, o in zip(SHAPES, grads, out, strict=True):
        if not compressed:
            assert torch.equal(o, g)
            assert name not in state.errors and name not in state.qs
            continue
        m = g.reshape(shape[0], -1)
        q0 = state.initial_q(name, m.shape[1], 2, m)
        expected = projection(m, q0)
        assert torch.allclose(o.reshape(m.shape), expected, atol=1e-10)
        assert torch.linalg.matrix_rank(o.reshape(m.shape)) == 2
        assert torch.allclose(state.errors[name], m - expected, atol=1e-10)
        assert state.qs[name].shape == (m.shape[1], 2)


def test_powersgd_error_feedback_and_warm_start(gloo_world):
    """The next step compresses M2 + error1 starting from last step's Q: its output is
    that sum projected onto span((M2 + e1) Q1), and output + new error = M2 + e1."""
    state, params = make_state()
    run_hook(state, params, random_grads(0))
    e1 = {name: state.errors[name].clone() for name in ("w", "conv")}
    q1 = {name: state.qs[name].clone() for name in ("w", "conv")}
    grads = random_grads(1)
    out = run_hook(state, params, grads)
    for (name, shape, compressed), g, o in zip(SHAPES, grads, out, strict=True):
        if not compressed:
            assert torch.equal(o, g)
            continue
        target = g.reshape(shape[0], -1) + e1[name]
        expected = projection(target, q1[name])
        assert torch.allclose(o.reshape(target.shape), expected, atol=1e-10)
        assert torch.allclose(o.reshape(target.shape) + state.errors[name], target, atol=1e-10)
    assert state.step == 2


def test_powersgd_plain_before_start_step_and_counts_only_last_buckets(gloo_world):
    """Below start_step the plain all-reduce runs (the bucket comes back unchanged at
    world size 1, no memory kept); only a step's last bucket advances the step count."""
    state, params = make_state(start_step=2)
    for seed, last, step_after in ((0, False, 0), (1, True, 1), (2, True, 2)):
        grads = random_grads(seed)
        out = run_hook(state, params, grads, last=last)
        assert all(torch.equal(o, g) for o, g in zip(out, grads, strict=True))
        assert state.errors == {} and state.qs == {}
        assert state.step == step_after
    grads = random_grads(3)
    out = run_hook(state, params, grads, last=False)  # step 2 reached: compression starts
    assert state.step == 2
    assert not torch.equal(out[0], grads[0]) and set(state.errors) == {"w", "conv"}


def test_powersgd_zero_gradient_stays_finite(gloo_world):
    """An all-zero matrix (a frozen layer) compresses to zeros, not NaN (the epsilon)."""
    state, params = make_state(epsilon=1e-8)
    grads = [torch.zeros_like(g) for g in random_grads(0)]
    out = run_hook(state, params, grads)
    assert all(torch.equal(o, torch.zeros_like(o)) for o in out)
    assert all(torch.isfinite(e).all() for e in state.errors.values())


def test_powersgd_state_round_trips_through_checkpoint_files(gloo_world, tmp_path):
    """save_state/load_state restore step, Q factors and errors, so the restored state's
    next step is bit-identical to the original's; a rank without its own file gets rank
    0's step and Qs without errors; a folder without any file restarts at its step."""
    state, params = make_state()
    run_hook(state, params, random_grads(0))
    run_hook(state, params, random_grads(1))
    folder = tmp_path / step_name(7)
    folder.mkdir()
    save_state(state, folder, rank=0)

    restored, restored_params = make_state()
    load_state(restored, folder, 0, CPU)
    assert restored.step == state.step == 2
    for name in ("w", "conv"):
        assert torch.equal(restored.qs[name], state.qs[name])
        assert torch.equal(restored.errors[name], state.errors[name])
    ours = run_hook(state, params, random_grads(2))
    theirs = run_hook(restored, restored_params, random_grads(2))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))

    other, _ = make_state()
    load_state(other, folder, 1, CPU)
    assert other.step == 2 and other.errors == {} and set(other.qs) == {"w", "conv"}

    empty = tmp_path / step_name(42)
    empty.mkdir()
    fresh, _ = make_state()
    fresh.errors = {"w": torch.ones(1)}
    load_state(fresh, empty, 0, CPU)
    assert fresh.step == 42 and fresh.errors == {} and fresh.qs == {}
    save_state(None, empty, 0)
    load_state(None, folder, 0, CPU)
    assert list(empty.iterdir()) == []
