"""PowerSGD gradient compression (`strategy.comm_hook=powersgd`): its per-rank state, the
hook, and the state's place in checkpoints (one file per rank).

Each compressible gradient matrix is sent as a rank-r approximation P Q^T (Vogels et al.,
2019) with error feedback and warm start; vectors and small matrices are all-reduced as
they are. The hook issues every collective from the thread that calls it, unlike PyTorch's
`powerSGD_hook`, which hangs on gloo with several buckets in flight (docs/communication.md).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.strategy.ddp.comm_timing import CommTimer

log = logging.getLogger("launcher")


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
        plain_hook,
        timer: CommTimer | None = None,
        seed: int = 0,
        epsilon: float = 1e-8,
    ):
        self.plain_hook = plain_hook  # the all-reduce hook used while warming up
        self.timer = timer
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


@dataclass
class _Matrix:
    """One compressed gradient of a bucket, through the two rounds."""

    name: str
    grad: torch.Tensor  # the gradient viewed as n x m: receives P Q^T
    target: torch.Tensor  # gradient + last error: what is approximated
    q: torch.Tensor  # m x r, orthonormalised (warm start: last step's Q)
    p: torch.Tensor | None = None  # n x r, a view into round 1's message


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
    buffer = bucket.buffer()
    if not _counts_step(state, bucket):
        return state.plain_hook(None, bucket)
    mark_done = state.timer.bucket_ready() if state.timer is not None else None
    world = dist.group.WORLD.size()
    plain, matrices = _split(state, bucket)

    # Round 1: the plain tensors and every P in one message; the hook waits for it (on
    # NCCL, wait() only orders the streams), so that round 2 is issued from here too.
    first = _pack_first(plain, matrices, buffer)
    dist.all_reduce(first, async_op=True).wait()
    _unpack_plain(first, plain, world)
    if not matrices:
        if mark_done is not None:
            mark_done(first.numel() * first.element_size())
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buffer)
        return fut

    second = _pack_second(matrices, state.epsilon, buffer)

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        _unpack_matrices(state, matrices, fut.value()[0].div_(world))
        if mark_done is not None:
            mark_done((first.numel() + second.numel()) * first.element_size())
        return buffer

    # Round 2: every Q. Its callback only computes, whichever thread runs it.
    return dist.all_reduce(second, async_op=True).get_future().then(decompress)


def _counts_step(state, bucket) -> bool:
    """Advance the step count at a step's last bucket (DDP hands buckets over in index
    order); whether this step is past PowerSGD's warm-up."""
    current = state.step
    if bucket.is_last():
        state.step += 1
    return current >= state.start_step


def _split(state, bucket) -> tuple[list[torch.Tensor], list[_Matrix]]:
    """The bucket's gradients sent as they are, and the matrices to compress, each with
    last step's error added and its Q (last step's, or a fresh one) orthonormalised."""
    plain: list[torch.Tensor] = []
    matrices: list[_Matrix] = []
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
        matrices.append(_Matrix(name, matrix, matrix.clone(), q))
    return plain, matrices


def _pack_first(plain: list[torch.Tensor], matrices: list[_Matrix], like: torch.Tensor):
    """Round 1's message: the plain gradients, then P = M Q of every matrix (each
    matrix's `p` becomes a view into it)."""
    sizes = [g.numel() for g in plain] + [m.grad.shape[0] * m.q.shape[1] for m in matrices]
    first = torch.empty(sum(sizes), device=like.device, dtype=like.dtype)
    parts = iter(first.split(sizes))
    for g in plain:
        next(parts).copy_(g.view(-1))
    for m in matrices:
        m.p = next(parts).view(m.grad.shape[0], m.q.shape[1])
        torch.matmul(m.target, m.q, out=m.p)
    return first


def _unpack_plain(first: torch.Tensor, plain: list[torch.Tensor], world: int) -> None:
    """The averaged plain gradients, back in place."""
    offset = 0
    for g in plain:
        g.copy_(first[offset : offset + g.numel()].view_as(g)).div_(world)
        offset += g.numel()


def _pack_second(matrices: list[_Matrix], epsilon: float, like: torch.Tensor):
    """Round 2's message: Q = M^T P of every matrix, P orthonormalised first."""
    sizes = [m.q.numel() for m in matrices]
    second = torch.empty(sum(sizes), device=like.device, dtype=like.dtype)
    for m, part in zip(matrices, second.split(sizes), strict=True):
        _orthonormalize(m.p, epsilon)
        torch.matmul(m.target.t(), m.p, out=part.view(m.q.shape))
    return second


def _unpack_matrices(state, matrices: list[_Matrix], qs: torch.Tensor) -> None:
    """Each gradient becomes P Q^T with the averaged Q; the error and Q are kept."""
    for m, q_new in zip(matrices, qs.split([m.q.numel() for m in matrices]), strict=True):
        q_new = q_new.view(m.q.shape)
        torch.matmul(m.p, q_new.t(), out=m.grad)
        state.errors[m.name] = m.target.sub_(m.grad)
        state.qs[m.name] = q_new.clone()


def state_file(folder: Path, rank: int) -> Path:
    return folder / f"powersgd_rank{rank}.pt"


def save_state(state: PowerSGDState | None, folder: Path, rank: int) -> None:
    """Write this rank's hook state into a checkpoint folder (PowerSGD only)."""
    if state is not None:
        torch.save(state.state_dict(), state_file(folder, rank))


def load_state(state: PowerSGDState | None, folder: Path, rank: int, device: torch.device) -> None:
    """Restore this rank's hook state from a checkpoint folder (PowerSGD only).

    Without this rank's file (the world size grew), rank 0's step and Q factors, which
    every rank shares, are used with no error feedback; without any file (the checkpoint
    was written with another hook), PowerSGD counts its steps from the checkpoint's.
    """
    if state is None:
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
    from launcher.checkpoint.protocol import step_of

    log.warning("%s has no PowerSGD state: PowerSGD starts afresh", folder)
    state.step = step_of(folder)
    state.errors, state.qs = {}, {}
