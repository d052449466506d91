"""The burn-in gate's pure parts (docs/burnin.md): who is slow (the median of the others),
how a slow rank or node is named, the run's record of refused hosts, and what each
renderer makes of it: `--exclude` and the pods' node affinity. The launches (and the
sbatch script's requeue block, run by bash with a stand-in `scontrol`) are in
tests/launches/test_burnin.py, the real Slurm requeue in tests/cluster/test_slurm.py.
"""

from __future__ import annotations

import pytest
import yaml

from launcher.config import ConfigError, compose, normalize, validate
from launcher.resilience import bad_hosts, exit_codes
from launcher.resilience.burnin import (
    judge,
    outliers,
    refused_hosts,
    summary,
    verdict_line,
)
from launcher.submit.k8s import without_nodes

from paths import REPO
from submit_render import render


def test_a_slow_entry_is_judged_against_the_median_of_the_others():
    found = outliers([1.0, 1.1, 0.9, 2.0], tolerance=0.25)
    assert [(o.index, o.median_others) for o in found] == [(3, 1.0)]
    assert found[0].excess == pytest.approx(1.0)
    # Two ranks: the other rank is the yardstick, so a slow one cannot hide behind a mean.
    assert [o.index for o in outliers([1.0, 1.3], 0.25)] == [1]
    assert outliers([1.0, 1.2], 0.25) == []  # 20% is within the tolerance
    assert outliers([1.0, 1.0, 1.0], 0.25) == []
    assert outliers([5.0], 0.25) == []  # alone: nothing to compare with
    assert outliers([None, 1.0, 3.0], 0.25)[0].index == 2  # None: not measured, not judged


def rank(r: int, host: str, matmul: float, node: float | None) -> dict:
    return {
        "rank": r,
        "host": host,
        "matmul_s": matmul,
        "node_allreduce": None if node is None else {"seconds": node, "busbw_gbps": 1.0},
    }


def test_the_slow_rank_and_the_slow_node_are_named_with_host_and_figure():
    ranks = [
        rank(0, "a", 0.010, 0.002),
        rank(1, "a", 0.030, 0.002),
        rank(2, "b", 0.010, 0.002),
        rank(3, "b", 0.010, 0.003),
        rank(4, "c", 0.011, 0.009),
        rank(5, "c", 0.010, 0.008),
    ]
    slow_ranks, slow_nodes = judge(ranks, tolerance=0.25)
    assert [(s["rank"], s["host"]) for s in slow_ranks] == [(1, "a")]
    assert slow_ranks[0]["figure"] == "matmul 30 ms, 200% above the other ranks' median 10 ms"
    # A node's all-reduce is its slowest rank's: c's 9 ms against a's 2 and b's 3.
    assert [(s["host"], s["ranks"]) for s in slow_nodes] == [("c", [4, 5])]
    assert slow_nodes[0]["excess_frac"] == pytest.approx(9 / 2.5 - 1)
    report = {
        "verdict": "refused",
        "tolerance": 0.25,
        "slow_ranks": slow_ranks,
        "slow_nodes": slow_nodes,
        "seconds": 0.5,
        "budget_s": 10.0,
        "action": "refuse",
        "matmul_size": 512,
        "ranks": ranks,
    }
    line = verdict_line(report)
    assert "\n" not in line
    assert "rank 1 on a: matmul 30 ms, 200% above" in line and "node c: in-node all-reduce" in line
    assert "exit 6 (bad node)" in line
    kept = summary(report)
    assert kept["slow_ranks"] == [{"rank": 1, "host": "a", "figure": slow_ranks[0]["figure"]}]
    assert kept["verdict"] == "refused" and kept["seconds"] == 0.5


def test_a_single_node_job_has_no_node_to_compare():
    _, slow_nodes = judge([rank(0, "a", 0.01, None), rank(1, "a", 0.01, None)], 0.25)
    assert slow_nodes == []


def test_a_refusal_names_each_host_once_with_its_figure():
    slow = [{"rank": 3, "host": "n2", "figure": "matmul 9 ms"}]
    nodes = [{"host": "n2", "figure": "in-node all-reduce 4 ms"}, {"host": "n5", "figure": "x"}]
    found = refused_hosts({"slow_ranks": slow, "slow_nodes": nodes})
    assert found == {"n2": "burn-in: node: in-node all-reduce 4 ms", "n5": "burn-in: node: x"}
    assert refused_hosts({"slow_ranks": slow, "slow_nodes": []}) == {
        "n2": "burn-in: rank 3: matmul 9 ms"
    }


def test_the_bad_node_code_is_new_and_ranked_after_bad_input():
    codes = [exit_codes.DONE, exit_codes.CRASH, exit_codes.BAD_INPUT, exit_codes.NONFINITE,
             exit_codes.OOM, exit_codes.HANG, exit_codes.STOPPED]  # fmt: skip
    assert exit_codes.BAD_NODE == 6 and exit_codes.BAD_NODE not in codes
    assert exit_codes.BAD_NODE < 126  # not the shell's 126/127 nor a signal's 128+n
    assert exit_codes.job_code({0: exit_codes.BAD_NODE, 1: exit_codes.STOPPED}, False) == 6
    doc = (REPO / "docs" / "faults.md").read_text()
    assert "| 6 | bad node" in doc


def test_the_gate_is_on_for_clusters_and_off_locally():
    for cluster, on in (("local", False), ("slurm", True), ("k8s", True)):
        cfg = compose([f"cluster={cluster}"])
        normalize(cfg, 1)
        assert cfg.burnin.enabled is on, cluster
    cfg = compose(["cluster=slurm", "burnin.enabled=false"])
    normalize(cfg, 1)
    assert cfg.burnin.enabled is False  # the user's choice stands


@pytest.mark.parametrize(
    "override, words",
    [
        ("burnin.action=ignore", "burnin.action=ignore: not one of warn, refuse"),
        ("burnin.tolerance=0", "burnin.tolerance=0"),
        ("burnin.iters=0", "burnin.iters=0"),
    ],
)
def test_bad_burnin_values_are_one_line(override, words):
    with pytest.raises(ConfigError) as exc:
        validate(compose([override]), 1)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_a_resubmission_renders_the_refused_hosts_excluded(tmp_path):
    (tmp_path / "r").mkdir()
    bad_hosts.record(tmp_path / "r", {"n1": "burn-in: rank 0: slow", "n4": "hang: rank 9"})
    script = render("slurm", tmp_path)["job.sbatch"]
    assert "#SBATCH --exclude=n1,n4\n" in script
    files = render("k8s", tmp_path)
    job = yaml.safe_load(files["job.yaml"])
    pod = job["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1", "n4"]}
            ]
        }
    ]
    assert "# excluded: node(s) n1, n4, kept off by this run" in files["job.yaml"]
    env = pod["containers"][0]["env"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in env


def test_the_exclusion_joins_every_node_selector_term_of_the_users_affinity():
    given = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]},
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]},
                ]
            }
        },
        "podAntiAffinity": {"x": 1},
    }
    out = without_nodes(given, ["bad"])
    terms = out["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [len(t["matchExpressions"]) for t in terms["nodeSelectorTerms"]] == [2, 2]
    assert out["podAntiAffinity"] == {"x": 1}
    assert len(given["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
               ["nodeSelectorTerms"][0]["matchExpressions"]) == 1  # fmt: skip  # not mutated
