"""launcher.plan.comm's bucket pipeline: what a step's collectives expose past backward,
the bucket sizes the tuner tries, and a link fitted to a measured run; exact where the
arithmetic is."""

from __future__ import annotations

import pytest

from launcher.config import compose, normalize
from launcher.config.model_shape import param_count
from launcher.plan import comm
from launcher.plan.measured import RunRecord, Sample
from launcher.plan.presets import LINKS, Link, Topology
from launcher.plan.shape import shape_of
from launcher.tune.candidates import propose

LINK = Link("test", 1e9, 1e-4, "a test link")  # 1 GB/s, 100 us a step
TWO = Topology(1, 2, LINK)


def one(size: int, topo: Topology = TWO) -> float:
    return comm.collective_s("all_reduce", size, topo)


@pytest.mark.parametrize(
    ("op", "nodes", "per_node", "want"),
    [
        # one node: ring 2(n-1) steps, the chain of a node's ranks as many: 14 alphas
        ("all_reduce", 1, 8, 14 * 1e-5 + 2 * 7 / 8 * 1e9 / 100e9),
        ("reduce_scatter", 1, 8, 7 * 1e-5 + 7 / 8 * 1e9 / 100e9),
        ("all_gather", 1, 2, 1e-5 + 1 / 2 * 1e9 / 100e9),
        ("all_reduce", 1, 1, 0.0),
        # 128 nodes of 8: a ring's 1,023 steps, 127 of them across nodes (NCCL's tuner), at
        # the network's bus bandwidth; the all-reduce's tree: 2 x (7 intra + 7 inter)
        ("all_gather", 128, 8, 896 * 1e-5 + 127 * 1e-4 + 1023 / 1024 * 1e9 / 40e9),
        ("all_reduce", 128, 8, 14 * 1e-5 + 14 * 1e-4 + 2 * 1023 / 1024 * 1e9 / 40e9),
    ],
)
def test_collectives_count_each_step_on_the_link_it_crosses(op, nodes, per_node, want):
    topo = Topology(nodes, per_node, Link("nvl", 100e9, 1e-5, "-"), Link("ib", 40e9, 1e-4, "-"))
    assert comm.collective_s(op, 10**9, topo) == pytest.approx(want)


def test_fsdp2_and_zero3_gather_alike_each_in_its_own_parts():
    """Both gather a part's weights before it runs (launcher.strategy.sharded_plan), timed
    by the same arithmetic at 1,024 ranks (NVLink steps at NVLink's latency): FSDP2 each
    block whole, twice a micro-step when resharded (the root once: it stays gathered);
    DeepSpeed each module, twice a micro-step when the model holds more parameters than
    stage3_max_live_parameters (gpt2-xl's 1.56e9), once when fewer (gpt2's). FSDP2
    reduce-scatters per unit once a step, ZeRO-3 in buckets of strategy.reduce_bucket_size
    elements on every micro-step."""
    xl = ["model=gpt2-xl", "model.vocab_size=50257", "trainer.global_batch_size=1024",
          "trainer.micro_batch_size=1"]  # fmt: skip
    topo = Topology(128, 8, LINKS["nvlink"], LINKS["infiniband"])
    fsdp = comm.step_comm(compose([*xl, "strategy=fsdp2"]), 1024, topo)["collectives"]
    zero3 = comm.step_comm(compose([*xl, "strategy=zero3"]), 1024, topo)["collectives"]
    gathered = [r for r in zero3 if r["op"] == "all_gather"]
    assert fsdp[0]["op"] == "all_gather" and fsdp[0]["times"] == 96 and fsdp[1]["times"] == 1
    assert [r["times"] for r in gathered] == [96] * 6 + [2] * 3
    assert sum(r["bytes"] for r in gathered[:6]) == fsdp[0]["bytes"]  # a block, module by module
    for row in gathered:
        assert row["time_s"] == pytest.approx(
            row["times"] * comm.collective_s("all_gather", row["bytes"], topo)
        )
    assert [(r["op"], r["times"]) for r in fsdp[2:]] == [("reduce_scatter", 48),
                                                          ("reduce_scatter", 1)]  # fmt: skip
    params = param_count(compose(xl).model)
    reduced = [r for r in zero3 if r["op"] == "reduce_scatter"]
    assert [r["bytes"] for r in reduced] == [2 * 10**9] * 3 + [4 * (params - 15 * 10**8)]
    small = compose(["model=gpt2", "model.vocab_size=50257", "strategy=zero3",
                     "trainer.global_batch_size=16", "trainer.micro_batch_size=4"])  # fmt: skip
    once = [r["times"] for r in comm.step_comm(small, 2, TWO)["collectives"]]
    assert once[:6] == [12 * 2] * 6  # 12 layers, 2 micro-steps, once each


def test_one_bucket_is_exposed_whole_whatever_the_backward():
    rows = [("all_reduce", 10**6, 1)]
    for backward in (0.0, 0.01, 10.0):
        assert comm.exposed_s(rows, TWO, backward) == pytest.approx(one(10**6))


