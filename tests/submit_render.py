"""A --dry-run render of `python -m launcher.submit`, for each cluster kind."""

from __future__ import annotations

from pathlib import Path

from launcher.submit.__main__ import main as submit_main

from launch import FAST

# The k8s renderer needs GPUs per node to be given (its default is 8): one CPU process.
SHAPE = {"slurm": [], "k8s": ["cluster.gpus_per_node=0"]}


def render(target: str, tmp_path: Path, *overrides: str, run_id="r") -> dict[str, str]:
    """The rendered files of a --dry-run, {name: text}; asserts it succeeded."""
    args = [*FAST, *SHAPE[target], f"run.root={tmp_path}", f"run.id={run_id}", *overrides]
    assert submit_main([target, "--dry-run", *args]) == 0
    folder = tmp_path / run_id / "submit"
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def slurm_stand_ins(nodes: list[str]) -> str:
    """bash stand-ins for what the sbatch script asks of Slurm: `sinfo` lists the
    partition's `nodes`; `scontrol -o show job` names the job's excluded nodes ($EXCLUDED),
    `scontrol show hostnames` splits a comma list, and every other call is recorded in
    $run_dir/calls for the test to read."""
    listed = "\\n".join(nodes)
    return f"""
sinfo() {{ printf '{listed}\\n'; }}
scontrol() {{
  case "$1 $2" in
    "-o show") echo "JobId=$SLURM_JOB_ID JobName=x ExcNodeList=$EXCLUDED Reason=None" ;;
    "show hostnames") echo "$3" | tr , '\\n' ;;
    *) echo "$*" >> "$run_dir/calls" ;;
  esac
}}
"""
