"""Per-step communication figures of an engine that issues its own collectives (DeepSpeed,
FSDP2), timed at their entry points.

Every collective DeepSpeed issues (ZeRO's gradient reduce-scatters and all-reduces, ZeRO-3's
parameter all-gathers, the all-gather of updated partitions after the step, the gradient
norm's all-reduce) goes through one object, `deepspeed.comm.comm.cdb`, the torch backend
wrapper. `CollectiveTimer.install` wraps that object's collective methods, so that every
call gets:

- *issue*, when the call is made, and *done*, when the result is in place: for a blocking
  call the moment it returns; for an asynchronous one (`async_op=True`), a completion
  callback on the work's future;
- *blocked* intervals: the time the training thread (on a GPU: its stream) waited for
  communication: the whole of a blocking call, and each `wait()` on an asynchronous one.

On a GPU every timestamp is a CUDA event recorded in stream order (pooled; read only when
the figures are drained at a log step), so timing adds no host-device synchronisation; on
a CPU they are wall-clock readings. From one step's collectives:

- ``allreduce_s`` is the length of the union of the ``[issue, done]`` intervals: the time
  during which some collective was in flight (whatever its kind);
- ``exposed_s`` is the length of the union of the blocked intervals, within that: the
  communication the step waited for, not hidden behind compute. (DDP's definition,
  ``max(done) - max(ready)``, is the special case where the only wait is the one at the
  end of backward; ZeRO also waits in forward, for ZeRO-3's all-gathers, and in the step.)
- ``bytes`` is counted as *all-reduce-equivalent* bytes, so that the one bus-bandwidth
  formula (``bytes / time x 2(n-1)/n``) gives nccl-tests' bus bandwidth for each kind: an
  all-reduce of S bytes counts S; a reduce-scatter or all-gather of a full tensor of S
  bytes moves half as much per rank and counts S/2; a broadcast or reduce counts
  S x n / (2(n-1));
- the same three figures per kind of collective (`StepComm.per_kind`): FSDP2's all-gathers
  and reduce-scatters apart (docs/communication.md);

Only collectives issued between the first micro-step of a training step and the end of its
optimizer step count; those of evaluation, checkpointing and start-up are left out.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from launcher.observe.clock import EventClock
from launcher.observe.comm_stats import StepComm
from launcher.observe.intervals import merged, overlap_length, union_length

# Methods of DeepSpeed's TorchBackend that communicate: the kind each is counted as, and
# its parameters in order (they mirror torch.distributed's; DeepSpeed's wrappers hide the
# signatures from `inspect`).
KINDS = {
    "all_reduce": ("all_reduce", ("tensor", "op", "group", "async_op")),
    "all_reduce_coalesced": ("all_reduce", ("tensors", "op", "group", "async_op")),
    "inference_all_reduce": ("all_reduce", ("tensor", "op", "group")),
    "reduce_scatter": ("reduce_scatter", ("output", "input_list", "op", "group", "async_op")),
    "reduce_scatter_tensor": (
        "reduce_scatter",
        ("output_tensor", "input_tensor", "op", "group", "async_op"),
    ),
    "all_gather": ("all_gather", ("tensor_list", "tensor", "group", "async_op")),
    "all_gather_into_tensor": (
        "all_gather",
        ("output_tensor", "input_tensor", "group", "async_op"),
    ),
    "all_gather_base": ("all_gather", ("output_tensor", "input_tensor", "group", "async_op")),
    "all_gather_coalesced": (
        "all_gather",
        ("output_tensors", "input_tensors", "group", "async_op"),
    ),
    "broadcast": ("broadcast", ("tensor", "src", "group", "async_op")),
    "reduce": ("reduce", ("tensor", "dst", "op", "group", "async_op")),
    "all_to_all_single": (
        "all_to_all",
        ("output", "input", "output_split_sizes", "input_split_sizes", "group", "async_op"),
    ),
    "all_to_all": ("all_to_all", ("output_tensor_list", "input_tensor_list", "group", "async_op")),
}


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    return 0


def equivalent_bytes(kind: str, size: int, world: int) -> float:
    """Bytes counted for a collective over a full tensor of `size` bytes (see module doc)."""
    if kind == "all_reduce":
        return float(size)
    if kind in ("broadcast", "reduce"):
        return size * world / (2 * (world - 1)) if world > 1 else float(size)
    return size / 2  # reduce-scatter, all-gather, all-to-all


# The argument holding the full (unsharded) data of each call.
FULL_ARGUMENT = {
    "all_gather_into_tensor": "output_tensor",
    "all_gather_base": "output_tensor",
    "all_gather": "tensor_list",
    "all_gather_coalesced": "output_tensors",
    "reduce_scatter_tensor": "input_tensor",
    "reduce_scatter": "input_list",
    "all_to_all_single": "input",
    "all_to_all": "input_tensor_list",
    "all_reduce_coalesced": "tensors",
}


@dataclass
class _Op:
    kind: str
    issue: object
    done: object = None
    nbytes: float = 0.0


@dataclass
class _Step:
    ops: list[_Op] = field(default_factory=list)
    blocked: list[list] = field(default_factory=list)  # [start, end]


class _TimedWork:
    """An asynchronous collective's work handle whose `wait()` is timed as blocked time."""

    def __init__(self, work, timer: CollectiveTimer, op: _Op):
        self._work, self._timer, self._op = work, timer, op

    def wait(self, *args, **kwargs):
        start = self._timer.now()
        result = self._work.wait(*args, **kwargs)
        end = self._timer.now()
        if self._op.done is None:  # no future to call back: done when waited for
            self._op.done = end
        self._timer.block(start, end)
        return result

    def __getattr__(self, name):
        return getattr(self._work, name)


