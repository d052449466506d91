"""`torchrun ... -m launcher.commbench`: all-reduce bandwidth on the job's own process group.

Before tuning `strategy.bucket_cap_mb` or a compression hook, know what the network gives:
this times all-reduces over a range of message sizes (and dtypes) on exactly the ranks,
backend and NCCL settings a training launch would use, and prints them as nccl-tests does:

    algbw = bytes / time          busbw = algbw x 2(n-1)/n

busbw is comparable across world sizes (it is what each link carries in a ring all-reduce);
small messages show latency, large ones bandwidth. The time of a size is the slowest rank's
mean over the timed iterations, after warm-up iterations.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.flags import FlagParser, whole
from launcher.paths import can_create_in
from launcher.runtime.allreduce import bus_bandwidth, time_allreduce
from launcher.runtime.placement import env_world
from launcher.runtime.process import init_process_group, pick_backend, pick_device

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """'64K' -> 65536; plain numbers are bytes. At least 1 byte (a flag's `type=`: its
    refusal names the flag and the value)."""
    upper = text.strip().upper().removesuffix("B")
    unit = upper[-1] if upper and upper[-1] in UNITS else ""
    try:
        size = float(upper[: len(upper) - len(unit)]) * UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write e.g. 1K, 16M") from None
    if not math.isfinite(size) or size < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1 byte")
    return int(size)


def dtype_list(text: str) -> list[str]:
    """'fp32,bf16' -> ['fp32', 'bf16'], each one of DTYPES."""
    names = [n.strip() for n in text.split(",")]
    unknown = [n for n in names if n not in DTYPES]
    if unknown:
        raise argparse.ArgumentTypeError(f"{unknown[0]!r} is not one of {', '.join(DTYPES)}")
    return names


def message_sizes(low: int, high: int, factor: int) -> list[int]:
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= factor
    return sizes


def run(args: argparse.Namespace) -> list[dict]:
    rank, local_rank, world = env_world()
    device = pick_device("auto", local_rank)
    init_process_group(pick_backend("auto", device), dt.timedelta(minutes=10), device)
    rows = []
    for name in args.dtypes:
        dtype = DTYPES[name]
        elem = torch.tensor([], dtype=dtype).element_size()
        for size in message_sizes(args.min_bytes, args.max_bytes, args.factor):
            tensor = torch.ones(max(size // elem, 1), dtype=dtype, device=device)
            mine = time_allreduce(tensor, args.warmup, args.iters)
            slowest = torch.tensor([mine], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            seconds = slowest.item()
            nbytes = tensor.numel() * elem
            algbw = nbytes / seconds / 1e9
            rows.append(
                {
                    "bytes": nbytes,
                    "count": tensor.numel(),
                    "dtype": name,
                    "time_us": seconds * 1e6,
                    "algbw_gbps": algbw,
                    "busbw_gbps": bus_bandwidth(algbw, world),
                }
            )
    dist.destroy_process_group()
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        f"{'size (B)':>12} {'count':>12} {'type':>5} {'time (us)':>11} {'algbw (GB/s)':>13} "
        f"{'busbw (GB/s)':>13}"
    ]
    for r in rows:
        lines.append(
            f"{r['bytes']:>12} {r['count']:>12} {r['dtype']:>5} {r['time_us']:>11.1f} "
            f"{r['algbw_gbps']:>13.3f} {r['busbw_gbps']:>13.3f}"
        )
    return "\n".join(lines)


def parser() -> FlagParser:
    p = FlagParser(prog="torchrun ... -m launcher.commbench", description=__doc__.splitlines()[0])
    gpu = torch.cuda.is_available()
    p.add_argument("--min-bytes", type=parse_size, default="1K")
    p.add_argument("--max-bytes", type=parse_size, default="256M" if gpu else "16M")
    p.add_argument("--factor", type=whole(2), default=4, help="size step between messages")
    p.add_argument("--dtypes", type=dtype_list, default="fp32,bf16",
                   help=f"comma list of {', '.join(DTYPES)}")  # fmt: skip
    p.add_argument("--warmup", type=whole(0), default=5)
    p.add_argument("--iters", type=whole(1), default=20)
    p.add_argument("--out", type=Path, default=Path("commbench.json"),
                   help="JSON written by rank 0")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    problem = None
    if args.min_bytes > args.max_bytes:
        problem = f"--min-bytes ({args.min_bytes} B) is more than --max-bytes ({args.max_bytes} B)"
    elif args.out.is_dir() or not args.out.parent.is_dir() or not can_create_in(args.out.parent):
        problem = f"--out {args.out}: not a file that can be written in an existing folder"
    elif "MASTER_ADDR" not in os.environ:
        problem = (
            "run it under torchrun, e.g. torchrun --standalone --nproc_per_node=8 "
            "-m launcher.commbench"
        )
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    rank, _, world = env_world()
    rows = run(args)
    if rank == 0:
        print(f"all-reduce over {world} ranks\n{table(rows)}")
        args.out.write_text(json.dumps({"world_size": world, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
