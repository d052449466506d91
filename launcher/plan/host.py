"""Host memory, predicted from the config: one rank's process at its peak, its DataLoader
workers' own pages, and a node of them with its /dev/shm. The Slurm and Kubernetes
renderers size --mem and the pod's memory with `node_processes` (launcher.submit.
node_memory); `launcher.plan` prints `host_per_node`.

What a rank holds on the host (docs/plan.md, "Host memory"):
- its process: Python, torch, the launcher, the process group, the data, the end-of-run
  report (RANK_BASE_BYTES, measured; an engine's own imports, its `Plan`'s `host_process_bytes`),
  and on a GPU the CUDA context and libraries' host side (CUDA_HOST_BYTES, assumed);
- while the model is built: one parameter at a time, drawn on the CPU and copied to the
  device (launcher.model.materialize; a checkpoint's tensors are read from the page cache,
  which a node's ranks share); on the CPU the model is built in place, in its own weights;
- while it trains: on the CPU the training state and activations; pinned batches (GPU);
  the state an engine keeps on the host (its `Plan`'s `host_state`: offload); a checkpoint's
  host copy while it is written (the memory tier's share; an asynchronous save's).
The build ends before training begins: a rank's peak is its process plus the larger of
the two.

A forked DataLoader worker shares its rank's pages copy-on-write: it is not another
process's worth. It costs the node the pages it writes itself (WORKER_OWN_BYTES), and the
rank's workers together keep the pages the rank had when it forked them and wrote again
afterwards (FORK_KEPT_BYTES of heap; on the CPU the weights too): `workers_bytes`.
"""

from __future__ import annotations

from launcher.checkpoint import memory as tier
from launcher.config.model_shape import param_count, param_sizes
from launcher.config.registry import engine
from launcher.data.shm import INT64_BYTES
from launcher.plan.memory import activation_bytes, micro_batch, shm_need, train_state

# Measured with benchmarks/host_memory.py on the 2-core CPU machine (Linux, torch 2.13,
# Python 3.11, from /proc): the peak resident size (VmHWM) of a gpt2-tiny rank under
# torchrun, 2 ranks, the default data and DataLoader (2 workers), DDP and FSDP2 (DeepSpeed
# adds its imports: its Plan's host_process_bytes): what a rank is when its model and training
# state are nothing. Its start-up, build and end-of-run report included.
RANK_BASE_BYTES = 400 * 10**6
# The same process's CUDA context, cuBLAS/cuDNN/NCCL host-side state and pinned staging
# (assumed: no GPU where the figures above were measured).
CUDA_HOST_BYTES = 2 * 10**9
# What a rank's forked DataLoader workers add (the same runs, 2 and 4 workers: the
# anonymous pages of the rank and its workers, Pss_Anon summed, less the rank's RssAnon):
# each worker's own pages, and once for all of them the rank's pages it rewrote after the
# fork, which the workers keep copy-on-write (the heap; on the CPU the weights as well,
# counted from the model: `workers_bytes`).
WORKER_OWN_BYTES = 5 * 10**6
FORK_KEPT_BYTES = 70 * 10**6


def basis(on_gpu: bool) -> str:
    """What the host figures rest on, for the plan's basis."""
    measured = (f"a rank's process {RANK_BASE_BYTES / 1e9:.2f} GB and its DataLoader workers' "
                "pages measured on a CPU (benchmarks/host_memory.py); the model, training "
                "state and copies from the config")  # fmt: skip
    if on_gpu:
        return f"{measured}; the CUDA context's host side {CUDA_HOST_BYTES / 1e9:.0f} GB assumed"
    return measured


def build_bytes(cfg, on_gpu: bool) -> int:
    """Host bytes the build holds beyond the process: on a GPU the largest parameter, drawn
    on the CPU before it is copied over (fp32); on the CPU nothing beyond the weights,
    which the training state counts."""
    return 4 * max(param_sizes(cfg.model)) if on_gpu else 0


def pinned_bytes(cfg, world_size: int, on_gpu: bool) -> int:
    """Pinned batches (tokens and targets, int64) a GPU rank holds: one per worker's
    prefetch, at least one (pin_memory is used on a GPU only)."""
    if not on_gpu or not cfg.data.pin_memory:
        return 0
    batch = 2 * micro_batch(cfg, world_size) * int(cfg.trainer.seq_len) * INT64_BYTES
    return batch * int(cfg.data.prefetch_factor) * max(int(cfg.data.num_workers), 1)


