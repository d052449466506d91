"""The commands a run's closing block offers: only those that will work on this run, judged
from what it left on disk when it ended.

- `launcher.analyze` reads traces: offered when the run has `traces/rank<r>/`;
- `launcher.generate` needs a complete checkpoint and the run's text tokenizer;
- `launcher.export` and continuing the run need a complete checkpoint.

A run that saved no checkpoint (`trainer.checkpoint_interval=0`, as `+exp=profile` sets) is
told so in one line instead of being offered commands that would fail.
"""

from __future__ import annotations

from pathlib import Path

from launcher.checkpoint.export import run_tokenizer
from launcher.checkpoint.protocol import find_resumable

INDENT = "        "


def has_traces(run_dir: Path) -> bool:
    folder = run_dir / "traces"
    return folder.is_dir() and any(p.name.startswith("rank") for p in folder.iterdir())


def next_commands(run_dir: Path, summary: dict) -> list[str]:
    """The closing block's lines after its figures: `next: <command>` and the commands
    under it, or why there is nothing to sample or continue."""
    commands = []
    if has_traces(run_dir):
        commands.append(f"python -m launcher.analyze {run_dir}")
    checkpoint = find_resumable(run_dir)
    if checkpoint is not None:
        if run_tokenizer(run_dir) is not None:
            commands.append(f"python -m launcher.generate {run_dir} --prompt 'def '")
        commands.append(f"python -m launcher.export {run_dir} {run_dir}/export")
        more = ""
        if str(summary.get("status", "")).startswith("completed"):
            more = f" trainer.max_steps=<more than {summary.get('steps')}>"
        commands.append(f"continue: the same command with run.id={summary.get('run_id')}{more}")
    lines = [f"  next: {commands[0]}", *(INDENT + c for c in commands[1:])] if commands else []
    if checkpoint is None:
        lines.append(
            "  no checkpoint saved (trainer.checkpoint_interval=0): nothing to sample, export "
            "or continue from"
        )
    return lines
