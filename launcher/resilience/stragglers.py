"""Name a straggler while the job runs, from figures every rank already has.

`metrics.aggregate` finds, at each log interval, the rank whose compute time (step time
minus data wait minus exposed communication) is highest and how far it is above the
median of the others. One slow interval is noise; the same rank above
`watchdog.straggler_frac` for `watchdog.straggler_intervals` intervals in a row is a
straggler, named in the record (`straggler/rank`, `straggler/excess_frac`) every interval
it stays one, and on the console once per rank and run: on a busy shared host a rank that
flaps in and out of a streak is one warning, not one per episode (a tune's trials print
their lines to their own logs). No extra synchronisation: the figures come from the metrics gather
that happens anyway.

A straggler that stays the slowest for `exclude.straggler_intervals` intervals in a row is a
host to keep off the run's next attempts: rank 0 records it in bad_hosts with the figure
(launcher.resilience.bad_hosts; exclude.straggler), once per host and run.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from launcher.resilience import bad_hosts

log = logging.getLogger("launcher")


class StragglerWatch:
    def __init__(self, cfg: DictConfig, *, announce: bool):
        self.announce = announce  # one rank says it on the console
        self.frac = cfg.straggler_frac
        self.needed = cfg.straggler_intervals
        self._rank: int | None = None
        self._streak = 0
        self._announced: set[int] = set()  # ranks named on the console in this run already
        self._persistent = 0  # intervals in a row that make a straggler's host a bad one
        self._hosts: list[str] = []
        self._run_dir: Path | None = None

    def keep_off(self, intervals: int, hosts: list[str] | None, run_dir: Path) -> None:
        """Record the host of a straggler that lasts `intervals` intervals in bad_hosts
        (`hosts`: each rank's, on the rank that announces; None elsewhere)."""
        if self.announce and hosts:
            self._persistent, self._hosts, self._run_dir = intervals, hosts, run_dir

    def update(self, figures: dict) -> dict:
        """The straggler fields for this interval's record (None when there is none)."""
        rank, excess = figures["compute_s/slowest_rank"], figures["compute_s/excess_frac"]
        if excess <= self.frac or self.needed == 0:
            self._rank, self._streak = None, 0
            return {"straggler/rank": None, "straggler/excess_frac": None}
        self._streak = self._streak + 1 if rank == self._rank else 1
        self._rank = rank
        if self._streak < self.needed:
            return {"straggler/rank": None, "straggler/excess_frac": None}
        if self._streak == self.needed and self.announce and rank not in self._announced:
            self._announced.add(rank)
            log.warning(
                "straggler: rank %d computes %.0f%% longer per step than the median of the "
                "other ranks, for %d log intervals in a row; the others wait for it in every "
                "collective (check that host: clocks, thermals, other jobs; docs/faults.md); "
                "said once: metrics.jsonl's straggler/rank names it while it lasts",
                rank,
                100 * excess,
                self._streak,
            )
        if self._persistent and self._streak == max(self._persistent, self.needed):
            self._record(rank, excess)
        return {"straggler/rank": rank, "straggler/excess_frac": excess}

    def _record(self, rank: int, excess: float) -> None:
        host = self._hosts[rank]
        if host in bad_hosts.read(self._run_dir):
            return
        why = (f"straggler: rank {rank} computed {100 * excess:.0f}% longer per step than the "
               f"other ranks' median for {self._streak} log intervals in a row")  # fmt: skip
        bad_hosts.record(self._run_dir, {host: why})
        log.warning("straggler: rank %d's host %s goes to bad_hosts, kept off the run's next "
                    "attempts (exclude.straggler=false keeps it)", rank, host)  # fmt: skip
