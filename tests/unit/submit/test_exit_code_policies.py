"""Every code of the exit-code contract (launcher/resilience/exit_codes.py) has a decided
policy in every renderer: an explicit arm of the sbatch script's `case` (7, stopped without a
checkpoint, once fell into its crash arm) and a decided Kubernetes action. A code added to
exit_codes.py without a row here fails; so does a rendered script that lacks its arm.
tests/launches/test_submit_setup.py runs the script's requeue decision for each code."""

from __future__ import annotations

import re

import pytest

from launcher.resilience import exit_codes as ec
from launcher.submit.k8s.job import pod_failure_policy

from submit_render import render

# code: (the start of the sbatch script's meaning, the Indexed Job's and JobSet's
# podFailurePolicy action, PyTorchJob's restartPolicy ExitCode (the operator's fixed rule:
# 1-127 permanent, 128 and more retryable); docs/slurm.md and docs/kubernetes.md's tables)
POLICIES = {
    ec.DONE: ("done", "succeeds", "succeeds"),
    ec.CRASH: ("crash", "counted", "permanent"),
    ec.BAD_INPUT: ("bad input", "FailJob", "permanent"),
    ec.NONFINITE: ("non-finite loss", "FailJob", "permanent"),
    ec.OOM: ("out of memory", "FailJob", "permanent"),
    ec.HANG: ("hang detected", "counted", "permanent"),
    ec.BAD_NODE: ("bad node", "counted", "permanent"),
    ec.STOPPED_NO_CHECKPOINT: ("stopped without a checkpoint", "counted", "permanent"),
    ec.NODE_LOST: ("node lost", "counted", "permanent"),
    ec.STOPPED: ("stopped with a checkpoint", "counted", "retryable"),
}


def test_every_contract_code_has_a_row():
    assert sorted(POLICIES) == sorted(ec.MEANING)


def case_arms(script: str) -> dict[str, str]:
    """{pattern: meaning} of the script's `case "$code"`, one entry per `|` alternative."""
    begin = script.index('case "$code" in')
    block = script[begin : script.index("esac", begin)]
    arms = {}
    for arm in block.split("\n", 1)[1].split(";;"):
        if ")" not in arm:
            continue
        patterns, body = arm.split(")", 1)
        meaning = re.search(r'meaning="([^"]*)"', body)
        for pattern in patterns.strip().split("|"):
            arms[pattern] = meaning[1] if meaning else ""
    return arms


@pytest.fixture(scope="module")
def arms(tmp_path_factory) -> dict[str, str]:
    return case_arms(render("slurm", tmp_path_factory.mktemp("slurm"))["job.sbatch"])


@pytest.mark.parametrize("code", sorted(POLICIES))
def test_the_sbatch_script_names_each_code_in_an_arm_of_its_own(arms, code):
    assert str(code) in arms, f"exit {code} falls into the `*)` arm: {sorted(arms)}"
    assert arms[str(code)].startswith(POLICIES[code][0]), arms[str(code)]


def job_action(code: int) -> str:
    if code == ec.DONE:
        return "succeeds"
    for rule in pod_failure_policy()["rules"]:
        if "onExitCodes" in rule and code in rule["onExitCodes"]["values"]:
            return rule["action"]
    return "counted"  # against backoffLimitPerIndex (Job) or maxRestarts (JobSet)


def pytorchjob_action(code: int) -> str:
    return "succeeds" if code == ec.DONE else "retryable" if code >= 128 else "permanent"


@pytest.mark.parametrize("code", sorted(POLICIES))
def test_the_kubernetes_policies_decide_each_code(code):
    assert (job_action(code), pytorchjob_action(code)) == POLICIES[code][1:]
