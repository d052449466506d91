"""How often torchrun's agents look at the rendezvous while they wait for the other nodes.

torchrun's dynamic rendezvous (c10d, etcd-v2) reads its shared state, then sleeps a fixed
second before it reads again, for as long as the round it joined is not complete; and a
read within a second of the last one is served from the agent's own copy (its state
holder's cache). Every restart goes through it, a step at a time (the old round emptied,
each agent joined, the round complete), and each step reached the other agents up to a
second late: on 4 nodes x 4 of this 2-core machine the agents' round completed 2.1-2.3 s
after the last of them began its rendezvous, one state change a second (torch 2.13,
measured from its state reads). The healthy agents' check for a node waiting to join reads
through the same cache.

The front door (launcher.torchrun) sleeps and caches for nodes / SYNCS_PER_S seconds
instead, no less than FLOOR_S and no more than torch's own second: the store then answers at
most SYNCS_PER_S reads a second, what torch's poll asks of it at that many nodes, and a job
of SYNCS_PER_S nodes or more polls as torch does. The random skew torch puts before a first
join is kept. Where torch has no such sleep or cache to set (another version), its own
stays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.distributed.elastic.rendezvous import dynamic_rendezvous

TORCH_POLL_S = 1  # the sleep torch's rendezvous asks for between two reads of its state
SYNCS_PER_S = 400  # the store reads a second torch's own poll makes at 400 nodes
FLOOR_S = 0.1


def poll_s(nodes: int) -> float:
    """Seconds between two reads of the rendezvous' state for a job of `nodes` nodes."""
    return min(float(TORCH_POLL_S), max(FLOOR_S, nodes / SYNCS_PER_S))


@contextlib.contextmanager
def polled_every(every: float) -> Iterator[bool]:
    """torchrun's rendezvous polls every `every` seconds inside; yields whether it could be
    set (False: this torch has no such sleep, and its own poll stays)."""
    torch_delay = getattr(dynamic_rendezvous, "_delay", None)
    if torch_delay is None:
        yield False
        return

    def delay(seconds):  # torch calls it with seconds=1, or a (low, high) random range
        torch_delay(every if seconds == TORCH_POLL_S else seconds)

    dynamic_rendezvous._delay = delay
    try:
        yield True
    finally:
        dynamic_rendezvous._delay = torch_delay


def cache_for(handler, every: float) -> None:
    """`handler`'s copy of the rendezvous' state is read again after `every` seconds
    (torch's: 1 s); nothing for a handler without one (not the dynamic rendezvous)."""
    holder = getattr(handler, "_state_holder", None)
    if hasattr(holder, "_cache_duration"):
        holder._cache_duration = every