class CollectiveTimer:
    """Times DeepSpeed's collectives per training step; `drain()` gives StepComm figures."""

    def __init__(self, device: torch.device, world_size: int):
        self.clock = EventClock(device)
        self.world = world_size
        self.active = False  # True from a step's first micro-step to the end of its step
        self._current = _Step()
        self._steps: list[_Step] = []
        self._installed: list[tuple[object, str]] = []
        # Per kind, over every timed step: calls, counted bytes, in-flight seconds.
        self.totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        self.timed_steps = 0

    # -- timestamps ------------------------------------------------------------------
    def now(self):
        return self.clock.now()

    def block(self, start, end) -> None:
        if self.active:
            self._current.blocked.append([start, end])

    # -- wrapping the backend ----------------------------------------------------------
    def install(self, backend) -> None:
        """Wrap `backend`'s collective methods (DeepSpeed's `cdb`) on the instance."""
        for method, (kind, params) in KINDS.items():
            original = getattr(backend, method, None)
            if original is None or method in backend.__dict__:
                continue
            setattr(backend, method, self.wrap(method, kind, params, original))
            self._installed.append((backend, method))

    def uninstall(self) -> None:
        for backend, method in self._installed:
            backend.__dict__.pop(method, None)
        self._installed.clear()

    def wrap(self, method: str, kind: str, params: tuple[str, ...], original):
        """`original` (a collective `method` of `kind`, taking `params` positionally)
        timed: DeepSpeed's backend methods by `install`, FSDP2's all-gather and
        reduce-scatter by the engine itself."""
        full = FULL_ARGUMENT.get(method, "tensor")

        def timed(*args, **kwargs):
            if not self.active:
                return original(*args, **kwargs)
            bound = {**dict(zip(params, args, strict=False)), **kwargs}
            size = _nbytes(bound.get(full))
            op = _Op(kind, self.now(), nbytes=equivalent_bytes(kind, size, self.world))
            work = original(*args, **kwargs)
            self._current.ops.append(op)
            is_async = bool(bound.get("async_op", False))
            if work is None or not is_async or not hasattr(work, "wait"):
                op.done = self.now()  # a blocking call: returned once complete (or, on a
                self.block(op.issue, op.done)  # GPU, once the stream waits for it)
                return work
            # Without a future for this work, `done` is taken when it is waited for.
            with contextlib.suppress(Exception):
                work.get_future().then(lambda _fut: setattr(op, "done", self.now()))
            return _TimedWork(work, self, op)

        timed.__wrapped__ = original
        return timed

    # -- steps -------------------------------------------------------------------------
    def begin_step(self) -> None:
        """A training step starts: forget what start-up, eval or a checkpoint issued."""
        if not self.active:
            self._recycle(self._current)
            self._current = _Step()
            self.active = True

    def end_step(self) -> None:
        self._steps.append(self._current)
        self._current = _Step()
        self.active = False

    def drain(self) -> list[StepComm]:
        """Figures of every step since the last drain (on GPU: waits for the last event)."""
        steps, self._steps = self._steps, []
        out = []
        for step in steps:
            ops, blocked = self._resolve(step)
            out.append(self._figures(ops, blocked))
            self._recycle(step)
        return out

    def _figures(self, ops: list[tuple[str, float, float, float]], blocked) -> StepComm:
        self.timed_steps += 1
        for kind, issue, done, nbytes in ops:
            total = self.totals[kind]
            total[0] += 1
            total[1] += nbytes
            total[2] += done - issue
        waits = merged(blocked)

        def figures(of_ops) -> tuple[float, float, float]:
            spans = [(issue, done) for _, issue, done, _ in of_ops]
            busy = union_length(spans)
            exposed = overlap_length(waits, spans) if spans else 0.0
            return busy, min(exposed, busy), float(sum(n for *_, n in of_ops))

        busy, exposed, nbytes = figures(ops)
        per_kind = {kind: figures([o for o in ops if o[0] == kind]) for kind in {o[0] for o in ops}}
        return StepComm(busy, exposed, int(nbytes), per_kind)

    def _resolve(self, step: _Step):
        """The step's completed collectives and blocked intervals, on one axis in seconds."""
        ops = [op for op in step.ops if op.done is not None]
        stamps = [e for op in ops for e in (op.issue, op.done)]
        stamps += [e for pair in step.blocked for e in pair]
        times = iter(self.clock.seconds(stamps))
        resolved = [(o.kind, next(times), next(times), o.nbytes) for o in ops]
        return resolved, [(next(times), next(times)) for _ in step.blocked]

    def _recycle(self, step: _Step) -> None:
        # A blocking call's two events are also its blocked interval: released once.
        events = [e for op in step.ops for e in (op.issue, op.done)]
        self.clock.release(events + [e for pair in step.blocked for e in pair])

    def write_summary(self, run_dir, rank: int) -> None:
        """comm_collectives.json in the run directory: `per_kind` of this rank's steps."""
        if not self.timed_steps:
            return
        figures = {"timed_steps": self.timed_steps, "rank": rank, "per_kind": self.per_kind()}
        (Path(run_dir) / "comm_collectives.json").write_text(json.dumps(figures, indent=1))

    def per_kind(self) -> dict[str, dict[str, float]]:
        """Per step, per kind of collective: calls, counted bytes, and the sum of the calls'
        in-flight seconds (calls in flight together each count: it can exceed a step)."""
        n = max(self.timed_steps, 1)
        return {
            kind: {"calls_per_step": c / n, "bytes_per_step": b / n, "inflight_s_per_step": s / n}
            for kind, (c, b, s) in sorted(self.totals.items())
        }
