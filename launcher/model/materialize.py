"""A model built on the meta device and materialised on its own device, with the values a
CPU build gives for the same seed, without a full copy of it in host memory.

Why: every rank of a node builds its model at the same moment. Built on the CPU and then
moved, each rank holds a whole fp32 copy in host memory first (gpt2-xl: 6.2 GB a rank,
eight at once on an 8-GPU node). Built on `meta`, construction allocates nothing; what
the constructors write into the tensors (the random and constant fills of
`torch.nn.init`, transformers' `_init_weights`, factories such as `torch.zeros`) is
recorded in order, the parameters are allocated where they will live (`to_empty`), and
the record is replayed onto them.

The random fills are drawn from the CPU's generator, in the build's order, so the values
are bit for bit those of a build on the CPU: a CPU and a GPU run, and every world size,
start from the same weights. On another device each fill is drawn into a CPU tensor of
that one parameter's shape and copied over: the host holds one parameter at a time. A
fill of a tensor the model dropped (nn.Linear's own weight of GPT-2's LM head, replaced by
the tied embedding) is drawn and thrown away, so that every later draw stays where it was:
as the uniform numbers the CPU would draw for it, in slices (`uniform_draws`), so that not
even that tensor is ever whole in memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

RANDOM_FILLS = (aten.normal_.default, aten.uniform_.default)
CONSTANT_FILLS = (aten.zero_.default, aten.fill_.Scalar)
# Factories whose values the replay makes again: (fill, its arguments from the factory's).
FACTORY_FILLS = {
    aten.zeros: (aten.zero_.default, lambda args: ()),
    aten.ones: (aten.fill_.Scalar, lambda args: (1,)),
    aten.full: (aten.fill_.Scalar, lambda args: (args[1],)),
}
UNINITIALISED = (aten.empty, aten.empty_strided)  # what the constructors then fill
SKIP_SLICE = 1 << 16  # elements drawn at once for a dropped tensor's uniform fill (256 KiB)


class NotReplayable(RuntimeError):
    """The construction did something the replay cannot make again on another device."""


def storage_key(tensor: torch.Tensor) -> int:
    """What names a tensor's storage, the same for every view of it (tied weights)."""
    return tensor.untyped_storage()._cdata


class InitRecord(TorchDispatchMode):
    """Every write into a meta tensor, in order: (fill, the meta tensor or view written,
    its arguments). The meta tensors are kept, so no storage of the build is freed and its
    name reused while the record lives."""

    def __init__(self):
        super().__init__()
        self.fills: list[tuple[torch._ops.OpOverload, torch.Tensor, tuple, dict]] = []
        self.made: set[int] = set()  # storages a recognised factory made

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: torch would wrap __torch_dispatch__ in dynamo's `disable`, whose first call
        imports torch._dynamo (sympy and all: seconds of every rank's start-up, 0.08 GB of
        its memory); a build is never compiled."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in RANDOM_FILLS + CONSTANT_FILLS and args[0].is_meta:
            self.fills.append((func, args[0], tuple(args[1:]), dict(kwargs)))
            # Not run: a meta tensor holds no values, and a random fill's meta kernel is
            # Python's, whose first use imports sympy (seconds of every rank's start-up).
            return args[0]
        if torch.Tag.nondeterministic_seeded in func.tags:
            # a draw the replay would not take, which moves every later one
            raise NotReplayable(f"{func} draws random numbers the replay cannot repeat")
        packet = func.overloadpacket
        if packet in UNINITIALISED or packet in FACTORY_FILLS:
            kwargs = {**kwargs, "device": torch.device("meta")}
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.is_meta and packet in FACTORY_FILLS:
            fill, fill_args = FACTORY_FILLS[packet]
            self.fills.append((fill, out, fill_args(args), {}))
            self.made.add(storage_key(out))
        elif isinstance(out, torch.Tensor) and out.is_meta and packet in UNINITIALISED:
            self.made.add(storage_key(out))
        elif func._schema.is_mutable and any(
            isinstance(a, torch.Tensor) and a.is_meta for a in args
        ):
            raise NotReplayable(f"{func} writes into the model in a way the replay cannot repeat")
        return out


def on_meta(build: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, InitRecord]:
    """`build()` with every tensor it makes on the meta device, and the record of its fills
    (not run on `meta`: see InitRecord)."""
    record = InitRecord()
    with record:
        model = build()
    return model, record


