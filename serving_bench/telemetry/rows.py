"""The row every sampler emits: one value of one metric at one sampling tick (the tick adds ``t_s``)."""

from __future__ import annotations

from typing import NamedTuple

COLUMNS = ("t_s", "source", "metric", "model", "value")


class Row(NamedTuple):
    """``source``: ``triton``, ``cpu``, ``gpuN``; ``model``: the Triton model, ``pid:N`` for per-process rows, or
    empty; ``value`` in the unit its metric name ends with (``_bytes``, ``_pct``, ``_w``, ``_us``; counts otherwise)."""

    source: str
    metric: str
    model: str
    value: float
