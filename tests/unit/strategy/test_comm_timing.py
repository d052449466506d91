"""DDP's per-bucket communication timing: the union of bucket intervals and the part of it
not hidden behind compute, on fabricated timestamps."""

from __future__ import annotations

from launcher.observe.comm_stats import step_figures
from launcher.observe.intervals import overlap_length, union_length


def test_union_and_exposed_from_bucket_timestamps():
    assert union_length([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.8)]) == 4.0
    assert overlap_length([(0.0, 4.0), (6.0, 8.0)], [(3.0, 7.0), (1.0, 2.0)]) == 3.0
    # three buckets: the last becomes ready at t=9 (end of backward), all done at t=12
    step = step_figures([(1.0, 4.0, 100), (3.0, 7.0, 100), (9.0, 12.0, 50)])
    assert (step.allreduce_s, step.exposed_s, step.bytes) == (9.0, 3.0, 250)
    # fully hidden: everything done before the last bucket is ready... and its own time
    assert step_figures([(0.0, 1.0, 8), (2.0, 2.5, 8)]).exposed_s == 0.5
    assert step_figures([]).allreduce_s == 0.0