def materialise(build: Callable[[], torch.nn.Module], device: torch.device) -> torch.nn.Module:
    """`build()` run on the meta device, its parameters allocated on `device` and given the
    values a CPU build would have (see the module's docstring)."""
    model, record = on_meta(build)
    if any(True for _ in model.buffers()):
        raise NotReplayable(f"{type(model).__name__} has buffers, which the replay does not make")
    unmade = [n for n, p in model.named_parameters() if storage_key(p) not in record.made]
    if unmade:
        raise NotReplayable(f"{unmade[0]} was made by a factory the replay does not repeat")
    owners = _allocate(model, device)
    scratch = Scratch()
    with torch.no_grad():
        for func, meta, args, kwargs in record.fills:
            owner = owners.get(storage_key(meta))
            if owner is None:
                _draw_and_drop(func, meta, args, kwargs, scratch)
                continue
            target = owner.detach().as_strided(meta.size(), meta.stride(), meta.storage_offset())
            _fill(func, target, args, kwargs, scratch)
    return model


class Scratch:
    """The CPU memory a random fill is drawn into when it is not drawn in place: one buffer,
    grown to the largest fill, so that the host holds one parameter's worth at most and the
    allocator keeps no trail of freed temporaries."""

    def __init__(self):
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def like(self, size: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A contiguous CPU tensor of `size` and `dtype` in the buffer (its old contents)."""
        need = size.numel() * dtype.itemsize
        if self.buffer.numel() < need:
            self.buffer = torch.empty(0, dtype=torch.uint8)  # the old one freed first
            self.buffer = torch.empty(need, dtype=torch.uint8)
        return self.buffer[:need].view(dtype).view(size)


def _allocate(model: torch.nn.Module, device: torch.device) -> dict[int, torch.nn.Parameter]:
    """Every parameter of `model` replaced by an uninitialised one on `device`, a tied one
    by one shared parameter (Module.to_empty makes two of it when leaving `meta`); the new
    parameters by the storage name of the meta ones they replace."""
    new: dict[int, torch.nn.Parameter] = {}
    owners: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, meta in module._parameters.items():
            if meta is None:
                continue
            if id(meta) not in new:
                # (empty_like from `meta` goes through torch._refs, which imports sympy)
                made = torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype,
                                           device=device)  # fmt: skip
                new[id(meta)] = torch.nn.Parameter(made, requires_grad=meta.requires_grad)
                owners[storage_key(meta)] = new[id(meta)]
            module._parameters[name] = new[id(meta)]
    return owners


def _drawn(target: torch.Tensor, scratch: Scratch) -> torch.Tensor:
    """A CPU tensor laid out as `target`, for the CPU to draw its values into in the order a
    CPU build drew them (GPT-2's fills are of whole, contiguous tensors: the scratch)."""
    if target.is_contiguous():
        return scratch.like(target.size(), target.dtype)
    return torch.empty_strided(target.size(), target.stride(), dtype=target.dtype)


def _fill(func, target: torch.Tensor, args: tuple, kwargs: dict, scratch: Scratch) -> None:
    """One recorded fill written into `target`; a random one drawn on the CPU."""
    if func not in RANDOM_FILLS or target.device.type == "cpu":
        func(target, *args, **kwargs)
        return
    drawn = _drawn(target, scratch)
    func(drawn, *args, **kwargs)
    target.copy_(drawn)


def _draw_and_drop(func, meta: torch.Tensor, args: tuple, kwargs: dict, scratch: Scratch) -> None:
    """The draws a fill of a dropped tensor took, taken and thrown away (constant fills
    draw nothing); in slices where the CPU's draws allow (`uniform_draws`)."""
    if func not in RANDOM_FILLS:
        return
    count = uniform_draws(func, meta)
    if count is None:  # drawn whole, as the build drew it
        func(_drawn(meta, scratch), *args, **kwargs)
        return
    while count:
        n = min(count, SKIP_SLICE)
        aten.uniform_.default(scratch.like(torch.Size([n]), meta.dtype))
        count -= n


def uniform_draws(func, meta: torch.Tensor) -> int | None:
    """How many uniform numbers of its dtype the CPU draws for `func` filling `meta`, one
    after the other, so that the same count drawn in slices leaves the generator where the
    fill would; None where that is not so. uniform_: one an element. normal_ of a
    contiguous tensor of 16 or more elements: one an element, and 16 more for the last 16
    when the count is not a multiple of 16 (ATen's normal_fill: the uniforms first, then
    Box-Muller in blocks of 16); a smaller or strided one draws normals one by one."""
    n = meta.numel()
    if func is aten.uniform_.default:
        return n
    if meta.is_contiguous() and n >= 16 and meta.dtype.is_floating_point:
        return n + (16 if n % 16 else 0)
    return None
