"""The front door's rendezvous poll (launcher.runtime.rendezvous_poll): torch's one-second
sleep between two reads of the rendezvous' state, shortened by the job's size, and put
back after."""

from __future__ import annotations

import time

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from launcher.runtime import rendezvous_poll


@pytest.mark.parametrize(
    ("nodes", "seconds"),
    [(1, 0.1), (4, 0.1), (40, 0.1), (80, 0.2), (200, 0.5), (400, 1.0), (2000, 1.0)],
)
def test_the_poll_grows_with_the_nodes_up_to_torchs_second(nodes, seconds):
    assert rendezvous_poll.poll_s(nodes) == pytest.approx(seconds)


def test_torchs_one_second_poll_is_the_one_replaced_and_put_back():
    torch_delay = dynamic_rendezvous._delay  # this torch has the sleep it replaces
    with rendezvous_poll.polled_every(0.05) as replaced:
        assert replaced
        began = time.monotonic()
        dynamic_rendezvous._delay(seconds=1)  # as torch's op executor calls it
        assert time.monotonic() - began < 0.5
        began = time.monotonic()
        dynamic_rendezvous._delay(seconds=(0.2, 0.2))  # the skew before a first join stays
        assert time.monotonic() - began >= 0.2
    assert dynamic_rendezvous._delay is torch_delay
