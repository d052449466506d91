"""DDP gradient-communication hooks: `strategy.comm_hook` = none, fp16, bf16 or powersgd.

fp16/bf16 halve the bytes each all-reduce sends: the bucket is cast, all-reduced and cast
back (and divided by the world size). powersgd sends a low-rank approximation of every
large gradient matrix instead (see `powersgd_hook`). Every rank applies the same reduced
gradient, so the replicas stay identical; the trainer checks that at the end of a run.

`build` returns the `(hook, state)` pair DDP's `register_comm_hook(state, hook)` takes;
`register` installs it. PowerSGD's state is per rank and goes into every checkpoint
(`save_state` / `load_state`, one file per rank).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

if TYPE_CHECKING:
    from omegaconf import DictConfig

log = logging.getLogger("launcher")

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future]


def bf16_compress(process_group, bucket):
    """PyTorch's bf16 compression hook under another name.

    DDP refuses the stock hook *by its function name* unless CUDA and NCCL >= 2.10 are
    present, although the hook itself runs on gloo too; delegating from a function with
    another name lets CPU jobs (and the tests) use bf16 compression.
    """
    return default_hooks.bf16_compress_hook(process_group, bucket)


# -- PowerSGD ------------------------------------------------------------------------------


class PowerSGDState:
    """PowerSGD's settings and its per-rank memory, kept *per parameter*.

    PyTorch's `PowerSGDState` keys its memory by bucket index. DDP builds one bucket for
    the first step after it is constructed and rebuilds them afterwards, so a resumed job
    (a new DDP) would meet memory that belongs to other buckets. Keyed by parameter name,
    the memory is independent of the bucket layout (`strategy.bucket_cap_mb` and DDP's
    rebuild alike), and PowerSGD may start at any step.

    - `errors[name]`: error feedback, what compression left out of this rank's gradient
      last time (added back before the next compression). Differs between ranks.
    - `qs[name]`: the Q factor of the last step (warm start). Identical on every rank.
    - `step`: optimizer steps whose gradients went through the hook (no_sync micro-steps
      do not count); plain all-reduce while it is below `start_step`.
    """

    def __init__(
        self,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
        *,
        matrix_rank: int,
        start_step: int,
        min_compression_rate: float,
        seed: int = 0,
        process_group: dist.ProcessGroup | None = None,
        epsilon: float = 1e-8,
    ):
        self.process_group = process_group
        self.matrix_rank = matrix_rank
        self.start_step = start_step
        self.min_compression_rate = min_compression_rate
        self.seed = seed
        self.epsilon = epsilon  # keeps an all-zero column from turning into NaN
        # torch.compile wraps the model: its parameter names gain an `_orig_mod.` prefix.
        self.names = {id(p): n.replace("_orig_mod.", "") for n, p in named_parameters}
        self.step = 0
        self.errors: dict[str, torch.Tensor] = {}
        self.qs: dict[str, torch.Tensor] = {}

    def compressed_rank(self, grad: torch.Tensor) -> int:
        """The approximation rank for this gradient, or 0 to all-reduce it as it is.

        A matrix (n x m, higher dimensions folded into m) is compressed when its factors
        P (n x r) and Q (m x r) are at least `min_compression_rate` times smaller than it;
        vectors (biases, LayerNorm gains) never are.
        """
        if grad.dim() < 2:
            return 0
        n, m = grad.shape[0], grad.numel() // grad.shape[0]
        r = min(n, m, self.matrix_rank)
        return r if (n + m) * r * self.min_compression_rate < n * m else 0

    def initial_q(self, name: str, m: int, r: int, like: torch.Tensor) -> torch.Tensor:
        """A random Q, the same on every rank, drawn without touching the global RNG."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
        return torch.randn(m, r, generator=gen).to(device=like.device, dtype=like.dtype)

    def state_dict(self) -> dict:
        return {
            "version": 1,
            "step": self.step,
            "matrix_rank": self.matrix_rank,
            "errors": dict(self.errors),
            "qs": dict(self.qs),
        }

    def load_state_dict(self, state: dict, *, with_errors: bool = True) -> None:
        """Restore a saved state. Entries whose shape no longer fits (another
        `powersgd_rank`) are dropped by the hook and start afresh."""
        self.step = int(state["step"])
        self.qs = dict(state["qs"])
        self.errors = dict(state["errors"]) if with_errors else {}


