"""One training job from a composed config, and the exit code it ends with.

Checks the config against this machine, joins the job, writes the run directory's files,
builds data, model and strategy, resumes, runs the loop, and always leaves summary.json and
a clean process-group teardown behind, whatever happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from launcher.checkpoint import memory, resume
from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint.memory import MemoryTier
from launcher.config import ConfigError, TrainConfig, normalize, typed
from launcher.config.registry import build_strategy, engine
from launcher.config.secret_keys import is_secret_key
from launcher.config.sweep import flatten
from launcher.data import TokenData, build_train_loader, prepare_data
from launcher.data.cache import cache_root
from launcher.data.tokenizer import TOKENIZER_DIR
from launcher.model.build import build_model, count_params, flops_per_token, peak_flops
from launcher.observe.nccl_transport import transport_recorders
from launcher.observe.report import RANKS, write_report
from launcher.observe.sinks import ConsoleSink, JsonlSink, RankFileSink, write_summary
from launcher.observe.tensorboard_sink import (  # imports no tensorboardX
    TensorBoardSink,
    code_block,
    tensorboard_enabled,
)
from launcher.observe.wandb_sink import WandbSink, wandb_enabled  # imports no wandb
from launcher.paths import atomic_write
from launcher.plan import forecast as plan_forecast
from launcher.plan.memory import shm_need
from launcher.resilience import burnin, exit_codes, first_failure
from launcher.resilience.faults import peer_left, slow_phase
from launcher.resilience.watchdog import HangWatchdog
from launcher.runtime import disk, envinfo
from launcher.runtime.disk import shm_available_bytes
from launcher.runtime.latest import point_latest
from launcher.runtime.launch_state import LaunchState
from launcher.runtime.lock import LockHeld, RunLock
from launcher.runtime.process import (
    Runtime,
    RuntimeConfig,
    end_job,
    env_world,
    freeze_what_lasts,
    launch_key,
    open_run_dir,
    ranks_per_node,
    start,
)
from launcher.train.loop import LoopConfig, NonFiniteLoss, OutOfMemory, Stopped, TrainLoop
from launcher.train.preflight import tier_room

log = logging.getLogger("launcher")


def redacted(cfg: TrainConfig) -> dict:
    """The resolved config with values of secret-looking keys masked."""

    def mask(node):
        if isinstance(node, dict):
            return {k: "***" if is_secret_key(k) and v else mask(v) for k, v in node.items()}
        if isinstance(node, list):
            return [mask(v) for v in node]
        return node

    return mask(dataclasses.asdict(cfg))


def changed_settings(before: dict, now: dict) -> list[str]:
    """`key: old -> new` for each setting that differs between two configs (a key only
    one of them has counts as changed; secrets are masked in both, so never shown)."""
    old, new = flatten(before), flatten(now)
    keys = sorted(set(old) | set(new))
    missing = "(unset)"
    return [
        f"{k}: {old.get(k, missing)} -> {new.get(k, missing)}"
        for k in keys
        if old.get(k, missing) != new.get(k, missing)
    ]


def log_changed_settings(config_file: Path, now: dict, start_step: int) -> None:
    """A continued run says what its settings changed since the launch that wrote
    config.yaml (e.g. a raised trainer.max_steps), before that file is replaced: the
    resume checks refuse the changes that would lose or repeat data, so what is left
    here is what the user chose to change. A config.yaml that cannot be read says so."""
    try:
        before = OmegaConf.to_container(OmegaConf.load(config_file))
    except FileNotFoundError:
        return
    except Exception as exc:  # noqa: BLE001 - a damaged file must not stop the resume
        log.warning("%s is unreadable (%s); cannot say which settings changed", config_file, exc)
        return
    changes = changed_settings(before if isinstance(before, dict) else {}, now)
    if changes:
        log.info("continuing from step %d with changed settings: %s", start_step,
                 "; ".join(changes))  # fmt: skip


def write_run_files(
    cfg: TrainConfig, rt: Runtime, start_step: int, gate: dict | None = None
) -> None:
    """config.yaml and env.json (with the burn-in gate's verdict, when it ran), each whole
    or not at all (a full disk cuts neither). A continued run (start_step > 0) first logs
    what changed since its last launch."""
    settings = OmegaConf.create(redacted(cfg))
    if start_step > 0:
        now = OmegaConf.to_container(settings)  # as config.yaml holds it: lists, not tuples
        log_changed_settings(rt.run_dir / "config.yaml", now, start_step)
    atomic_write(rt.run_dir / "config.yaml", OmegaConf.to_yaml(settings))
    env = envinfo.collect(shm_need(cfg, ranks_per_node(), rt.world_size))
    env.update(world_size=rt.world_size, backend=rt.backend, run_id=rt.run_id)
    if gate is not None:
        env["burnin"] = burnin.summary(gate)
    atomic_write(rt.run_dir / "env.json", json.dumps(env, indent=1))


def wandb_sink(cfg: TrainConfig, rt: Runtime, point: str | None) -> WandbSink:
    """The run's one W&B run (rank 0 only): config is the redacted config plus env.json.

    A sweep point's run is named by its point and grouped under the sweep's id."""
    env = json.loads((rt.run_dir / "env.json").read_text())
    return WandbSink(
        cfg.logger,
        run_dir=rt.run_dir,
        run_id=rt.run_id,
        config={**redacted(cfg), "env": env},
        group=cfg.logger.group or (rt.launch.sweep_id if point else None),
        name=cfg.logger.name or point or rt.run_id,
    )


def tensorboard_sink(rt: Runtime, start_step: int) -> TensorBoardSink:
    """The run's TensorBoard event files (rank 0 only), with config.yaml and env.json as
    text at the step the run starts from."""
    texts = {
        "config": code_block((rt.run_dir / "config.yaml").read_text(), "yaml"),
        "env": code_block((rt.run_dir / "env.json").read_text(), "json"),
    }
    return TensorBoardSink(rt.run_dir, start_step=start_step, texts=texts)


def decide_on_main(rt: Runtime, decide):
    """Run `decide()` on rank 0 only and give every rank its result; a ConfigError raised
    there is raised on every rank (rank 0 then prints the one line), anything else ends
    every rank rather than leave the others waiting for a broadcast that never comes."""
    outcome = ("ok", None)
    if rt.is_main:
        try:
            outcome = ("ok", decide())
        except ConfigError as exc:
            outcome = ("bad", str(exc))
        except Exception as exc:
            # recorded first: the others, raising on this, find rank 0 was the first to fail
            first_failure.record(None, first_failure.one_line(exc))
            rt.broadcast_object(("crash", f"{type(exc).__name__} on rank 0: {exc}"))
            raise
    kind, value = rt.broadcast_object(outcome)
    if kind == "bad":
        raise ConfigError(value)
    if kind == "crash":
        raise RuntimeError(value)
    return value


def claim_run_dir(rt: Runtime) -> RunLock | None:
    """Check every entry of the run directory (launcher.runtime.run_dir_check), make it if
    new, take its lock (rank 0 holds it) before writing anything there, and open the
    per-rank logs; an entry in the wrong form, or a directory in use by another launch,
    stops this one with one line, the directory as it was."""
    taken: list[RunLock] = []

    def take() -> None:
        resume.check_run_files(rt.run_dir, rt.world_size)
        rt.run_dir.mkdir(parents=True, exist_ok=True)
        lock = RunLock(rt.run_dir, launch_key())
        try:
            lock.acquire()
        except LockHeld as exc:
            raise ConfigError(str(exc)) from exc
        except OSError as exc:
            if not disk.is_full(exc, rt.run_dir):
                raise
            raise ConfigError(disk.no_space_line("the lock", lock.path, None)) from exc
        taken.append(lock)

    decide_on_main(rt, take)
    open_run_dir(rt)
    return taken[0] if taken else None


def plan_resume(
    cfg: TrainConfig, rt: Runtime, model, tier: MemoryTier | None = None
) -> list[Path] | None:
    """The checkpoints to try, newest first, decided by rank 0 under the lock (see
    launcher.checkpoint.resume); a checkpoint that does not fit these settings stops the launch.
    None when the run is finished (its newest checkpoint is at trainer.max_steps)."""
    now = resume.identity(cfg, model, rt.world_size)
    max_steps = cfg.trainer.max_steps
    # This launch's own memory checkpoint (a restart before the first durable checkpoint)
    continues = bool(tier and cfg.resume == "auto" and tier.newest_common(None, 0))

    def decide() -> list[str] | None:
        decided = resume.plan(cfg.resume, rt.run_dir, now, max_steps, continues)
        if decided.finished_at is not None:
            log.info("%s", resume.finished_line(rt.run_dir, decided.finished_at, max_steps))
            return None
        # A DeepSpeed checkpoint at another world size, stage or engine: converted here.
        return resume.prepare(decided.candidates, now)

    folders = decide_on_main(rt, decide)
    return None if folders is None else [Path(p) for p in folders]


def forecast_of(cfg: TrainConfig, rt: Runtime, vocab_size: int) -> dict | None:
    """The plan's forecast of this run (launcher.plan.forecast.at_start), said in one line:
    summary.json keeps it beside what the run measured. Rank 0's alone, which says and writes
    both: no other rank reads the run directory's earlier figures for it."""
    if not rt.is_main:
        return None
    on_gpu = rt.device.type == "cuda"
    name = torch.cuda.get_device_name(rt.device) if on_gpu else None
    made = plan_forecast.at_start(cfg, rt.world_size, ranks_per_node(), name, vocab_size,
                                  rt.run_dir)  # fmt: skip
    log.info("%s", plan_forecast.line(made))
    return made


def memory_tier(cfg: TrainConfig, rt: Runtime, model) -> MemoryTier | None:
    """This rank's memory tier (launcher.checkpoint.memory), when it is on."""
    every = memory.interval(cfg)
    if not every:
        return None
    if memory.in_shm(cfg):  # the node's /dev/shm must hold it: every rank agrees
        room = shm_available_bytes()
        free = (room[1] if room else 0) + memory.held_bytes(
            cfg.trainer.memory_checkpoint_dir, rt.run_dir
        )
        fits, why = tier_room(cfg, ranks_per_node(), rt.world_size, free)
        verdicts = rt.all_gather_objects(why)
        why = next((w for w in verdicts if w), None)
        if why and cfg.trainer.memory_checkpoint_interval is not None:
            raise ConfigError(why)
        if why:
            if rt.is_main:
                log.warning("%s", why)
            return None
    if rt.is_main:
        log.info("memory tier: every %d steps, in %s", every, cfg.trainer.memory_checkpoint_dir)
    identity = resume.identity(cfg, model, rt.world_size)
    t = cfg.trainer
    return MemoryTier(t.memory_checkpoint_dir, every, rt, identity, t.memory_checkpoint_peer)


def newer_in_memory(cfg: TrainConfig, tier: MemoryTier | None, folders: list[Path]) -> Path | None:
    """This rank's memory checkpoint of the newest step every rank holds, when it is newer
    than the newest durable one (resume=auto only) and of the run's lineage: what a torchrun
    restart resumes from, losing at most trainer.memory_checkpoint_interval steps."""
    if tier is None or cfg.resume != "auto":
        return None
    newest = folders[0] if folders else None
    lineage = (checkpoint.read_meta(newest) or {}).get("lineage") if newest else None
    after = checkpoint.step_of(newest) if newest else 0
    found = tier.newest_common(lineage, after)
    if found is not None and tier.rt.is_main:
        than = f"the durable {newest.name}" if newest else "any durable checkpoint (none yet)"
        log.info("memory tier: step %d is newer than %s; resuming from it",
                 checkpoint.step_of(found), than)  # fmt: skip
    return found


def restore(loop: TrainLoop, rt: Runtime, folders: list[Path]) -> int:
    """Load the newest checkpoint that every rank can read.

    Each rank tries the same checkpoint and all ranks compare notes: one rank's unreadable
    file makes every rank fall back together, with one warning that names the ranks and
    why. A launch that had checkpoints to resume and could load none stops (a fresh start
    would overwrite them).
    """
    failures = []
    for i, folder in enumerate(folders):
        step, bad = try_restore(loop, rt, folder)
        if not bad:
            log.info("resumed from step %d", step)
            return step
        then = "falling back to the previous one" if i + 1 < len(folders) else "none is left"
        (log.warning if rt.is_main else log.info)(
            "checkpoint %s is unreadable (%s); %s", folder, bad, then
        )
        failures.append(f"{folder.name}: {bad}")
    if folders:
        raise ConfigError(
            f"no checkpoint of {folders[0].parent} could be loaded ({' | '.join(failures)}); "
            f"{resume.fresh_start_hint(rt.run_dir)}"
        )
    return 0


def try_restore(loop: TrainLoop, rt: Runtime, folder: Path) -> tuple[int, str]:
    """(step, '') when every rank loaded `folder`, else (0, every rank's problem).

    Two rounds: each rank first checks that the files it will read are whole torch files,
    and only when all are does any rank load (an engine's load may enter collectives,
    where a rank that failed before them would leave the others waiting)."""
    try:
        problem = checkpoint.unreadable(loop.files_to_load(folder))
    except Exception as exc:  # noqa: BLE001 - reported like an unreadable file
        problem = _one_line(exc)
    bad = _agree(rt, problem)
    if bad:
        return 0, bad
    step, problem = 0, None
    try:
        step = loop.restore(folder)
    except Exception as exc:  # noqa: BLE001 - any unreadable file means: try the previous one
        problem = _one_line(exc)
    return step, _agree(rt, problem)


def _agree(rt: Runtime, problem: str | None) -> str:
    """Every rank's problem with a checkpoint, as one text ('' when no rank has one)."""
    return "; ".join(f"rank {r}: {p}" for r, p in enumerate(rt.all_gather_objects(problem)) if p)


def _one_line(exc: Exception, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:limit]


def already_completed(rt: Runtime) -> bool:
    """Whether this run directory holds a completed run (rank 0 decides for all)."""
    done = False
    if rt.is_main:
        try:
            done = json.loads((rt.run_dir / "summary.json").read_text())["status"] == "completed"
        except (OSError, ValueError, KeyError, TypeError):
            done = False  # no summary, or an unreadable one: the point runs (and resumes)
    return rt.broadcast_object(done)


def build_data_and_model(cfg: TrainConfig, rt: Runtime):
    """The token data (prepared once per node) and the model; FLOPs per token for MFU."""
    t = cfg.trainer
    try:
        data = prepare_data(
            cfg.data,
            seq_len=t.seq_len,
            seed=t.seed,
            is_builder=rt.local_rank == 0,
            wait=rt.barrier,
        )
    except (ValueError, FileNotFoundError) as exc:  # worded for the user by launcher.data
        raise ConfigError(str(exc)) from exc
    except Exception as exc:  # tokenizers reports a full disk in a plain Exception
        cache = cache_root(cfg.data.cache_dir)
        if not disk.is_full(exc, cache):
            raise
        raise ConfigError(disk.no_space_line("the data cache", cache, None)) from exc
    log.info("data: %s", data.description)
    model = build_model(
        cfg.model, data.vocab_size, eot_id=data.eot_id, grad_checkpointing=t.grad_checkpointing
    )
    fpt = flops_per_token(model, t.seq_len)
    log.info(
        "model %s: %.2fM parameters, %.3g FLOPs/token",
        cfg.model.name,
        count_params(model) / 1e6,
        fpt,
    )
    return data, model, fpt


def run(cfg: DictConfig, launch: LaunchState, point: str | None = None) -> int:
    """Train once with a composed config that the front door has checked (`check_or_exit`);
    returns the process exit code. The job's components read it as the schema's
    dataclasses (`typed`), converted here once.

    `launch` holds what outlives this job (the process group a sweep's points share).
    `point` names a sweep point: the run goes to `<sweep_id>/<point>/`, and a point a
    requeued sweep already completed is not redone.
    """
    freeze_what_lasts()  # before the job makes anything: its collections then walk its own
    normalize(cfg, env_world()[2])  # Hydra composed this job's config anew
    cfg = typed(cfg)
    needs_group = engine(cfg.strategy.name).needs_process_group
    rt = start(RuntimeConfig.of(cfg), launch, point, needs_group=needs_group)
    if point is not None and cfg.resume == "auto" and already_completed(rt):
        log.info("sweep point %s already completed in %s; not run again", point, rt.run_dir)
        end_job(rt)
        return exit_codes.DONE
    job = Job(cfg, rt, point)
    code, summary = exit_codes.CRASH, {}
    try:
        summary = job.train()
        code = exit_codes.DONE
    except Exception as exc:
        code, summary = job.ending(exc)
        expected = isinstance(exc, checkpoint.CheckpointNotWritten) or job.peer_left
        if code == exit_codes.CRASH and not expected:
            raise
    finally:
        job.close(summary, code)
    if job.peer_left:  # the process group is broken: no later sweep point can use it
        raise SystemExit(code)
    return code


# How a job that raised ends: exit code, summary.json's status, and which ranks say why
# ("main": rank 0, as every rank stops for the same reason; "own": each rank that raised).
ENDINGS: dict[type, tuple[int, str, str | None]] = {
    Stopped: (exit_codes.STOPPED, "stopped", None),
    NonFiniteLoss: (exit_codes.NONFINITE, "failed: non-finite loss", "main"),
    OutOfMemory: (exit_codes.OOM, "failed: out of memory", "own"),
}


class Job:
    """One training job's parts, built in order, and torn down whatever happened."""

    def __init__(self, cfg: TrainConfig, rt: Runtime, point: str | None):
        self.cfg, self.rt, self.point = cfg, rt, point
        self.sinks = transport_recorders(rt)  # before rank 0's sinks: env.json, then metrics
        self.lock: RunLock | None = None
        self.strategy = self.loop = None
        self.gate: dict | None = None  # the burn-in gate's report, when it ran
        self.forecast: dict | None = None  # launcher.plan's, printed at the start
        self.watchdog: HangWatchdog | None = None
        # Whether this launch decided to train here (the resume decision): only then is
        # the run directory's summary.json its own to replace. A failure before (a crash
        # in start-up, a refusal) leaves a finished run's summary.json as it was.
        self.owns_history = False
        self.started = time.time()  # a fault marker since then is this launch's
        self.peer_left = False  # a peer left on purpose (fault.kind=exit): say so, no traceback

    def train(self) -> dict:
        """Claim the run directory, build, resume, run the loop; the end-of-run summary."""
        cfg, rt = self.cfg, self.rt
        self.lock = claim_run_dir(rt)  # nothing in the run directory is written before this
        first_failure.watch(rt.run_dir, rt.rank)
        self.watchdog = HangWatchdog(  # start-up, then the loop's phases (on_hang: the loop's)
            cfg.watchdog,
            rank=rt.rank,
            run_dir=rt.run_dir,
            start_step=0,
            on_hang=self._hang_in_start_up,
            async_writes=cfg.trainer.async_checkpoint,
        )
        slow_phase(cfg.fault, "start-up")
        self.gate = burnin.gate(cfg.burnin, cfg.fault, rt)  # a bad node costs seconds, no more
        data, model, fpt = build_data_and_model(cfg, rt)
        self.forecast = forecast_of(cfg, rt, data.vocab_size)
        tier = memory_tier(cfg, rt, model)
        folders = plan_resume(cfg, rt, model, tier)
        if folders is None:
            return {}  # finished already: nothing is trained, summary.json stays as it is
        self.owns_history = True
        self.strategy = build_strategy(cfg.strategy, cfg.trainer, rt, model)
        self.loop = TrainLoop(
            LoopConfig.of(cfg),
            rt,
            self.strategy,
            loader_opener(cfg, rt, data),
            data.val,
            self.sinks,
            fpt,
            peak_flops(rt.device),
            ckpt_meta=resume.identity(cfg, model, rt.world_size),
            memory=tier,
        )
        newer = newer_in_memory(cfg, tier, folders)
        start_step = restore(self.loop, rt, [newer, *folders] if newer else folders)
        if tier is not None:
            tier.keep_only(newer if newer and start_step == checkpoint.step_of(newer) else None)
        if rt.is_main and data.save_tokenizer is not None:  # for launcher.generate and export
            data.save_tokenizer(rt.run_dir / TOKENIZER_DIR)  # once the run is this launch's
        self.sinks += open_rank0_sinks(cfg, rt, self.point, start_step, self.gate)
        summary = self.loop.run(start_step, self.watchdog)
        if self.gate is not None:
            summary["burnin/seconds"] = self.gate["seconds"]
        return summary

    def ending(self, exc: Exception) -> tuple[int, dict]:
        """The exit code and summary of a job that raised `exc` (CRASH: re-raise it)."""
        rt = self.rt
        if isinstance(exc, ConfigError):  # every rank found it; rank 0 prints the one line
            (log.error if rt.is_main else log.info)("error: %s", exc)
            return exit_codes.BAD_INPUT, {}
        if isinstance(exc, burnin.BadNode):  # every rank raised it, before any step
            (log.error if rt.is_main else log.info)("%s", exc)
            refused = {"status": "refused: bad node", "run_id": rt.run_id}
            return exit_codes.BAD_NODE, {**refused, "burnin/seconds": exc.seconds}
        if isinstance(exc, checkpoint.CheckpointNotWritten):  # every rank raised it together
            (log.error if rt.is_main else log.info)("error: %s", exc)
            if exc.disk_full:  # a retry fails the same way until someone frees space
                return exit_codes.BAD_INPUT, self.loop.summary("failed: disk full", exc.step)
            return exit_codes.CRASH, self.loop.summary(f"failed: {exc}", exc.step)
        for kind, (code, status, who) in ENDINGS.items():
            if isinstance(exc, kind):
                if who == "own":
                    log.error("error: %s", exc)
                elif who == "main":
                    (log.error if rt.is_main else log.info)("%s", exc)
                return code, self.loop.summary(status, exc.step)
        # A peer that left on purpose (fault.kind=exit) broke the process group: no later
        # sweep point can use it. What the job says is the first failure's (_crashed).
        self.peer_left = peer_left(rt.run_dir, rt.rank, self.started) is not None
        return exit_codes.CRASH, self._crashed(exc)

    def _crashed(self, exc: Exception) -> dict:
        """summary.json of a crash: the first failing rank of the job, its step and line
        (launcher.resilience.first_failure), said once; the loop's figures so far."""
        done = self.watchdog.step if self.watchdog is not None else None
        failing = done + 1 if self.loop is not None and done is not None else None
        failed = first_failure.settle(exc, failing, self.rt.is_main)
        with contextlib.suppress(AttributeError):  # an exception type without a __dict__
            exc.launcher_settled = True  # the front door logs no traceback on the terminal
        ran = getattr(self.loop, "start_time", None) is not None  # the loop had started
        figures = self.loop.summary(failed["status"], done) if ran else {}
        return {**figures, **failed, "run_id": self.rt.run_id}

    def _hang_in_start_up(self, step: int) -> None:
        """Before the loop takes the watchdog over: rank 0's summary.json says so, as the
        loop's does for a hang in a later phase."""
        if self.rt.is_main and self.may_write_summary():
            status = {"status": "failed: hang detected", "run_id": self.rt.run_id}
            write_summary_if_room(self.rt.run_dir, status)

    def may_write_summary(self) -> bool:
        """summary.json is this launch's to write once it decided to train here, or when
        there is none yet (a fresh directory's failure at start-up is recorded)."""
        summary = self.rt.run_dir / "summary.json"
        return self.owns_history or not (summary.exists() or summary.is_symlink())

    def close(self, summary: dict, code: int) -> None:
        """Close the sinks (with the summary), write summary.json, drop the engine, release
        the lock, end the job's logging; the process group stays for the next job."""
        rt = self.rt
        try:
            if self.watchdog is not None:
                self.watchdog.close()  # the loop has, unless the job ended before it
            if summary:  # the plan's forecast beside what the run measured, in every sink
                summary = {**summary, "exit_code": code, "forecast": self.forecast}
            images = write_report(rt.run_dir, summary) if rt.is_main and summary else {}
            for sink in self.sinks:
                sink.log_images(images)
                sink.close(summary)
            if rt.is_main and summary and self.may_write_summary():
                write_summary_if_room(rt.run_dir, summary)
            if self.strategy is not None:
                self.strategy.close()
            self.strategy = self.loop = None
            log.info("run %s ended with code %d", rt.run_id, code, extra=first_failure.FILE_ONLY)
        finally:
            first_failure.forget()
            if self.lock is not None:
                self.lock.release()
            if self.watchdog is not None:  # it holds the loop (on_hang), the loop the model
                self.watchdog.retire()
                self.watchdog = None
            end_job(rt)


def write_summary_if_room(run_dir: Path, summary: dict) -> None:
    """summary.json; on a full disk one line instead (the old one, if any, stays whole)."""
    try:
        write_summary(run_dir, summary)
    except OSError as exc:
        if not disk.is_full(exc, run_dir):
            raise
        log.warning("%s", disk.no_space_line("summary.json", run_dir / "summary.json", 0))


def loader_opener(cfg: TrainConfig, rt: Runtime, data: TokenData):
    """This rank's training loader with the run's data settings, opened by the loop with its
    batch plan (its micro-batch may change in-process: trainer.on_oom=retry) at the step it
    starts from (see launcher.data.build_train_loader)."""
    d = cfg.data
    return functools.partial(
        build_train_loader,
        data.train,
        rank=rt.rank,
        seed=cfg.trainer.seed,
        num_workers=d.num_workers,
        pin_memory=d.pin_memory and rt.device.type == "cuda",
        persistent_workers=d.persistent_workers,
        prefetch_factor=d.prefetch_factor,
    )


def open_rank0_sinks(
    cfg: TrainConfig, rt: Runtime, point: str | None, start_step: int, gate: dict | None
) -> list:
    """`rank0_sinks` on rank 0 (none elsewhere); a full disk stops every rank, one line."""
    opened: list = []

    def open_them() -> None:
        try:
            opened.extend(rank0_sinks(cfg, rt, point, start_step, gate))
        except OSError as exc:
            if not disk.is_full(exc, rt.run_dir):
                raise
            raise ConfigError(disk.no_space_line("the run's files", rt.run_dir, None)) from exc

    decide_on_main(rt, open_them)
    return opened


def rank0_sinks(
    cfg: TrainConfig, rt: Runtime, point: str | None, start_step: int, gate: dict | None = None
) -> list:
    """Rank 0's run files and sinks: config.yaml and env.json, metrics.jsonl, the console,
    and W&B and TensorBoard when enabled."""
    write_run_files(cfg, rt, start_step, gate)
    # a sweep's or tuning run's points: its folder, not the point of the moment
    point_latest(Path(cfg.run.root).expanduser(), rt.run_id.split("/")[0])
    sinks = [
        JsonlSink(rt.run_dir / "metrics.jsonl", start_step),
        RankFileSink(rt.run_dir / RANKS, start_step),
        ConsoleSink(
            cfg.trainer.max_steps,
            start_step,
            run_dir=rt.run_dir,
            world_size=rt.world_size,
            brief=point is not None,
            quiet=rt.launch.quiet_progress,
        ),
    ]
    if wandb_enabled(cfg.logger):
        sinks.append(wandb_sink(cfg, rt, point))
    if tensorboard_enabled(cfg.logger):
        sinks.append(tensorboard_sink(rt, start_step))
    return sinks
