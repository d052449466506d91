"""The front door (`python -m launcher.torchrun`) has torchrun forward every signal a
scheduler or a person sends, each named case to its expected end."""

from __future__ import annotations

import pytest

from launcher import torchrun
from launcher.resilience import preemption


@pytest.mark.parametrize(
    ("named", "expected"),
    [
        (None, "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"),
        ("SIGTERM", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"),
        ("SIGUSR2, SIGXCPU,", "SIGUSR2,SIGXCPU,SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"),
    ],
)
def test_the_front_door_has_torchrun_forward_every_signal(named, expected):
    """Slurm's warnings (USR1/USR2) join torchrun's forwarded signals, and any the user
    named stay (see test_front_door_signals.py for what each does to a launch)."""
    environ = {} if named is None else {torchrun.SIGNALS_ENV: named}
    torchrun.forward_every_signal(environ)
    assert environ[torchrun.SIGNALS_ENV] == expected
    assert {s.name for s in preemption.STOP_SIGNALS} == set(torchrun.FORWARDED) - {"SIGQUIT"}
