"""What the plan assumes where nothing was measured: the devices' memory and the MFU a
well-tuned GPT-2 step reaches on them, and the interconnects' bus bandwidth and latency.

Every figure here is stated, not measured, and a plan marks each one it uses as assumed,
with where it comes from (docs/plan.md). `--from RUN_DIR` replaces the compute rate (and the
overlap, the links, the checkpoint write speed) with what runs on the target hardware
measured; the command's flags replace the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.observe.peaks import PEAK_BF16_FLOPS, peak_for_name


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # dense bf16, launcher.observe.peaks
    memory_bytes: int  # what the framework can use of it
    mfu: float  # a tuned GPT-2 step's model FLOPs utilisation (assumed)
    source: str  # where the MFU comes from


GB = 10**9
# MFU: each source's figure by the plan's own FLOP formula (nanoGPT's 6N + 12·L·d·s, gpt2
# 124M with its vocabulary padded to 50,304, 855.4 MFLOP a token at sequence 1024).
DEVICES = {
    "H200": Device("H200", peak_for_name("H200"), 141 * GB, 0.457,
                   "the project's H200 run: gpt2 124M, micro-batch 64, 528.7K tokens/s: 45.7% "
                   "MFU"),
    "H100": Device("H100", peak_for_name("H100"), 80 * GB, 0.405,
                   "llm.c GPT-2 124M on 8xH100: 140 ms a 524,288-token step: 40.5% MFU"),
    "A100": Device("A100", peak_for_name("A100"), 80 * GB, 0.599,
                   "llm.c GPT-2 124M on 8xA100: 300 ms a 524,288-token step: 59.9% MFU"),
}  # fmt: skip
DEFAULT_DEVICE = "H100"
KNOWN_PEAKS = tuple(name for name, _ in PEAK_BF16_FLOPS)


@dataclass(frozen=True)
class Link:
    """An interconnect as an alpha-beta model: a collective of B bytes over n ranks takes
    its steps' latencies + traffic(B, n) / bus bandwidth (docs/plan.md)."""

    name: str
    busbw: float  # bytes/s: nccl-tests' bus bandwidth, per rank
    alpha: float  # seconds a step of a ring or tree costs besides its bytes
    source: str


LINKS = {
    "nvlink": Link("nvlink", 370 * GB, 5e-6,
                   "nccl-tests, 8xH100 NVLink all-reduce ring: about 370 GB/s bus bandwidth"),
    "infiniband": Link("infiniband", 46 * GB, 10e-6,
                       "NDR 400 Gb/s, one NIC per GPU: 46-48 GB/s bus bandwidth (nccl-tests)"),
    "ethernet": Link("ethernet", 10 * GB, 50e-6,
                     "100 GbE shared by a node's GPUs: about 10 GB/s bus bandwidth"),
    "gloo": Link("gloo", 1.5 * GB, 50e-6,
                 "gloo on CPU, 2 processes: 1-2.4 GB/s (public reports)"),
}  # fmt: skip


@dataclass(frozen=True)
class Topology:
    """The ranks a collective runs over: `nodes` x `per_node`, the link between the ranks
    of a node (`intra`) and between nodes (`inter`, None on one node); `by_op` the links a
    calibration fitted for one kind of collective, in place of these."""

    nodes: int
    per_node: int
    intra: Link
    inter: Link | None = None
    by_op: dict[str, Link] = field(default_factory=dict)

    @property
    def ranks(self) -> int:
        return self.nodes * self.per_node

    def links(self, op: str) -> tuple[Link, Link]:
        """(the intra-node, the inter-node link) for collective `op`."""
        intra = self.by_op.get(op, self.intra)
        return intra, (self.inter if self.nodes > 1 and self.inter else intra)

    def describe(self) -> str:
        if self.nodes == 1 or self.inter is None:
            return self.intra.name
        return f"{self.intra.name} within a node, {self.inter.name} between nodes"


def topology_for(nccl_preset: str, nodes: int, per_node: int, on_gpu: bool) -> Topology:
    """The links a job's collectives cross: gloo on the CPU; NVLink within a GPU node, and
    between nodes the `nccl` group's network (InfiniBand unless it names Ethernet)."""
    if not on_gpu:
        return Topology(nodes, per_node, LINKS["gloo"], LINKS["gloo"])
    inter = LINKS["ethernet"] if nccl_preset == "ethernet" else LINKS["infiniband"]
    return Topology(nodes, per_node, LINKS["nvlink"], inter)
