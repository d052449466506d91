"""The rehearsal: check the experiment and the rehearsal's own keys before anything starts,
run the chosen cases one after another (the uninterrupted run they compare with once, when
the first case needs it), write the report after every case, print the verdict table.

The run directory is the experiment's own (run.root/run.id), so that launcher.submit finds
the rehearsal's stop-checkpoint figure there; the cases' runs live in its `rehearse/`
folder, which a new rehearsal replaces when every row of it passed, and moves to
`archive/` otherwise (the evidence of a failure is kept). A rehearsal holds the run
directory's `.rehearse.lock` throughout: a second one of the same run stops in one line.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
import shutil
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from launcher.config import ConfigError, compose, sweep
from launcher.config.backends import backends
from launcher.config.validate import key_problems
from launcher.paths import keep_aside, make_run_dir
from launcher.preflight import preflight
from launcher.rehearse import report
from launcher.rehearse.cases import CASES, NAMES, Case
from launcher.rehearse.launches import CaseFailed, kill_leftovers
from launcher.rehearse.rehearsal import Rehearsal
from launcher.rehearse.shrink import KEPT, shrunk
from launcher.runtime import placement, run_dir_check
from launcher.runtime.lock import LockHeld, tool_lock

log = logging.getLogger("launcher.rehearse")
FALLBACK_PRECISION = "trainer.precision=fp32"
FAILED = 1  # a row failed: the experiment is not ready (the rows say why)


def default_nproc(cfg: DictConfig) -> int:
    """rehearse.nproc, else the enclosing torchrun's world, else the GPUs here, else 2."""
    if cfg.rehearse.nproc is not None:
        return int(cfg.rehearse.nproc)
    world = placement.env_world()[2]
    if world > 1:
        return world
    import torch

    return max(2, torch.cuda.device_count())


def selected(cfg: DictConfig) -> list[Case]:
    """The cases rehearse.only/skip choose (the cluster's only where a cluster is set)."""
    for key in ("only", "skip"):
        unknown = [n for n in cfg.rehearse[key] if n not in NAMES]
        if unknown:
            raise ConfigError(
                f"rehearse.{key}: unknown case {unknown[0]!r}; the cases are {', '.join(NAMES)}"
            )
    only, skip = list(cfg.rehearse.only), list(cfg.rehearse.skip)
    has_cluster = cfg.cluster.name != "local"
    if "cluster" in only and not has_cluster:
        raise ConfigError(
            "rehearse.only names cluster, but cluster=local renders no job; "
            f"set {' or '.join(f'cluster={name}' for name in backends())}"
        )
    cases = [c for c in CASES if (not only or c.name in only) and c.name not in skip]
    cases = [c for c in cases if has_cluster or not c.needs_cluster]
    if not cases:
        raise ConfigError("rehearse.only/rehearse.skip leave no case to run")
    return cases


def plan(overrides: list[str]) -> tuple[DictConfig, list[str], int, list[str]]:
    """(experiment, shrunk overrides, ranks, notes); ConfigError on anything wrong."""
    points = sweep.plan(overrides, False, compose(overrides, sweep=True).hydra)
    if len(points.points) > 1 or points.swept_keys:
        raise ConfigError(
            "launcher.rehearse rehearses one experiment, but the overrides sweep "
            f"{', '.join(points.swept_keys) or 'several points'}; give one value per key"
        )
    cfg = compose(overrides)
    own = key_problems(cfg.copy(), 1)  # ranges and choices: no world size in them
    if own:  # each key as given first: the shrunk experiment is computed from them
        raise ConfigError(own[0])
    if placement.ranks_per_node() != placement.env_world()[2]:
        raise ConfigError("launcher.rehearse runs on one node; start it with one torchrun")
    nproc = default_nproc(cfg)
    notes: list[str] = []
    mine = [*overrides, *shrunk(cfg, nproc), "fault.kind=none", "resume=auto"]
    try:
        _check(mine, nproc)
    except ConfigError as exc:
        if "trainer.precision" not in str(exc):
            raise
        mine.append(FALLBACK_PRECISION)
        _check(mine, nproc)
        notes.append(f"trainer.precision={cfg.trainer.precision} runs as fp32 here: {exc}")
    if cfg.logger.mode == "online":
        notes.append("logger.mode=online runs offline: a rehearsal sends nothing to W&B")
    return cfg, mine, nproc, notes