def checkpoint_copy_bytes(cfg, ranks_per_node: int, world_size: int,
                          restarts: int | None = None) -> int:  # fmt: skip
    """A checkpoint's host copy a rank holds while it is written: its part of the memory
    tier's (copied between two steps, written by a thread), or the engine's asynchronous
    save's (its shard, the largest a rank writes, staged on the host); the larger, as one
    is written at a time."""
    copies = [0]
    if tier.interval(cfg, restarts):
        node = tier.node_state_bytes(cfg, ranks_per_node, world_size)
        copies.append(-(-node // ranks_per_node))
    declared = engine(cfg.strategy.name)
    if cfg.trainer.async_checkpoint and declared.capabilities.async_checkpoint and declared.plan:
        copies.append(max(declared.plan.checkpoint_writes(cfg, param_count(cfg.model), world_size)))
    return max(copies)


def offloaded_bytes(cfg, world_size: int) -> int:
    """The training state the engine keeps in host memory (offload), per rank."""
    plan = engine(cfg.strategy.name).plan
    declared = plan.host_state if plan else None
    return declared(cfg, param_count(cfg.model), world_size) if declared else 0


def rank_bytes(cfg, ranks_per_node: int, world_size: int, on_gpu: bool,
               restarts: int | None = None) -> dict[str, int]:  # fmt: skip
    """One rank's process at its peak, by part (see the module's docstring)."""
    micro = micro_batch(cfg, world_size)
    plan = engine(cfg.strategy.name).plan
    training = (
        0 if on_gpu else sum(train_state(cfg, world_size).values()) + activation_bytes(cfg, micro)
    )
    parts = {
        "process": RANK_BASE_BYTES
        + (plan.host_process_bytes if plan else 0)
        + (CUDA_HOST_BYTES if on_gpu else 0),
        "build": build_bytes(cfg, on_gpu),
        "training": training,
        "offloaded": 0 if not on_gpu else offloaded_bytes(cfg, world_size),
        "pinned": pinned_bytes(cfg, world_size, on_gpu),
        "checkpoint_copy": checkpoint_copy_bytes(cfg, ranks_per_node, world_size, restarts),
    }
    loop = sum(v for k, v in parts.items() if k not in ("process", "build"))
    return {**parts, "total": parts["process"] + max(parts["build"], loop)}


def workers_bytes(cfg, world_size: int, on_gpu: bool) -> int:
    """What one rank's DataLoader workers add to the node: each worker's own pages, and
    once for all of them the pages their rank had when it forked them and writes again
    afterwards, which the workers keep (copy-on-write): on the CPU, the weights the
    optimizer rewrites every step."""
    workers = int(cfg.data.num_workers)
    if workers == 0:
        return 0
    kept = 0 if on_gpu else train_state(cfg, world_size)["weights"]
    return FORK_KEPT_BYTES + kept + workers * WORKER_OWN_BYTES


def node_processes(cfg, ranks_per_node: int, world_size: int, on_gpu: bool,
                   restarts: int | None = None) -> int:  # fmt: skip
    """Host memory a node's processes need besides /dev/shm: every rank at its peak, and
    what its DataLoader workers add."""
    rank = rank_bytes(cfg, ranks_per_node, world_size, on_gpu, restarts)["total"]
    return ranks_per_node * (rank + workers_bytes(cfg, world_size, on_gpu))


def host_per_node(cfg, ranks_per_node: int, world_size: int, on_gpu: bool,
                  restarts: int | None = None) -> dict:  # fmt: skip
    """Host memory one node needs: its processes (each rank by part, its workers) and
    /dev/shm (the loaders' batches and the memory tier's copies, memory.shm_need)."""
    rank = rank_bytes(cfg, ranks_per_node, world_size, on_gpu, restarts)
    processes = node_processes(cfg, ranks_per_node, world_size, on_gpu, restarts)
    shm = shm_need(cfg, ranks_per_node, world_size, restarts)
    return {
        "rank_process": rank["total"],
        "rank": rank,
        "workers": workers_bytes(cfg, world_size, on_gpu),
        "processes": processes,
        "shm": shm,
        "total": processes + shm,
    }
