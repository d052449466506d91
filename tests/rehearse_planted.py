"""`python [-m launcher.torchrun ...] tests/rehearse_planted.py [overrides]`:
launcher.rehearse with one defect planted in each case's own launches (never in the
uninterrupted run they compare with), so that each row is shown to fail when its path is
broken. The rest is the real rehearsal:

- stop: rank 1 exits (fault.kind=exit, code 7) at the step the stop would checkpoint;
- killed_rank: resume=never, so the restarted ranks refuse the run's own checkpoints;
- hung_rank: watchdog.enabled=false, so nothing detects the stall;
- world_size: another learning rate on the half-size resume: the losses drift;
- slow_rank: watchdog.straggler_intervals=0 (never name a straggler);
- bad_input: the "misspelt" key is a valid one, so the launch trains instead of refusing.
"""

from __future__ import annotations

from launcher.rehearse import cases
from launcher.rehearse.__main__ import main
from launcher.rehearse.rehearsal import Rehearsal

PLANTED = {
    "stop": ["fault.kind=exit", "fault.rank=1", f"fault.step={cases.STOP_AFTER + 1}",
             "fault.exit_code=7"],
    "killed_rank": ["resume=never"],
    "hung_rank": ["watchdog.enabled=false"],
    "world_size": ["trainer.lr=0.002"],
    "slow_rank": ["watchdog.straggler_intervals=0"],
}  # fmt: skip
VALID_OVERRIDE = "trainer.max_steps=3"
launch = Rehearsal.launch


def planted_launch(self, case, leg="", extra=(), **kwargs):
    return launch(self, case, leg, [*extra, *PLANTED.get(case, [])], **kwargs)


if __name__ == "__main__":
    Rehearsal.launch = planted_launch
    cases.BAD_OVERRIDE = VALID_OVERRIDE
    main()