def _check(overrides: list[str], nproc: int) -> None:
    """The shrunk experiment at every world size a case launches it with."""
    for world in (nproc, nproc // 2):
        preflight(compose(overrides), world, world)


def run_dir_of(cfg: DictConfig) -> Path:
    run_id = cfg.run.id or f"{dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"
    return (Path(cfg.run.root).expanduser() / str(run_id)).absolute()


def rehearse(overrides: list[str]) -> int:
    """Check, run the cases, report; the exit code (0 only when every row passed)."""
    cfg, mine, nproc, notes = plan(overrides)
    cases = selected(cfg)
    if placement.env_world()[0] != 0:
        return 0  # under torchrun, rank 0 rehearses; each case is a launch of its own
    run_dir = run_dir_of(cfg)
    problem = run_dir_check.problem(run_dir, nproc)
    if problem:
        raise ConfigError(problem)
    make_run_dir(run_dir, Path(cfg.run.root).expanduser().absolute(), cfg.run.access)
    try:
        with tool_lock(run_dir, "rehearse", "use another run.id"):
            return _rehearse(Rehearsal(cfg, overrides, mine, nproc, run_dir), cases, notes)
    except LockHeld as exc:  # another rehearsal of this run directory is running
        raise ConfigError(str(exc)) from exc


def set_aside_earlier(r: Rehearsal) -> str | None:
    """The earlier rehearsal's folder: replaced when its report says every row passed,
    else (a failure, or one cut short: the evidence of what went wrong) moved to
    archive/<time>/rehearse/. The note that says which, or None when there was none."""
    if not r.root.exists():
        return None
    try:
        passed = json.loads((r.root / "report.json").read_text())["passed"] is True
    except (OSError, ValueError, KeyError, TypeError):
        passed = False
    if passed:
        shutil.rmtree(r.root)
        return f"replaced the earlier rehearsal in {r.root} (every row had passed)"
    return f"moved the earlier rehearsal (failed or cut short) to {keep_aside(r.run_dir, r.root)}"


def _rehearse(r: Rehearsal, cases: list[Case], notes: list[str]) -> int:
    """The cases, under the rehearsal's lock of its run directory."""
    run_dir, nproc = r.run_dir, r.nproc
    note = set_aside_earlier(r)
    if note:
        notes.append(note)
    r.root.mkdir(parents=True)
    print(f"rehearsing {run_dir} on {nproc} ranks: {', '.join(c.name for c in cases)}",
          file=sys.stderr, flush=True)  # fmt: skip
    started, rows, paths = time.monotonic(), [], []
    facts = {"run_dir": str(run_dir), "nproc": nproc, "overrides": r.user_overrides,
             "kept": list(KEPT), "shrunk": r.overrides[len(r.user_overrides):],
             "notes": notes}  # fmt: skip
    try:
        for case in cases:
            rows.append(run_case(r, case))
            facts["wall_s"] = round(time.monotonic() - started, 1)
            paths = report.write(run_dir, report.report_dict(rows, r.checkpoint, facts))
    finally:
        kill_leftovers()
    print(report.markdown_table(rows))
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    return 0 if report.all_passed(rows) else FAILED


def run_case(r: Rehearsal, case: Case) -> report.Row:
    began = time.monotonic()
    try:
        observed, passed = case.run(r), True
    except CaseFailed as exc:
        observed, passed = str(exc), False
    wall = round(time.monotonic() - began, 1)
    evidence = r.root / case.evidence
    if not evidence.exists():
        evidence = r.root / "console"
    row = report.Row(case.name, case.fault, case.expected, observed, passed,
                     str(evidence.relative_to(r.run_dir)), wall)  # fmt: skip
    print(f"rehearse: {case.name}: {row.verdict} in {wall:.0f} s: {observed}",
          file=sys.stderr, flush=True)  # fmt: skip
    return row
