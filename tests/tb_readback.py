"""Reading real TensorBoard event files back as TensorBoard itself does: with the event
multiplexer and accumulator its server uses, which also apply `purge_step` (docs/logging.md).

TensorBoard stores every scalar as a 32-bit float: `read_runs` gives scalars as the float32
value stored, to compare with `float32(figure)` exactly."""

from __future__ import annotations

import numpy as np
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.util import tensor_util


def read_runs(logdir) -> dict[str, dict[str, dict[str, list]]]:
    """Every TensorBoard run under `logdir` (named by its folder relative to `logdir`, `.`
    for `logdir` itself): {run: {plugin: {tag: [(step, value), ...]}}}, scalars as float32
    numbers, text as str, images as (width, height, PNG bytes). A tag left with no event is
    not listed: a resumed attempt's purge removes the earlier attempt's later events of every
    tag, and a tag only those events had (a straggler named after the resumed step) stays
    known to the reader with nothing to show."""
    mux = plugin_event_multiplexer.EventMultiplexer(size_guidance={"tensors": 0})
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    runs: dict = {}
    for run, tags in mux.Runs().items():
        for tag in tags["tensors"]:
            plugin = mux.SummaryMetadata(run, tag).plugin_data.plugin_name
            values = [(e.step, _value(plugin, e.tensor_proto)) for e in mux.Tensors(run, tag)]
            if values:
                runs.setdefault(run, {}).setdefault(plugin, {})[tag] = values
    return runs


def _value(plugin: str, proto):
    array = tensor_util.make_ndarray(proto)
    if plugin == "scalars":
        assert array.dtype == np.float32
        return array.item()
    if plugin == "text":
        return array.reshape(-1)[0].decode()
    if plugin == "images":
        width, height, png = array.reshape(-1)[:3]
        return int(width), int(height), png
    return array
