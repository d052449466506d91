"""What a run reports, assembled in one place: each log interval's record (metrics.jsonl,
W&B, TensorBoard, the console: the same names everywhere) and the end-of-run summary
(summary.json), with the counts the loop's policies keep (bad steps dropped, rewinds,
out-of-memory retries). A new metric is added here and in launcher.observe.metrics."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import numpy as np

from launcher.config.batch import AUTO
from launcher.config.schema import TrainerConfig
from launcher.observe.metrics import KIND_STEMS, KIND_SUFFIXES, Aggregate, aggregate
from launcher.observe.sinks import Sink
from launcher.resilience.bad_steps import BadSteps
from launcher.runtime.launch_clock import process_started, wall_seconds
from launcher.runtime.process import Runtime

log = logging.getLogger("launcher")

# Communication figures summary.json holds (medians over the steady intervals).
SUMMARY_COMM_KEYS = (
    "comm/allreduce_s",
    "comm/exposed_s",
    "comm/bytes",
    "comm/busbw_gbps",
    "comm/overhead_frac",
    *(stem + suffix for stem in KIND_STEMS.values() for suffix in KIND_SUFFIXES),
)


class Recorder:
    """The run's records so far, the sinks they go to, and the counts the summary holds."""

    def __init__(
        self,
        rt: Runtime,
        trainer: TrainerConfig,
        sinks: list[Sink],
        tokens_per_step: int,
        flops_per_token: float,
        mfu: Callable[[float], float | None],  # the job's MFU at a rate of tokens/s
        micro_batch: int,
    ):
        self.rt, self.t, self.sinks = rt, trainer, sinks
        self.tokens_per_step = tokens_per_step
        self.flops_per_token, self.mfu = flops_per_token, mfu
        self.records: list[dict] = []
        self.start_time: float | None = None  # set when the steps begin
        self.start_step = 0
        self.bad_steps = BadSteps(trainer.max_bad_steps, trainer.bad_step_window)
        self.rewinds = 0  # trainer.on_nonfinite=rewind's restores
        self.oom_retries = 0  # steps redone at a smaller micro-batch (trainer.on_oom=retry)
        self.micro_batch = micro_batch  # what runs (micro_batch_size=auto, retry)
        self.replicas_in_sync: bool | None = None
        self.startup_s: float | None = None

    def begin(self, start_step: int) -> None:
        self.start_time = time.perf_counter()
        self.start_step = start_step
        # from this process's start to its first step: what a restart costs to train again
        started = process_started()
        self.startup_s = time.time() - started if started is not None else None

    def merge(self, step: int, figures: dict) -> Aggregate:
        """Every rank's interval figures merged (the same on every rank). Rank 0 merges
        every rank's samples and logs the per-rank figures (ranks.jsonl); the others need
        only the merged figures (the non-finite verdict, the straggler's streak)."""
        per_rank = self.rt.gather_objects(figures)
        merged = aggregate(per_rank, self.rt.world_size) if per_rank is not None else None
        if merged is not None:
            for sink in self.sinks:
                sink.log_ranks(step, merged.per_rank)
            merged = dataclasses.replace(merged, per_rank={})
        return self.rt.broadcast_object(merged)

    def interval(
        self, step: int, lr: float, agg: Aggregate, steps: int, stragglers: dict, buckets
    ) -> dict:
        """The record of the log interval of `steps` steps that ends at `step`."""
        tokens_per_s = self.tokens_per_step * steps / agg.slowest_interval_s
        return {
            "step": step,
            "loss": agg.loss,
            "lr": lr,
            "tokens": step * self.tokens_per_step,
            "tokens_per_s": tokens_per_s,
            "mfu": self.mfu(tokens_per_s),
            **agg.figures,
            **stragglers,
            "comm/buckets": buckets,
            **self.bad_step_counts(),
            **self.micro_batch_figures(),
            "elapsed_s": time.perf_counter() - self.start_time,
            "eta_s": (self.t.max_steps - step) * agg.step_time_p50,
        }

    def log(self, record: dict) -> None:
        self.records.append(record)
        for sink in self.sinks:
            sink.log(record)

    def compare_replicas(self, mine: list[float] | None) -> None:
        """`replicas_in_sync`: whether every rank ended with bit-identical parameters (a DDP
        invariant that a broken comm hook or a rank-local update would violate); None where
        the engine keeps no replicas (`mine`: this rank's fingerprint)."""
        if mine is None:
            return
        agree = all(theirs == mine for theirs in self.rt.all_gather_floats(mine))
        if not agree:
            log.error("model replicas differ across ranks at the end of training")
        self.replicas_in_sync = agree

    def bad_step_counts(self) -> dict:
        """`bad_steps/skipped` (and `bad_steps/rewinds`) unless on_nonfinite=stop."""
        policy = self.t.on_nonfinite
        if policy == "stop":
            return {}
        counts = {"bad_steps/skipped": self.bad_steps.skipped}
        if policy == "rewind":
            counts["bad_steps/rewinds"] = self.rewinds
        return counts

    def micro_batch_figures(self) -> dict:
        """`micro_batch` and `oom/retries` where the micro-batch can change in-process."""
        if self.t.on_oom != "retry" and self.t.micro_batch_size != AUTO:
            return {}
        return {"micro_batch": self.micro_batch, "oom/retries": self.oom_retries}

    def summary(self, status: str, step: int) -> dict:
        """End-of-run figures: medians over logged intervals (the first one, which holds
        start-up and compilation, is left out when there are others)."""
        logged = [r for r in self.records if "loss" in r]
        steady = logged[1:] if len(logged) > 1 else logged
        evals = [r for r in self.records if "eval/loss" in r]

        def median(key):
            values = [r[key] for r in steady if r.get(key) is not None]
            return float(np.median(values)) if values else None

        return {
            "status": status,
            "run_id": self.rt.run_id,
            "world_size": self.rt.world_size,
            "steps": step,
            "resumed_from_step": self.start_step or None,
            "tokens": step * self.tokens_per_step,
            "loss": logged[-1]["loss"] if logged else None,
            "eval/loss": evals[-1]["eval/loss"] if evals else None,
            "eval/ppl": evals[-1]["eval/ppl"] if evals else None,
            "tokens_per_s": median("tokens_per_s"),
            "mfu": median("mfu"),
            "step_time_s/p50": median("step_time_s/p50"),
            "step_time_s/p90": median("step_time_s/p90"),
            "step_time_s/max": max((r["step_time_s/max"] for r in steady), default=None),
            "data_wait_s": median("data_wait_s"),
            **{key: median(key) for key in SUMMARY_COMM_KEYS},
            "mem/peak_gb": max(
                (r["mem/peak_gb"] for r in steady if r["mem/peak_gb"]), default=None
            ),
            "mem/host_peak_gb": max((r["mem/host_peak_gb"] for r in steady), default=None),
            "comm/buckets": logged[-1]["comm/buckets"] if logged else None,
            "replicas_in_sync": self.replicas_in_sync,
            **self.bad_step_counts(),
            **self.micro_batch_figures(),
            "flops_per_token": self.flops_per_token,
            "wall_time_s": wall_seconds(self.rt.launch.job_started),  # from the launch
            "startup_s": self.startup_s,
        }
