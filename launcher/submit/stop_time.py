"""How long the stop checkpoint takes to write: what a stop signal's grace must hold.

A stop (Kubernetes' SIGTERM before the grace period's SIGKILL, Slurm's warning before the
time limit) ends in one checkpoint write, whose time grows with the model: the weights and
the optimizer's state. In order of trust:

1. the write time given by hand (`<group>.checkpoint_write_s`);
2. the run's own last checkpoint, when it has run before and its run directory is visible
   here: the write time its meta.json records (launcher.checkpoint);
3. the run's rehearsal (`python -m launcher.rehearse` with the same run.root and run.id):
   its stop checkpoint's write time, measured at the shrunk size and scaled to the model's
   state (rehearse/report.json);
4. the size of the run's last checkpoint, else the plan's estimate of the checkpoint
   from the model's shape and the engine (launcher.plan.forecast.checkpoint_bytes: fp32
   weights and AdamW's two fp32 moments, 12 bytes a parameter, and a ZeRO module);

a size is turned into a time at `<group>.checkpoint_write_mb_s`, the write bandwidth one
rank reaches to the run directory's file system (a configured figure: measure yours): the
checkpoint takes as long as its largest writer's share (DDP's rank 0 writes it all; a
sharded engine's ranks write theirs at once).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from launcher.checkpoint.protocol import find_resumable, read_meta
from launcher.config import ConfigError
from launcher.config.backends import Backend
from launcher.plan.forecast import checkpoint_bytes
from launcher.plan.measured import largest_share
from launcher.plan.shape import shape_of
from launcher.plan.stop import budget
from launcher.submit.job import SubmitJob, visible

REHEARSAL_REPORT = Path("rehearse") / "report.json"  # in the run directory (launcher.rehearse)


@dataclass
class WriteTime:
    seconds: float
    why: str  # how it was obtained, for the refusal's line


def checkpoint_write(job: SubmitJob, group: DictConfig, key: str) -> WriteTime:
    """The stop checkpoint's write time for `job` (`key`: cluster.k8s or cluster.slurm)."""
    if group.checkpoint_write_s is not None:
        seconds = float(group.checkpoint_write_s)
        return WriteTime(seconds, f"{key}.checkpoint_write_s={seconds:g}")
    rate = float(group.checkpoint_write_mb_s) * 1e6
    last = _last_checkpoint(job)
    meta = (read_meta(last) or {}) if last is not None else {}
    if meta.get("write_s") is not None:
        seconds = float(meta["write_s"])
        return WriteTime(seconds, f"the run's last checkpoint ({last.name}) took {seconds:g} s")
    rehearsed = rehearsed_write(job)
    if rehearsed is not None:
        return rehearsed
    shapes = [shape_of(p, job.world_size) for p in (job.points or [job.cfg])]
    if last is not None:
        files = sum(int(n) for n in (meta.get("files") or {}).values())
        size = round(files * largest_share(shapes[0], job.world_size))
        return WriteTime(
            size / rate,
            f"the largest writer's share ({size / 1e9:.2f} GB) of the run's last checkpoint "
            f"({last.name}) at {key}.checkpoint_write_mb_s={group.checkpoint_write_mb_s:g} a "
            "writing rank",
        )
    size = max(checkpoint_bytes(p, job.world_size, s)["per_rank"]
               for p, s in zip(job.points or [job.cfg], shapes, strict=True))  # fmt: skip
    return WriteTime(
        size / rate,
        f"{size / 1e9:.2f} GB of model and optimizer state on the largest writing rank "
        f"({job.cfg.model.name}, launcher.plan) at {key}.checkpoint_write_mb_s="
        f"{group.checkpoint_write_mb_s:g} a writing rank",
    )


def rehearsed_write(job: SubmitJob) -> WriteTime | None:
    """The stop checkpoint's time that the run's rehearsal measured and extrapolated to
    the real model, when its report is visible here and holds one."""
    path = job.run_dir / REHEARSAL_REPORT
    if not visible(str(job.run_dir), job.workdir) or not path.is_file():
        return None
    try:
        ckpt = json.loads(path.read_text()).get("stop_checkpoint")
        return WriteTime(float(ckpt["extrapolated_s"]), f"{ckpt['why']} ({path})")
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # no stop case in that rehearsal, or a report from another version


def _last_checkpoint(job: SubmitJob):
    if not visible(str(job.run_dir), job.workdir) or not job.run_dir.is_dir():
        return None
    return find_resumable(job.run_dir)


def check_stop_window(job: SubmitJob, backend: Backend) -> None:
    """The backend's stop window (Kubernetes' grace period, Slurm's signal lead) must hold
    the step in flight (`<section>.step_time_s`), the stop checkpoint's write (measured,
    given or estimated: checkpoint_write) and what the backend's launcher keeps of it
    (launcher.plan.stop); else one line naming the key, the sum and its parts."""
    group, key = getattr(job.cluster, backend.name), f"cluster.{backend.name}"
    write = checkpoint_write(job, group, key)
    stop = budget(job.cfg, backend, write.seconds, group.step_time_s)
    if stop.fits:
        return
    step = f"{key}.step_time_s={group.step_time_s} + " if group.step_time_s else ""
    margin = f" + {stop.margin_s} s for torchrun to end" if stop.margin_s else ""
    raise ConfigError(
        f"{stop.key}={stop.window_s} is too short to stop with a checkpoint: {step}a "
        f"{write.seconds:.0f} s checkpoint write ({write.why}){margin} = {stop.need_s:.0f} s; "
        f"raise {backend.stop_window}"
    )
