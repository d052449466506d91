"""The tuning rounds: profile the incumbent, read the analyser's evidence, time the
candidates it points at against the incumbent, keep the best real gain in tokens/s
(launcher.tune.decision), repeat.

Knobs interact (bucket size and compilation, workers and micro-batch), so every round
measures its candidates against the incumbent as it is now, not against the starting
point; the incumbent is re-timed in every round, interleaved with the candidates, so that
drift of the machine over the round affects both alike. The rounds end when the evidence
points at nothing, nothing beats the incumbent's tokens/s beyond the noise, `tune.max_rounds`
or `tune.budget_s` is reached, or a stop is requested; then, if anything was kept, the
baseline and the winner run once more for `tune.confirm_steps`, and that comparison is
the headline.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from omegaconf import DictConfig

from launcher.analyze.report import analyze, write
from launcher.analyze.trace import TraceError
from launcher.plan.measured import RunRecord, read_run
from launcher.runtime import placement
from launcher.runtime import process as runtime
from launcher.tune.candidates import Candidate, propose
from launcher.tune.decision import Measured, Trial, Verdict, best, judge
from launcher.tune.trials import TRIALS, TUNE_LOGGER, Trials

# the analyser's advice, whether the trial ran on a GPU, why there is none, the plan's figures
Evidence = tuple[list[dict], bool, str | None, RunRecord | None]
log = logging.getLogger(TUNE_LOGGER)

INCUMBENT = "incumbent"


def slug(name: str) -> str:
    return name.replace("/", "_").replace(",", "+")


class Tuner:
    """The state of one tuning launch: the changes kept so far and the rounds' records."""

    def __init__(self, cfg: DictConfig, user_overrides: list[str]):
        self.tune = cfg.tune
        self.trials = Trials(user_overrides, cfg.tune.budget_s)
        self.kept: dict[str, Any] = {}
        self.rounds: list[dict] = []
        self.baseline_tokens_per_s: float | None = None
        self.ended_because = ""
        self.confirmation: dict | None = None

    @property
    def warmup(self) -> int:
        return self.tune.warmup_steps

    @property
    def stopped(self) -> bool:
        return self.trials.stopped

    def run(self) -> None:
        for n in range(1, self.tune.max_rounds + 1):
            if not self.round(n) or self.stopped:
                self.ended_because = self.ended_because or "stopped on request"
                break
        else:
            self.ended_because = f"tune.max_rounds={self.tune.max_rounds} reached"
        if self.kept and not self.stopped:
            self.confirm()

    def _time_left(self, estimate_s: float) -> bool:
        return self.trials.elapsed_s + estimate_s <= self.tune.budget_s

    def round(self, n: int) -> bool:
        """One round; True when a change was kept (worth another round)."""
        steps = self.tune.trial_steps
        self.trials.plan(f"round {n} profile", 1)
        profile = self.trials.run(f"r{n}-profile", self.kept, steps, self.warmup, profile=True)
        record: dict = {"round": n, "incumbent_changes": dict(self.kept), "profile": profile.label}
        self.rounds.append(record)
        if self.stopped or not profile.ok:
            self.ended_because = (
                "stopped on request"
                if self.stopped
                else (f"the profiled run of the incumbent failed ({profile.status})")
            )
            return False
        advice, gpu, problem, figures = self.evidence(profile.label)
        record["evidence"] = advice
        if problem:
            record["evidence_error"] = problem
        cands = propose(advice, self.trials.last_cfg, placement.env_world()[2], gpu, figures)
        record["candidates"] = [
            {
                "name": c.name,
                "changes": c.changes,
                "evidence": c.evidence,
                "changes_math": c.changes_math,
                "predicted_exposed_s": c.predicted_exposed_s,
            }
            for c in cands
        ]
        if not cands:
            self.baseline_tokens_per_s = self.baseline_tokens_per_s or profile.tokens_per_s
            self._close(record, profile)
            self.ended_because = (
                "nothing to fix: the evidence points at no knob"
                if not advice
                else "the evidence points at no knob the tuner can turn"
            )
            return False
        measured = self.measure(n, cands)
        record["incumbent"] = measured[INCUMBENT].figures()
        self.baseline_tokens_per_s = self.baseline_tokens_per_s or measured[INCUMBENT].median()
        verdicts = {
            c.name: judge(
                measured[INCUMBENT],
                measured[c.name],
                changes_math=c.changes_math,
                loss_tolerance=self.tune.loss_tolerance,
                min_gain=self.tune.min_gain,
                noise_multiple=self.tune.noise_multiple,
            )
            for c in cands
            if measured[c.name].trials
        }
        winner = best(verdicts) if not self.stopped else None
        for entry, cand in zip(record["candidates"], cands, strict=True):
            entry.update(measured[cand.name].figures())
            verdict = verdicts.get(cand.name, Verdict(False, "not run: the budget ran out"))
            entry["verdict"] = (
                "kept"
                if cand.name == winner
                else ("better, not the best" if verdict.better else "rejected")
            )
            entry["reason"] = verdict.reason
        if winner:
            cand = next(c for c in cands if c.name == winner)
            self.kept.update(cand.changes)
            record["kept"] = winner
            self._close(record, measured[winner])
            log.info("tune round %d: kept %s (%s)", n, winner, verdicts[winner].reason)
            if not self._time_left(0.0):
                self.ended_because = f"tune.budget_s={self.tune.budget_s:g} spent"
            return not self.ended_because
        self._close(record, measured[INCUMBENT])
        self.ended_because = self.ended_because or (
            "stopped on request"
            if self.stopped
            else "no candidate beat the incumbent's tokens/s beyond the noise of the repeats"
        )
        return False

    def _close(self, record: dict, after: Measured | Trial) -> None:
        """The round's outcome: the incumbent of the next round, its tokens/s and step time,
        and the gain in tokens/s since the first round."""
        if isinstance(after, Trial):
            rate, step = after.tokens_per_s, after.p50_s
        else:
            rate, step = after.median(), after.median("p50_s")
        record.setdefault("kept", None)
        record["tokens_per_s"] = rate
        record["step_time_p50_s"] = step
        base = self.baseline_tokens_per_s
        record["cumulative_speedup"] = rate / base if base and rate else None

    def evidence(self, label: str) -> Evidence:
        """The analyser's advice for the profiled trial and the figures the plan reads from
        it (rank 0 analyses, all get it)."""
        rt = runtime.launch_runtime(self.trials.launch)
        found: tuple[list[dict], bool, str | None, RunRecord | None] = (
            [],
            False,
            None,
            None,
        )
        if rt.is_main:
            run_dir = self.trials.run_dir / TRIALS / label
            try:
                report = analyze(run_dir)
                write(run_dir, report)
            except (OSError, TraceError) as exc:
                found = ([], False, f"{type(exc).__name__}: {exc}", None)
            else:
                found = (report["advice"], report["device"] == "gpu", None, _figures(run_dir))
        return rt.broadcast_object(found)

    def measure(self, n: int, cands: list[Candidate]) -> dict[str, Measured]:
        """`tune.repeats` timed trials of the incumbent and of each candidate, interleaved,
        while the budget lasts (a trial is started only if one more fits). A candidate
        whose trial failed, crashed or was refused is not tried again: it is rejected."""
        measured = {INCUMBENT: Measured(), **{c.name: Measured() for c in cands}}
        plan = [(INCUMBENT, dict(self.kept))] + [
            (c.name, {**self.kept, **c.changes}) for c in cands
        ]
        estimate = 0.0
        self.trials.plan(f"round {n}", self.tune.repeats * len(plan))
        for rep in range(1, self.tune.repeats + 1):
            for name, changes in plan:
                if self.stopped:
                    return measured
                if name != INCUMBENT and measured[name].failure:
                    continue
                if not self._time_left(estimate):
                    self.ended_because = f"tune.budget_s={self.tune.budget_s:g} spent"
                    return measured
                trial: Trial = self.trials.run(
                    f"r{n}-{slug(name)}-{rep}", changes, self.tune.trial_steps, self.warmup
                )
                estimate = max(estimate, trial.wall_s)
                measured[name].trials.append(trial)
        return measured

    def confirm(self) -> None:
        """The baseline and the winner, each once, `tune.confirm_steps` long; the headline is
        the ratio of their tokens/s (their step times beside it)."""
        steps = self.tune.confirm_steps
        self.trials.plan("confirmation", 2)
        base = self.trials.run("confirm-baseline", {}, steps, self.warmup)
        win = self.trials.run("confirm-winner", self.kept, steps, self.warmup)
        self.confirmation = {
            "steps": steps,
            "baseline": asdict(base),
            "winner": asdict(win),
            "speedup": win.tokens_per_s / base.tokens_per_s if base.ok and win.ok else None,
            "step_time_ratio": (
                base.p50_s / win.p50_s if base.ok and win.ok and win.p50_s else None
            ),
        }


def _figures(run_dir) -> RunRecord | None:
    """What the profiled trial measured, as the plan reads a run (None where its summary
    cannot be read: the tuner then proposes no bucket size)."""
    try:
        return read_run(run_dir)
    except ValueError:
        return None
