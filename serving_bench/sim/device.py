"""A device shared by every instance placed on it: processor sharing with a measured speed-up curve.

While k batches run on one device at once, batch j progresses at ``rate_j = S_j(k_j) / k_j`` of its solo speed, where
``S_j`` is the co-location curve of its model on that device (measured, at the nearest measured batch size not above
its own; see :mod:`serving_bench.sim.spec` for the defaults when none was measured) and ``k_j`` is the number of
running batches *as seen by j*:

* all running batches of one model: ``k_j = k``, so the measured curve applies as it is;
* exactly two models whose pair curve was measured: that curve, ``rate = S_pair(k) / k``;
* any other mix: ``k_j = 1 + sum_{i != j} w_ij`` with ``w_ij = 1`` for the same model and
  ``w_ij = sqrt(rho_i / rho_j)`` otherwise (linear-time form in ``spec.DeviceRule.rates``), where ``rho`` is a model's interference coefficient fitted from its own
  curve (0: runs beside anything untouched, like ``sleep``; 1: time-sliced). A model that does not slow itself
  is not slowed by others, and one that uses no device capacity slows nobody.

Work is measured in solo seconds; the device advances every running batch by ``elapsed * rate`` whenever the set of
running batches changes. The arithmetic depends only on the set, never on the order batches were added, so both
engines (SimPy reference and fast) produce bit-identical times.
"""

from __future__ import annotations

import math


class Job:
    """One executing batch: ``work`` solo seconds left, current ``rate``; ``kind`` is its sharing key."""

    __slots__ = ("rem", "rate", "kind", "seq", "payload", "instance", "start")

    def __init__(self, rem: float, kind: tuple, seq: int, payload, instance, start: float):
        self.rem = rem
        self.rate = 1.0
        self.kind = kind
        self.seq = seq
        self.payload = payload
        self.instance = instance
        self.start = start


# Remaining work (solo seconds) below which a batch counts as finished; absorbs rounding of elapsed * rate.
DONE_TOLERANCE_S = 1e-12


class Device:
    """Processor sharing among the running jobs; ``rates(kinds)`` maps a sorted tuple of job kinds to their rates."""

    __slots__ = ("name", "jobs", "last", "rate_fn", "cache", "busy_s", "version")

    def __init__(self, name: str, rate_fn):
        self.name = name
        self.jobs: list[Job] = []
        self.last = 0.0
        self.rate_fn = rate_fn
        self.cache: dict[tuple, dict] = {}
        self.busy_s = 0.0  # time with at least one job running
        self.version = 0

    def advance(self, now: float) -> None:
        dt = now - self.last
        if dt > 0.0:
            jobs = self.jobs
            if jobs:
                self.busy_s += dt
                for job in jobs:
                    job.rem -= dt * job.rate
            self.last = now

    def _rerate(self) -> None:
        jobs = self.jobs
        if len(jobs) == 1:
            jobs[0].rate = 1.0
            return
        if not jobs:
            return
        key = tuple(sorted(job.kind for job in jobs))
        rates = self.cache.get(key)
        if rates is None:
            rates = self.rate_fn(key)
            if len(self.cache) > 200_000:  # mixes of batch sizes are many; keep memory bounded
                self.cache.clear()
            self.cache[key] = rates
        for job in jobs:
            job.rate = rates[job.kind]

    def add(self, now: float, job: Job) -> None:
        self.advance(now)
        self.jobs.append(job)
        self._rerate()
        self.version += 1

    def next_completion(self, now: float) -> float:
        """Absolute time of the next completion if nothing changes (inf when idle)."""
        jobs = self.jobs
        if not jobs:
            return math.inf
        if len(jobs) == 1:
            job = jobs[0]
            return now + max(job.rem, 0.0) / job.rate
        return now + min(max(job.rem, 0.0) / job.rate for job in jobs)

    def pop_finished(self, now: float) -> list[Job]:
        """Advance to ``now`` and remove the jobs whose work is done (sorted by start order)."""
        self.advance(now)
        done = [job for job in self.jobs if job.rem <= DONE_TOLERANCE_S * max(1.0, job.rate)]
        if done:
            self.jobs = [job for job in self.jobs if job.rem > DONE_TOLERANCE_S * max(1.0, job.rate)]
            self._rerate()
            self.version += 1
            done.sort(key=lambda j: j.seq)
        return done
