"""launcher.plan.host: a rank's host memory by part, its DataLoader workers' pages, and the
node's request the Slurm and Kubernetes renderers make from them, each against its formula
worked out here; gpt2-xl on 8-GPU nodes through the renderers' own functions."""

from __future__ import annotations

import pytest

from launcher.checkpoint import memory as tier
from launcher.config import compose
from launcher.config.model_shape import param_count
from launcher.config.registry import engine
from launcher.plan import host
from launcher.plan.memory import activation_bytes, train_state
from launcher.submit import slurm
from launcher.submit.job import prepare
from launcher.submit.k8s.checks import pod_memory
from launcher.submit.node_memory import PROCESS_MARGIN

XL_EMBEDDING = 50304 * 1600  # gpt2-xl's largest tensor: the padded vocabulary x the width
XL_NODE = ["model=gpt2-xl", "cluster.nodes=2", "cluster.gpus_per_node=8",
           "trainer.global_batch_size=64"]  # fmt: skip


def xl(*overrides: str):
    return compose([*XL_NODE, *overrides])


def test_a_gpu_rank_is_its_process_and_the_larger_of_its_build_and_its_loop():
    """No model on the host: the build holds one parameter (the embedding) on the CPU at a
    time; then only the pinned batches (micro 4 x seq 128 x tokens and targets in int64,
    prefetch 2 x 2 workers)."""
    cfg = xl()
    rank = host.rank_bytes(cfg, 8, 16, on_gpu=True, restarts=0)
    pinned = 2 * 4 * 128 * 8 * 2 * 2
    assert rank == {
        "process": host.RANK_BASE_BYTES + host.CUDA_HOST_BYTES,
        "build": 4 * XL_EMBEDDING,
        "training": 0,
        "offloaded": 0,
        "pinned": pinned,
        "checkpoint_copy": 0,
        "total": host.RANK_BASE_BYTES + host.CUDA_HOST_BYTES + 4 * XL_EMBEDDING,
    }
    assert host.workers_bytes(cfg, 16, on_gpu=True) == (
        host.FORK_KEPT_BYTES + 2 * host.WORKER_OWN_BYTES
    )


def test_a_cpu_rank_holds_its_training_and_its_workers_keep_the_weights_it_rewrites():
    cfg = compose(["model=gpt2", "trainer.micro_batch_size=2", "trainer.global_batch_size=4"])
    rank = host.rank_bytes(cfg, 2, 2, on_gpu=False, restarts=0)
    training = sum(train_state(cfg, 2).values()) + activation_bytes(cfg, 2)
    assert training == 16 * param_count(cfg.model) + activation_bytes(cfg, 2)  # DDP, bucket view
    assert rank["build"] == 0 and rank["pinned"] == 0  # built in place; pinned on a GPU only
    assert rank["training"] == training
    assert rank["total"] == host.RANK_BASE_BYTES + training
    weights = 4 * param_count(cfg.model)
    workers = host.FORK_KEPT_BYTES + weights + 2 * host.WORKER_OWN_BYTES
    assert host.workers_bytes(cfg, 2, on_gpu=False) == workers
    cfg.data.num_workers = 0
    assert host.workers_bytes(cfg, 2, on_gpu=False) == 0


@pytest.mark.parametrize(
    "overrides, per_param",
    [
        (["strategy=deepspeed", "strategy.zero_stage=2", "strategy.offload_optimizer=cpu"], 16),
        (
            [
                "strategy=deepspeed",
                "strategy.zero_stage=3",
                "strategy.offload_optimizer=cpu",
                "strategy.offload_param=cpu",
                "trainer.precision=bf16",
            ],
            16 + 2,
        ),  # fmt: skip
        (["strategy=fsdp2", "strategy.offload=cpu"], 16),
        (["strategy=deepspeed", "strategy.zero_stage=2"], 0),
        (["strategy=fsdp2"], 0),
    ],
)
def test_offloaded_state_is_host_memory_per_rank(overrides, per_param):
    cfg = xl(*overrides)
    share = -(-param_count(cfg.model) // 16)
    rank = host.rank_bytes(cfg, 8, 16, on_gpu=True, restarts=0)
    assert rank["offloaded"] == per_param * share
    process = host.RANK_BASE_BYTES + host.CUDA_HOST_BYTES
    process += engine(cfg.strategy.name).plan.host_process_bytes
    assert rank["total"] == process + max(4 * XL_EMBEDDING, rank["offloaded"] + rank["pinned"])


def test_a_checkpoint_copy_is_held_while_it_is_written():
    """The memory tier (on where torchrun restarts the job): a rank's part of the node's
    copy; FSDP2's asynchronous save: the rank's shard staged on the host."""
    cfg = xl()
    node = tier.node_state_bytes(cfg, 8, 16)
    assert host.checkpoint_copy_bytes(cfg, 8, 16, restarts=3) == -(-node // 8)
    assert host.checkpoint_copy_bytes(cfg, 8, 16, restarts=0) == 0
    fsdp2 = xl("strategy=fsdp2", "trainer.async_checkpoint=true")
    writes = engine("fsdp2").plan.checkpoint_writes(fsdp2, param_count(fsdp2.model), 16)
    assert len(writes) == 16 and host.checkpoint_copy_bytes(fsdp2, 8, 16, restarts=0) == max(writes)


def test_the_renderers_request_the_plans_need_for_gpt2_xl_on_8_gpu_nodes(tmp_path):
    """Slurm's --mem and the pod's memory: 8 ranks at their peak and their workers, with the
    margin, through the renderers' own functions; it grows with the model (the build's
    largest parameter) and with the memory tier the pods' restarts turn on."""

    def rendered(target: str, *overrides: str):
        args = [*XL_NODE, *overrides, f"run.root={tmp_path}", f"run.id={target}"]
        job = prepare(target, args, check_paths=False)
        return slurm.job_memory(job) if target == "slurm" else pod_memory(job)

    process = host.RANK_BASE_BYTES + host.CUDA_HOST_BYTES
    workers = host.FORK_KEPT_BYTES + 2 * host.WORKER_OWN_BYTES
    need = 8 * (process + 4 * XL_EMBEDDING + workers)
    mem = rendered("slurm")
    assert mem.processes_need == need
    assert mem.processes == int(need * (1 + PROCESS_MARGIN))
    assert rendered("k8s", "cluster.k8s.max_restarts=0").processes_need == need
    smaller = rendered("slurm", "model=gpt2")
    assert need - smaller.processes_need == 8 * 4 * (XL_EMBEDDING - 50304 * 768)
    cfg = xl()
    copy = -(-tier.node_state_bytes(cfg, 8, 16) // 8)  # the tier's copy over the build's
    assert rendered("k8s").processes_need == 8 * (process + copy + 2 * 4 * 128 * 8 * 2 * 2
                                                  + workers)  # fmt: skip
