"""A device shared by every instance placed on it: processor sharing with a measured speed-up curve.

While k batches run on one device at once, batch j progresses at ``rate_j = S_j(k_j) / k_j`` of its solo speed, where
``S_j`` is the co-location curve of its model on that device (measured, at the nearest measured batch size not above
its own; see :mod:`serving_bench.sim.spec` for the defaults when none was measured) and ``k_j`` is the number of
running batches *as seen by j*:

* all running batches of one model: ``k_j = k``, so the measured curve applies as it is;
* exactly two models whose pair curve was measured at a batch size not below any running batch's: that curve (the
  one measured at the smallest such batch size), ``rate = S_pair(k) / k``;
* any other mix: ``k_j = n_j + sum_{i of other models} w_ij`` with ``w_ij = sqrt(rho_i / rho_j)``, where ``n_j``
  counts the running batches of j's own model and ``rho`` is a model's interference coefficient fitted from its own
  curve (``S(k)/k = 1 / (1 + (k - 1) rho)``). Written as stretch, batch j is slowed by ``sqrt(rho_i rho_j)`` per
  batch of another model: the product of two *device-bound fractions* ``d = sqrt(rho)`` (a batch that needs the device
  a fraction d of its time meets another one's device-bound phase a fraction d_i of that time). A model that does not
  slow itself (``rho = 0``, like ``sleep``) neither slows others nor is slowed by them.

Work is measured in solo seconds. Each running batch keeps its planned end at its current rate; when the set of
running batches changes, the batches whose rate changed are re-planned from their remaining work. The sums of
``sqrt(rho)`` are kept as integers (fixed point, 2^-40), so they are exact and independent of the order batches came
and went; both engines also add and remove batches in the same order, so they compute bit-identical times.
"""

from __future__ import annotations

import math


FIXED = float(1 << 40)  # sqrt(rho) in fixed point: integer sums are exact and order-independent


class Share:
    """How one job kind (model, executed batch size) shares a device: its model, ``root = sqrt(rho)`` (and
    ``iroot``, the same in fixed point) and its curve as ``rate(k) = min(S(k) / k, 1)``, which is exactly 1 while the
    curve is still linear (``k <= linear_to``); beyond, the curve's points are kept as plain tuples for a quick
    evaluation (:class:`serving_bench.profiles.schema.Curve` semantics)."""

    __slots__ = ("model", "batch", "root", "iroot", "curve", "linear_to", "ks", "ss", "tail")

    def __init__(self, model: int, curve, batch: int = 1):
        self.model = model
        self.batch = batch
        self.curve = curve
        self.root = math.sqrt(curve.interference)
        self.iroot = int(round(self.root * FIXED))
        linear_to = 1.0
        for k, s in zip(curve.k, curve.speedup):
            if s < k:
                break
            linear_to = k
        self.linear_to = linear_to
        self.ks, self.ss = curve.k, curve.speedup
        ks, ss = self.ks, self.ss
        slope = (ss[-1] - ss[-2]) / (ks[-1] - ks[-2]) if len(ks) > 1 else 0.0
        self.tail = min(max(slope, 0.0), 1.0)

    def rate(self, k: float) -> float:
        """``min(S(k) / k, 1)``, the same numbers as ``min(curve(k) / k, 1)``."""
        if k <= self.linear_to:
            return 1.0
        ks, ss = self.ks, self.ss
        last = len(ks) - 1
        if k >= ks[last]:
            s = ss[last] + self.tail * (k - ks[last])
        else:
            i = 1
            while ks[i] <= k:
                i += 1
            k0, s0 = ks[i - 1], ss[i - 1]
            s = s0 + (k - k0) / (ks[i] - k0) * (ss[i] - s0)
        r = s / k
        return r if r < 1.0 else 1.0


class Job:
    """One executing batch: ``work`` solo seconds; at its current ``rate`` it ends at ``finish`` (absolute seconds,
    recomputed only when its rate changes); ``share`` is its sharing rule."""

    __slots__ = ("work", "finish", "rate", "share", "seq", "payload", "instance", "start")

    def __init__(self, work: float, share: Share, seq: int, payload, instance, start: float):
        self.work = work
        self.finish = math.inf
        self.rate = 0.0  # not placed yet
        self.share = share
        self.seq = seq
        self.payload = payload
        self.instance = instance
        self.start = start


# A batch whose planned end is this close to now counts as finished (absorbs rounding of rescaled end times).
DONE_TOLERANCE_S = 1e-12


