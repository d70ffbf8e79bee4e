"""The Target boundary (LoadGen's SUT) and the load modes it runs a schedule in.

A target turns a :class:`~serving_bench.run.schedule.Schedule` into :class:`~serving_bench.run.records.Records`:
one row per scheduled request, every request accounted for exactly once (``tests/conformance.py`` checks it on every
target). The caller owns the schedule; a target never decides when requests happen (open loop) or how many are in
flight (closed loop) beyond what the mode says.

* :class:`OpenLoop` — each request at its scheduled time, whatever is in flight (optionally capped);
* :class:`ClosedLoop` — ``concurrency`` requests in flight per model, the next one sent when one returns
  (perf_analyzer's concurrency mode); arrival times are ignored and ``intended_s`` is the send time.

``Target.run(schedule, mode=None)``: ``mode=None`` is the target's own default (``TritonTarget(mode=...)``; the
simulator's is :class:`OpenLoop`). Implementations: ``serving_bench.load.driver.TritonTarget`` (real Triton) and
``serving_bench.sim.target.SimTarget`` (the simulator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, runtime_checkable

from serving_bench.run.records import Records
from serving_bench.run.schedule import Schedule

ON_CAP = ("wait", "drop")


@dataclass(frozen=True)
class OpenLoop:
    """Send each request at its scheduled time. ``max_in_flight`` caps outstanding requests (``None``: no cap);
    at the cap a request waits (``on_cap="wait"``, it leaves late) or is dropped (``"drop"``, status ``not_sent``)."""

    name = "open"
    max_in_flight: int | None = None
    on_cap: str = "wait"

    def __post_init__(self):
        if self.on_cap not in ON_CAP:
            raise ValueError(f"on_cap must be 'wait' or 'drop', got {self.on_cap!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")


@dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` requests in flight per model (an int for every model, or a mapping model -> int) for
    ``duration_s`` seconds (default: the schedule's duration) or until the schedule's requests run out."""

    name = "closed"
    concurrency: int | Mapping[str, int] = 1
    duration_s: float | None = None

    def per_model(self, models: Sequence[str]) -> dict[str, int]:
        """Workers per model for a schedule serving ``models`` (0 for a model the mapping leaves out)."""
        if isinstance(self.concurrency, Mapping):
            return {m: int(self.concurrency.get(m, 0)) for m in models}
        return {m: int(self.concurrency) for m in models}


Mode = OpenLoop | ClosedLoop
MODES = {"open": OpenLoop, "closed": ClosedLoop}


@runtime_checkable
class Target(Protocol):
    """Runs a schedule and returns its records. ``name`` goes into ``RunInfo.target`` (``"triton"``, ``"sim"``)."""

    name: str

    def run(self, schedule: Schedule, mode: OpenLoop | ClosedLoop | None = None) -> Records:
        """Every request of ``schedule`` in ``mode`` (``None``: the target's default); raises
        :class:`~serving_bench.errors.InputError` before anything runs when the schedule does not fit the target."""
        ...
