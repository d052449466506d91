"""A fifth cluster backend, defined in this file alone and installed the way another package
would install one, and the way the launcher installs its own (entry points of the
`launcher.backends` and `launcher.renderers` groups naming this module, docs/architecture.md):
it renders, refuses a bad key of its section and a secret in one line, is listed by
`--help`, and a running job finds its id through it, with no edit to the launcher.

The backend is a thin variant of Slurm's: its own section (one key of its own), Slurm's
sbatch script with a line of its own, its own file name, its own job id variable. The
launched processes import this module through the entry point, so it holds nothing at
module level but the backend.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher.config.backends import Backend
from launcher.submit import slurm

NAME = "slurm_variant"
SCRIPT = "variant.sbatch"
SECRET_WAY = "keep it in the variant's vault"


@dataclass
class VariantConfig:
    greeting: str = "hello"  # a key only this backend has


def render(job) -> dict[str, str]:
    """Slurm's script, saying which backend rendered it."""
    (script,) = slurm.render(job).values()
    shebang, _, rest = script.partition("\n")
    return {SCRIPT: f"{shebang}\n# {job.cluster[NAME].greeting} from {NAME}\n{rest}"}


submit = slurm.submit


def job_key(environ: Mapping[str, str]) -> str | None:
    return f"variant{environ['VARIANT_JOB_ID']}" if environ.get("VARIANT_JOB_ID") else None


BACKEND = Backend(
    name=NAME,
    summary="a variant of the sbatch script",
    tool="sbatch",
    docs="docs/slurm.md",
    secret_way=SECRET_WAY,
    schema=VariantConfig,
    job_key=job_key,
)


def run(tmp_path: Path, *args: str, env: Mapping[str, str] = {}) -> subprocess.CompletedProcess:
    """`python *args` with this backend installed (its declaration and its renderer)."""
    from entry_points import installed_env_of

    points = {"launcher.backends": {NAME: __name__}, "launcher.renderers": {NAME: __name__}}
    environ = installed_env_of(tmp_path, "fifth-backend", points)
    return subprocess.run(
        [sys.executable, *args], env={**environ, **env}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_a_fifth_backend_renders_and_is_listed(tmp_path):
    from launch import FAST

    helped = run(tmp_path, "-m", "launcher.submit", "--help")
    assert helped.returncode == 0, helped.stderr
    assert f"{{k8s,slurm,{NAME}}}" in helped.stdout.splitlines()[0]
    assert f"a variant of the sbatch script ({NAME})" in " ".join(helped.stdout.split())
    trained = run(tmp_path, "-m", "launcher.train", "--help")
    line = next(x for x in trained.stdout.splitlines() if x.startswith("cluster: "))
    assert NAME in line.split(": ", 1)[1].split(", ")

    args = [*FAST, "cluster.nodes=2", f"cluster.{NAME}.greeting=bonjour"]
    rendered = run(tmp_path, "-m", "launcher.submit", NAME, "--dry-run", *args,
                   f"run.root={tmp_path / 'runs'}", "run.id=v")  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    script = tmp_path / "runs" / "v" / "submit" / SCRIPT
    assert rendered.stdout.split() == [str(script)]
    text = script.read_text()
    assert text.startswith(f"#!/bin/bash\n# bonjour from {NAME}\n")
    assert "#SBATCH --nodes=2" in text


def test_a_fifth_backend_refuses_a_bad_key_and_a_secret_in_one_line(tmp_path):
    for bad, says in (
        (f"cluster.{NAME}.greting=hi", f"cluster.{NAME}.greting: unknown key"),
        ("+cluster.env.WANDB_API_KEY=x", SECRET_WAY),
    ):
        refused = run(tmp_path, "-m", "launcher.submit", NAME, "--dry-run", bad,
                      f"run.root={tmp_path / 'runs'}", "run.id=r")  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith("error: ") and says in line, line
    assert not (tmp_path / "runs" / "r").exists()


def test_a_running_job_finds_its_id_through_the_fifth_backend(tmp_path):
    code = "from launcher.runtime.placement import launch_key; print(launch_key())"
    found = run(tmp_path, "-c", code, env={"VARIANT_JOB_ID": "42"})
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["variant42"]