class Device:
    """Processor sharing among the running jobs, per the rule in the module docstring. ``pairs`` maps a frozenset of
    two model indices to the measured pair curves' :class:`Share` objects (``rate(k)`` is ``S_pair(k) / k``; ``batch``
    the batch size it was measured at), by increasing batch size.

    A job keeps its planned end ``finish``; when the set of running jobs changes, only the jobs whose rate changed
    are re-planned (remaining work ``(finish - now) * old_rate`` at the new rate), once per instant (:meth:`flush`,
    called by the engines at its end: a batch ending and the next one starting at the same instant cost one
    re-planning). Per model the count of running jobs and their fixed-point root sum are kept up to date as jobs come
    and go."""

    __slots__ = ("name", "jobs", "last", "pairs", "busy_s", "version", "next", "counts", "roots", "total", "dirty")

    def __init__(self, name: str, pairs: dict | None = None):
        self.name = name
        self.jobs: list[Job] = []
        self.last = 0.0
        self.pairs = pairs or {}
        self.busy_s = 0.0  # time with at least one job running
        self.version = 0
        self.next = math.inf  # the earliest planned end
        self.counts: dict[int, int] = {}  # model -> running jobs
        self.roots: dict[int, int] = {}  # model -> fixed-point sum of their roots
        self.total = 0
        self.dirty = False  # jobs came or went since the rates were last set (see flush)

    def _rerate(self, now: float) -> None:
        """Set every running job's rate for the current set, re-plan the jobs whose rate changed, update ``next``."""
        jobs = self.jobs
        n = len(jobs)
        if n == 1:
            job = jobs[0]
            if job.rate != 1.0:
                job.finish = now + job.work if job.rate == 0.0 else now + (job.finish - now) * job.rate
                job.rate = 1.0
            self.next = job.finish
            return
        if not n:
            self.next = math.inf
            return
        counts = self.counts
        pair = None
        if len(counts) == 2 and self.pairs:
            curves = self.pairs.get(frozenset(counts))
            if curves is not None:
                biggest = max(job.share.batch for job in jobs)
                for candidate in curves:
                    if candidate.batch >= biggest:
                        pair = candidate
                        break
        pair_rate = pair.rate(float(n)) if pair is not None else 0.0
        roots = self.roots
        total = self.total
        nxt = math.inf
        for job in jobs:
            if pair is None:
                share = job.share
                m = share.model
                k = counts[m]
                if share.iroot:
                    k += (total - roots[m]) / share.iroot
                rate = 1.0 if k <= share.linear_to else share.rate(k)
            else:
                rate = pair_rate
            old = job.rate
            if rate != old:
                job.finish = now + job.work / rate if old == 0.0 else now + (job.finish - now) * old / rate
                job.rate = rate
            if job.finish < nxt:
                nxt = job.finish
        self.next = nxt

    def add(self, now: float, job: Job) -> None:
        if self.jobs:
            self.busy_s += now - self.last
        self.last = now
        self.jobs.append(job)
        share = job.share
        m = share.model
        self.counts[m] = self.counts.get(m, 0) + 1
        self.roots[m] = self.roots.get(m, 0) + share.iroot
        self.total += share.iroot
        self.dirty = True
        self.version += 1

    def flush(self, now: float) -> None:
        """Set the rates for the jobs running now (once per instant, however many came and went in it: the engines
        call it at the end of the instant)."""
        if self.dirty:
            self._rerate(now)
            self.dirty = False

    def next_completion(self, now: float) -> float:
        """Absolute time of the next completion if nothing changes (inf when idle)."""
        self.flush(now)
        nxt = self.next
        return nxt if nxt > now else (now if self.jobs else math.inf)

    def pop_finished(self, now: float) -> list[Job]:
        """Remove the jobs whose planned end has come (in start order); the others are re-planned at the flush."""
        self.flush(now)
        jobs = self.jobs
        if jobs:
            self.busy_s += now - self.last
        self.last = now
        limit = now + DONE_TOLERANCE_S
        if self.next > limit:
            return []
        done = [job for job in jobs if job.finish <= limit]
        counts, roots = self.counts, self.roots
        for job in done:
            share = job.share
            m = share.model
            c = counts[m] - 1
            if c:
                counts[m] = c
                roots[m] -= share.iroot
            else:
                del counts[m]
                del roots[m]
            self.total -= share.iroot
        self.jobs = [job for job in jobs if job.finish > limit] if len(done) < len(jobs) else []
        self.dirty = True
        self.version += 1
        if len(done) > 1:
            done.sort(key=lambda j: j.seq)
        return done