def _orthonormalize(columns: torch.Tensor, epsilon: float) -> None:
    """Gram-Schmidt on the columns of an n x r matrix, in place."""
    for i in range(columns.shape[1]):
        col = columns[:, i : i + 1]
        col.div_(col.norm() + epsilon)
        if i + 1 < columns.shape[1]:
            rest = columns[:, i + 1 :]
            rest.sub_((col * rest).sum(dim=0, keepdim=True) * col)


def _allreduce_mean(group: dist.ProcessGroup, tensor: torch.Tensor) -> torch.futures.Future:
    tensor.div_(group.size())
    return (
        dist.all_reduce(tensor, group=group, async_op=True)
        .get_future()
        .then(lambda fut: fut.value()[0])
    )


def powersgd_hook(state, bucket):
    """PowerSGD (Vogels et al., 2019) with error feedback and warm start, for one bucket.

    Each compressible gradient matrix M (plus last step's error) is approximated as P Q^T
    with one step of power iteration: P = M Q (all-reduced, orthonormalised), Q = M^T P
    (all-reduced, averaged), M ~ P Q^T. Vectors and small matrices are all-reduced as they
    are, in the same message as the Ps. The error M - P Q^T is kept for the next step.

    Unlike PyTorch's `powerSGD_hook`, every collective is issued from the thread that calls
    the hook, in bucket order, so the ranks issue them in the same order; the callback of
    the last all-reduce only computes. PyTorch's hook issues the P and Q all-reduces from
    future callbacks and waits for them there: on gloo those callbacks run on the process
    group's two worker threads, so with several buckets in flight the ranks enqueued
    collectives in different orders and both workers ended up blocked waiting for
    all-reduces that only a worker could run (a hang; docs/communication.md).

    (No annotations: DDP rejects a hook whose annotations are not the real GradBucket
    and Future[Tensor] objects, and `from __future__ import annotations` makes them strings.)
    """
    group = state.process_group or dist.group.WORLD
    buffer = bucket.buffer()
    if bucket.is_last():  # DDP hands buckets over in index order; the last ends the step
        current, state.step = state.step, state.step + 1
    else:
        current = state.step
    if current < state.start_step:
        return _allreduce_mean(group, buffer)

    world = group.size()
    plain: list[torch.Tensor] = []
    # (name, M as n x m, the M + error that was compressed, Q, P's offset in `first`)
    compressed: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, int]] = []
    for grad, param in zip(bucket.gradients(), bucket.parameters(), strict=True):
        r = state.compressed_rank(grad)
        if not r:
            plain.append(grad)
            continue
        name = state.names[id(param)]
        matrix = grad.view(grad.shape[0], -1)
        error = state.errors.get(name)
        if error is not None and error.shape == matrix.shape:
            matrix.add_(error)
        q = state.qs.get(name)
        if q is None or q.shape != (matrix.shape[1], r):
            q = state.initial_q(name, matrix.shape[1], r, matrix)
        else:
            q = q.clone()
        _orthonormalize(q, state.epsilon)
        compressed.append((name, matrix, matrix.clone(), q, 0))

    plain_numel = sum(g.numel() for g in plain)
    p_numel = sum(m.shape[0] * q.shape[1] for _, m, _, q, _ in compressed)
    first = torch.empty(plain_numel + p_numel, device=buffer.device, dtype=buffer.dtype)
    offset = 0
    for g in plain:
        first[offset : offset + g.numel()].copy_(g.view(-1))
        offset += g.numel()
    for i, (name, matrix, target, q, _) in enumerate(compressed):
        n, r = matrix.shape[0], q.shape[1]
        torch.matmul(target, q, out=first[offset : offset + n * r].view(n, r))
        compressed[i] = (name, matrix, target, q, offset)
        offset += n * r

    # Round 1: the plain tensors and every P in one message; the hook waits for it (on
    # NCCL, wait() only orders the streams), so that round 2 is issued from here too.
    dist.all_reduce(first, group=group, async_op=True).wait()
    offset = 0
    for g in plain:
        g.copy_(first[offset : offset + g.numel()].view_as(g)).div_(world)
        offset += g.numel()
    if not compressed:
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buffer)
        return fut

    ps = []
    second = torch.empty(
        sum(q.numel() for _, _, _, q, _ in compressed), device=buffer.device, dtype=buffer.dtype
    )
    q_offset = 0
    for _, matrix, target, q, p_offset in compressed:
        n, (m, r) = matrix.shape[0], q.shape
        p = first[p_offset : p_offset + n * r].view(n, r)
        _orthonormalize(p, state.epsilon)
        torch.matmul(target.t(), p, out=second[q_offset : q_offset + m * r].view(m, r))
        ps.append(p)
        q_offset += m * r

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        qs = fut.value()[0].div_(world)
        q_offset = 0
        for (name, matrix, target, q, _), p in zip(compressed, ps, strict=True):
            m, r = q.shape
            q_new = qs[q_offset : q_offset + m * r].view(m, r)
            torch.matmul(p, q_new.t(), out=matrix)
            state.errors[name] = target.sub_(matrix)
            state.qs[name] = q_new.clone()
            q_offset += m * r
        return buffer

    # Round 2: every Q. Its callback only computes, whichever thread runs it.
    return dist.all_reduce(second, group=group, async_op=True).get_future().then(decompress)