def test_buckets_hide_behind_backward_all_but_the_last():
    rows = [("all_reduce", 10**5, 10)]  # 10 buckets, 0.3 ms each at 2 ranks
    assert comm.exposed_s(rows, TWO, 0.0) == pytest.approx(10 * one(10**5))
    assert comm.exposed_s(rows, TWO, 1.0) == pytest.approx(one(10**5))  # backward is long
    # a backward shorter than the queue: the queue's end past it
    assert comm.exposed_s(rows, TWO, 0.001) == pytest.approx(0.0001 + 10 * one(10**5) - 0.001)


def test_the_tie_goes_to_the_default_and_only_better_sizes_are_offered():
    cfg = compose(["model=gpt2-tiny", "strategy.bucket_cap_mb=0.0005"])
    grads_mib = param_count(cfg.model) * 4 / 2**20
    no_hiding = comm.bucket_sizes(cfg, "strategy.bucket_cap_mb", 25.0, 2, TWO, 0.0)
    (best_mb, best_s), *rest = no_hiding
    assert best_mb == 25.0  # one bucket: every size above the gradients ties; the default
    assert all(mb < grads_mib and s > best_s for mb, s in rest)  # the rest: distinct layouts
    current = comm.exposed_s([("all_reduce", 524, 2400)], TWO, 0.0)
    assert all(s < current for _, s in no_hiding)
    # latency-free and a long backward: the smallest buckets hide the most
    free = Topology(1, 2, Link("free", 1e9, 0.0, "no latency"))
    one_bucket = compose(["model=gpt2-tiny", "strategy.bucket_cap_mb=25"])
    smallest = comm.bucket_sizes(one_bucket, "strategy.bucket_cap_mb", 25.0, 2, free, 10.0)
    assert smallest[0][0] == 2**-4
    assert comm.bucket_sizes(compose(["strategy.bucket_cap_mb=25"]), "strategy.bucket_cap_mb",
                             25.0, 2, TWO, 0.0) == []  # nothing beats one bucket  # fmt: skip


def test_the_hidden_window_reproduces_the_measured_exposure():
    rows = [("all_reduce", 10**5, 10)]
    for exposed in (10 * one(10**5), 0.002, one(10**5)):
        window = comm.hidden_window(rows, TWO, 1.0, exposed)
        assert comm.exposed_s(rows, TWO, window) == pytest.approx(exposed, rel=1e-6)


def test_the_tuner_sizes_buckets_by_the_plan_and_only_with_a_measured_run():
    cfg = compose(["model=gpt2-tiny", "strategy.bucket_cap_mb=0.0005"])
    normalize(cfg, 2)
    assert [c.name for c in propose([{"kind": "exposed_comm"}], cfg, 2, False)] == [
        "strategy.static_graph=true",
        "strategy.comm_hook=bf16",
    ]
    shape = shape_of(cfg, 2)
    # 18 all-reduces a step of 0.07 MB at an effective 20 MB/s, half of the step hidden
    timed = Sample("all_reduce", 2, 2, 7e4, 7e4 / 0.02e9, 18, "a run")
    run = RunRecord("a run", shape, "ddp", 2, 2, 2, None, step_s=0.2, exposed_s=0.03,
                    wait_s=0.0, comm_s=0.06, samples=[timed])  # fmt: skip
    cands = propose([{"kind": "exposed_comm"}], cfg, 2, False, run)
    # on a CPU nothing hides: the fewest collectives (one bucket, the default), then two
    assert [c.name for c in cands] == [
        "strategy.bucket_cap_mb=25",
        "strategy.bucket_cap_mb=0.5",
        "strategy.static_graph=true",
        "strategy.comm_hook=bf16",
    ]
    assert cands[0].predicted_exposed_s < cands[1].predicted_exposed_s
    # on a GPU that hid half its communication: smaller buckets, whose pipeline hides more
    on_gpu = propose([{"kind": "exposed_comm"}], cfg, 2, True, run)
    assert on_gpu[0].changes["strategy.bucket_cap_mb"] < 0.5


@pytest.mark.parametrize(("cap", "buckets"), [(0.0005, 18), (0.25, 3), (0.5, 2), (1, 1), (25, 1)])
@pytest.mark.parametrize("hook", ["none", "bf16", "fp16"])
def test_ddp_buckets_are_cut_from_whole_tensors_as_ddp_cuts_them(cap, buckets, hook):
    """The counts gpt2-tiny's DDP reported (comm/buckets) in the tuner's trials at 2 ranks
    with the test corpus's 512-token vocabulary: each bucket closes once it holds the cap of
    fp32 gradients, under a compression hook too (it halves each bucket's bytes, not the
    layout: 3 buckets at 0.25 MiB under bf16, as a run measures them)."""
    cfg = compose(["model=gpt2-tiny", "model.vocab_size=512", f"strategy.bucket_cap_mb={cap}",
                   f"strategy.comm_hook={hook}"])  # fmt: skip
    rows = comm.step_comm(cfg, 2, TWO)["collectives"]
    assert sum(r["times"] for r in rows) == buckets
    width = 4 if hook == "none" else 2
    assert sum(r["bytes"] for r in rows) == param_count(cfg.model) * width
