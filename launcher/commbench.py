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
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.runtime.allreduce import bus_bandwidth, time_allreduce
from launcher.runtime.process import env_world, init_process_group, pick_backend, pick_device

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """'64K' -> 65536; plain numbers are bytes."""
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * UNITS[unit])


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
    for name in args.dtypes.split(","):
        dtype = DTYPES[name]
        elem = torch.tensor([], dtype=dtype).element_size()
        for size in message_sizes(
            parse_size(args.min_bytes), parse_size(args.max_bytes), args.factor
        ):
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gpu = torch.cuda.is_available()
    parser.add_argument("--min-bytes", default="1K")
    parser.add_argument("--max-bytes", default="256M" if gpu else "16M")
    parser.add_argument("--factor", type=int, default=4, help="size step between messages")
    parser.add_argument("--dtypes", default="fp32,bf16", help=f"comma list of {', '.join(DTYPES)}")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default="commbench.json", help="JSON written by rank 0")
    args = parser.parse_args()
    unknown = set(args.dtypes.split(",")) - set(DTYPES)
    if unknown or args.factor < 2 or args.iters < 1:
        print(
            f"error: --dtypes takes {', '.join(DTYPES)}; --factor >= 2; --iters >= 1",
            file=sys.stderr,
        )
        return 2
    rank, _, world = env_world()
    if "MASTER_ADDR" not in os.environ:
        print(
            "error: run it under torchrun, e.g. torchrun --standalone --nproc_per_node=8 "
            "-m launcher.commbench",
            file=sys.stderr,
        )
        return 2
    rows = run(args)
    if rank == 0:
        print(f"all-reduce over {world} ranks\n{table(rows)}")
        Path(args.out).write_text(json.dumps({"world_size": world, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
