"""`python -m launcher.submit {slurm,k8s} [--dry-run] [overrides...]`.

Each target is a module with `render(job) -> {file name: text}` (which also checks what it
rendered, raising ConfigError) and `submit(job, paths) -> str` (hands the files to the
cluster and returns what identifies the job there), and may have `notes(job) -> [line]`:
what must exist before the job can run, and how to remove it. The files go into the run
directory's submit/ folder and their paths are printed on stdout, one per line; warnings
and notes go to stderr.
"""

from __future__ import annotations

import importlib
import sys

from launcher.config import ConfigError
from launcher.resilience import exit_codes
from launcher.submit.job import prepare

TARGETS = {"slurm": "launcher.submit.slurm", "k8s": "launcher.submit.k8s"}

USAGE = """usage: python -m launcher.submit {slurm,k8s} [--dry-run] [--tune] [overrides...]

Render the training experiment (the same overrides launcher.train takes, sweeps included)
as a cluster job: an sbatch script (slurm) or an Indexed Job and its Service (k8s). The
files go to <run.root>/<run.id>/submit/; without --dry-run they are submitted (sbatch,
kubectl apply). --tune: every node runs launcher.tune instead of launcher.train (tuning
rounds, docs/tuning.md). Cluster settings are the cluster.* keys: docs/slurm.md,
docs/kubernetes.md."""
TUNE_MODULE = "launcher.tune"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or "--help" in argv:
        print(USAGE)
        return 0 if argv else exit_codes.BAD_INPUT
    target, rest = argv[0], argv[1:]
    if target not in TARGETS:
        print(
            f"error: unknown target {target!r}; use one of: {', '.join(TARGETS)}", file=sys.stderr
        )
        return exit_codes.BAD_INPUT
    dry_run, tune = "--dry-run" in rest, "--tune" in rest
    overrides = [a for a in rest if a not in ("--dry-run", "--tune")]
    renderer = importlib.import_module(TARGETS[target])
    try:
        job = prepare(target, overrides)
        if tune:
            if len(job.points) > 1:
                raise ConfigError(
                    "--tune tunes one experiment, but the overrides sweep several points; "
                    "give one value per key"
                )
            job.module = TUNE_MODULE
        files = renderer.render(job)
        paths = job.write(files)
        for path in paths:
            print(path)
        for line in job.warnings:
            print(f"warning: {line}", file=sys.stderr)
        for line in getattr(renderer, "notes", lambda _: [])(job):
            print(f"note: {line}", file=sys.stderr)
        if not dry_run:
            print(renderer.submit(job, paths))
    except ConfigError as exc:
        print(f"error: {exc}{_hint(str(exc), overrides)}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    return 0


def _hint(error: str, overrides: list[str]) -> str:
    """Hydra's lexer error says nothing useful about a `#` inside a value that also holds
    quotes, brackets or commas (plain ones are quoted for you)."""
    if "LexerNoViableAltException" in error and any("#" in o for o in overrides):
        return "; a value with # must be quoted: 'key=\"a#b\"'"
    return ""


if __name__ == "__main__":
    sys.exit(main())