# -- choosing and installing a hook --------------------------------------------------------


def build(name: str, scfg: DictConfig, module: torch.nn.Module) -> tuple[Hook | None, Any]:
    """The `(hook, state)` pair for `strategy.comm_hook=name`; `(None, None)` for none.

    `module` is what DDP wraps (its parameters name PowerSGD's memory).
    """
    if name == "none":
        return None, None
    if name == "fp16":
        return default_hooks.fp16_compress_hook, dist.group.WORLD
    if name == "bf16":
        return bf16_compress, dist.group.WORLD
    if name == "powersgd":
        state = PowerSGDState(
            module.named_parameters(),
            matrix_rank=scfg.powersgd_rank,
            start_step=scfg.powersgd_warmup_steps,
            min_compression_rate=scfg.powersgd_min_compression_rate,
        )
        return powersgd_hook, state
    raise ValueError(f"strategy.comm_hook={name}: unknown hook")


def register(ddp, scfg: DictConfig) -> Any:
    """Register the hook named by `strategy.comm_hook` on `ddp` (none: DDP's own
    all-reduce); return its state (for `save_state` / `load_state`)."""
    hook, state = build(scfg.comm_hook, scfg, ddp.module)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    return state


def state_file(folder: Path, rank: int) -> Path:
    return folder / f"powersgd_rank{rank}.pt"


def save_state(state: Any, folder: Path, rank: int) -> None:
    """Write this rank's hook state into a checkpoint folder (PowerSGD only)."""
    if isinstance(state, PowerSGDState):
        torch.save(state.state_dict(), state_file(folder, rank))


def load_state(state: Any, folder: Path, rank: int, device: torch.device) -> None:
    """Restore this rank's hook state from a checkpoint folder (PowerSGD only).

    Without this rank's file (the world size grew), rank 0's step and Q factors, which
    every rank shares, are used with no error feedback; without any file (the checkpoint
    was written with another hook), PowerSGD counts its steps from the checkpoint's.
    """
    if not isinstance(state, PowerSGDState):
        return
    mine, first = state_file(folder, rank), state_file(folder, 0)
    if mine.exists():
        state.load_state_dict(torch.load(mine, map_location=device, weights_only=True))
        return
    if first.exists():
        log.warning("%s has no PowerSGD state for rank %d: error feedback restarts", folder, rank)
        saved = torch.load(first, map_location=device, weights_only=True)
        state.load_state_dict(saved, with_errors=False)
        return
    from launcher.checkpoint import step_of

    log.warning("%s has no PowerSGD state: PowerSGD starts afresh", folder)
    state.step = step_of(folder)
    state.errors, state.qs = {}, {}
