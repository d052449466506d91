"""`python -m launcher.submit <backend> [--dry-run] [overrides...]`, a backend one of
launcher.config.backends' (slurm, k8s, and those other packages add).

Each backend has a renderer module (its `launcher.renderers` entry point) with
`render(job) -> {file name: text}` (which also checks what it rendered, raising ConfigError)
and `submit(job, paths) -> str` (hands the files to the cluster and returns what identifies
the job there), and may have
`notes(job) -> [line]`: what must exist before the job can run, and how to remove it. The
files go into the run directory's submit/ folder and their paths are printed on stdout, one
per line; warnings and notes go to stderr.
"""

from __future__ import annotations

import sys
import textwrap

from launcher.config import ConfigError
from launcher.config.backends import backends
from launcher.resilience import exit_codes
from launcher.submit.job import prepare


def usage() -> str:
    """--help, naming every backend: what it renders, its tool and its docs."""
    found = backends().values()
    names = ",".join(b.name for b in found)
    text = (
        "Render the training experiment (the same overrides launcher.train takes, sweeps "
        "included) as a cluster job: "
        + " or ".join(f"{b.summary} ({b.name})" for b in found)
        + ". The files go to <run.root>/<run.id>/submit/; without --dry-run they are "
        f"submitted ({', '.join(b.tool for b in found)}). --tune: every node runs "
        "launcher.tune instead of launcher.train (tuning rounds, docs/tuning.md). Cluster "
        f"settings are the cluster.* keys: {', '.join(b.docs for b in found)}."
    )
    head = f"usage: python -m launcher.submit {{{names}}} [--dry-run] [--tune] [overrides...]"
    return f"{head}\n\n{textwrap.fill(text, 90)}"


TUNE_MODULE = "launcher.tune"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and (argv[0] in ("-h", "--help") or "--help" in argv):
        print(usage())
        return exit_codes.DONE
    if not argv:
        print(f"error: give a target: python -m launcher.submit {{{','.join(backends())}}} "
              "[--dry-run] [overrides...] (--help says more)", file=sys.stderr)  # fmt: skip
        return exit_codes.BAD_INPUT
    target, rest = argv[0], argv[1:]
    if target not in backends():
        print(
            f"error: unknown target {target!r}; use one of: {', '.join(backends())}",
            file=sys.stderr,
        )
        return exit_codes.BAD_INPUT
    dry_run, tune = "--dry-run" in rest, "--tune" in rest
    overrides = [a for a in rest if a not in ("--dry-run", "--tune")]
    renderer = backends()[target].renderer()
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
