"""The runtime's collectives on a real one-rank gloo group: what every rank receives.

What grows with the number of ranks must not reach every rank each interval
(docs/scale.md): `gather_objects` reaches rank 0 alone. One rank cannot show the traffic; it
shows the answers each path gives.
"""

from __future__ import annotations

import torch

from launcher.runtime.process import Runtime


def one_rank(group) -> Runtime:
    return Runtime(0, 0, 1, torch.device("cpu"), "gloo", control_group=group)


def test_gather_objects_hands_rank_0_every_ranks_object(gloo_world):
    rt = one_rank(gloo_world)
    assert rt.gather_objects({"loss": [1.5, 2.5]}) == [{"loss": [1.5, 2.5]}]


def test_without_a_process_group_it_answers_for_this_process():
    rt = Runtime(0, 0, 1, torch.device("cpu"), None)
    assert rt.gather_objects(3) == [3]
