"""A served model's state in the simulated server (:mod:`serving_bench.sim.core` decides what happens to it): its
payloads (batches being formed, waiting or running), what it executed, its arrivals, request FIFO, batcher state,
payload queue and instances; and the :class:`Clock` interface the engines implement. Times in seconds.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtri

from serving_bench.sim.device import Device
from serving_bench.sim.spec import DEFAULT_WAIT_S

PAYLOAD_STATES = (0, 1, 2, 3)  # a payload: being formed, ready, queued or being taken up, executing
UNINIT, READY, SCHEDULED, EXECUTING = PAYLOAD_STATES
INF = math.inf


def recent_mean(mean: float, value: float, memory: float) -> float:
    """The running mean after ``value`` (``mean``: before it; inf: none yet), the newest weighing ``memory``: one step
    of :func:`serving_bench.profiles.distributions.recent_means`, float for float (the engine's typed copy)."""
    return value if memory >= 1.0 or not mean < INF else mean + memory * (value - mean)


class Piecewise:
    """A piecewise linear curve through points ``(xs[i], ys[i])`` (``xs`` increasing), constant beyond its ends:
    ``at(x)`` computes what :func:`serving_bench.profiles.distributions.interp` does, float for float."""

    __slots__ = ("xs", "ys", "n")

    def __init__(self, xs, ys):
        self.xs = np.asarray(xs, dtype=np.float64)
        self.ys = np.asarray(ys, dtype=np.float64)
        self.n = len(self.xs)

    def at(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        last = self.n - 1
        if x <= xs[0]:
            return ys[0]
        if x >= xs[last]:
            return ys[last]
        i = 0
        while xs[i + 1] <= x:
            i += 1
        return ys[i] + (x - xs[i]) / (xs[i + 1] - xs[i]) * (ys[i + 1] - ys[i])


class Payload:
    """A batch being formed / waiting / running: requests are the local index ranges ``[a, b)`` of its model — the
    first one ``[a, b)``, any further ones flat in ``more`` (``a1, b1, a2, b2, ...``; None: none)."""

    __slots__ = ("a", "b", "more", "items", "nreq", "state", "saturated", "start")

    def __init__(self):
        self.a = self.b = 0
        self.more: list[int] | None = None
        self.items = 0
        self.nreq = 0
        self.state = UNINIT
        self.saturated = False
        self.start = INF  # batcher start of its oldest request (for the merge-on-dequeue rule)

    def take(self, a: int, n: int, items: int) -> None:
        """Requests ``[a, a + n)`` of ``items`` items join the payload (extending its last range where it ends at a)."""
        if self.nreq == 0:
            self.a = a
            self.b = a + n
        elif self.more is None:
            if self.b == a:
                self.b = a + n
            else:
                self.more = [a, a + n]
        elif self.more[-1] == a:
            self.more[-1] = a + n
        else:
            self.more.append(a)
            self.more.append(a + n)
        self.items += items
        self.nreq += n

    def merge(self, other: "Payload") -> None:
        """``other``'s requests join the payload (its ranges after ours, as they are)."""
        if self.more is None:
            self.more = []
        self.more.append(other.a)
        self.more.append(other.b)
        if other.more is not None:
            self.more.extend(other.more)
        self.items += other.items
        self.nreq += other.nreq

    def ranges(self) -> list[int]:
        """Every range, flat: ``[a, b, a1, b1, ...]``."""
        return [self.a, self.b] + (self.more or [])


class Executed:
    """What a model executed: one row per request range ``[a, b)`` — ``a``, ``b``, its batch's end time (seconds), items
    and instance — as float64 (indices and counts are exact below 2**53), in an array doubled when full, so the records
    are read without a conversion per request."""

    __slots__ = ("rows", "n")

    def __init__(self, expected: int = 0):
        self.rows = np.empty((max(expected, 256), 5))  # room for one range per request known up front
        self.n = 0

    def add(self, a: int, b: int, t: float, items: int, instance: int) -> None:
        n = self.n
        if n == self.rows.shape[0]:
            grown = np.empty((2 * n, 5))
            grown[:n] = self.rows
            self.rows = grown
        rows = self.rows
        rows[n, 0] = a
        rows[n, 1] = b
        rows[n, 2] = t
        rows[n, 3] = items
        rows[n, 4] = instance
        self.n = n + 1

    def table(self) -> np.ndarray:
        """The rows so far, ``(n, 5)``."""
        return np.asarray(self.rows)[:self.n]


class Clock:
    """What the core needs from an engine. ``notify`` requests a step of a model at the end of the current instant;
    ``timer`` (re)arms a model's batcher timer (inf: none); ``device_changed`` re-plans a device's next completion;
    ``arrive`` schedules a dynamic arrival (an ensemble step, a closed-loop request) of model ``m`` at ``t``;
    ``release`` calls ``Server.release(m, instance, t)`` at time ``t`` (an instance's gap between batches has
    passed); ``call`` runs ``fn(t)`` at time ``t`` among that instant's state changes (a closed-loop client sending
    its next request). An engine's clock also tells the current time (``now``, seconds)."""

    def notify(self, m: int) -> None: ...

    def timer(self, m: int, t: float) -> None: ...

    def device_changed(self, device: Device) -> None: ...

    def arrive(self, m: int, t: float, owner: int, items: int) -> None: ...

    def release(self, m: int, instance: int, t: float) -> None: ...

    def call(self, t: float, fn) -> None: ...


class ModelState:
    """One served model: its arrivals (local arrays), request FIFO, batcher state, payload queue and instances."""

    def __init__(self, spec, rng_seed: tuple, static_arrivals: tuple[np.ndarray, np.ndarray, np.ndarray]):
        self.spec = spec
        self.m = spec.index
        # the batcher's knobs (read on every step; ``spec`` is their home)
        self.dynamic = spec.dynamic
        self.max_batch = spec.max_batch
        self.delay_s = spec.delay_s
        self.preferred = spec.preferred
        self.max_preferred_size = spec.max_preferred_size
        self.max_queue_size = spec.max_queue_size
        self.timeout_s = spec.timeout_s
        # the requests in arrival order at the server, the static ones (known up front) then those appended: time
        # (seconds), owner (record index, or -1 - ensemble slot), items and ``cum[i]``, the items of requests before
        # i; the first ``size`` are used (arrays that grow by doubling; the static ones are read, never written)
        t, owner, items = (np.asarray(a, dtype=dtype) for a, dtype in zip(static_arrivals, (np.float64, np.int64,
                                                                                              np.int64)))
        self.size = len(t)
        self.t = t
        self.owner = owner
        self.items = items
        self.cum = np.concatenate((np.zeros(1, dtype=np.int64), np.cumsum(items)))
        self.all_ones = bool(np.all(items == 1))
        self.static = True
        self.n_arr = 0  # requests arrived (admitted) so far
        self.head = 0  # first request still in the FIFO
        self.next_pref = 0
        self.cur = Payload()
        self.pqueue: list[Payload] = []  # payloads handed over, not yet executing
        self.pq_head = 0
        n_inst = len(spec.instance_devices)
        self.slots = 2 * n_inst
        self.is_idle = np.ones(n_inst, dtype=np.uint8)
        self.n_idle = n_inst
        self.rng = np.random.default_rng(rng_seed)
        self.u = self.rng.random(4096)
        self.ui = 0
        # the host's speed its services follow (follow_drift): loading, the rest, the latent grid and its step,
        # and the normal scores of ``u``
        self.drift_rho = 0.0
        self.drift_rest = 1.0
        self.drift_z = np.zeros(1)
        self.drift_step = 1.0
        self.e = np.zeros(1)
        self.timer_at = INF
        self.idle_since: float | None = None  # when the batcher last went to sleep on an empty queue
        self.absorbing = False  # see batcher.absorb
        # outputs
        self.rejected: list[tuple[int, float]] = []  # (owner, time) rejected at arrival (queue full)
        self.timed_out: list[tuple[int, int, float]] = []  # (a, b, t)
        self.errors: list[int] = []
        self.executed = Executed(self.size)
        self.busy_s = 0.0
        self.executions = 0  # executed batches
        self.executed_items = 0
        # per instance: its service-time table (``[batch size, quantile point]``), per-request cost, gap before it
        # takes the next payload, cold-start extra by recent idle seconds (a Piecewise, or None), the newest idle
        # time's weight in that recent idle time and the recent idle time itself (inf: none yet), when it last
        # became free (-inf: never busy); the Server adds its device and its sharing rule per batch size
        devices = spec.instance_devices
        self.inst_table = spec.instance_tables
        self.inst_per_request = np.array([spec.per_request_s[d] for d in devices], dtype=np.float64)
        self.inst_gap = np.array([spec.batch_gap_s.get(d, 0.0) for d in devices], dtype=np.float64)
        self.inst_idle: list = [None if spec.idle.get(d) is None else
                                Piecewise(spec.idle[d].service_idle_s, spec.idle[d].service_extra_s) for d in devices]
        self.inst_memory = np.array([spec.idle[d].service_memory if spec.idle.get(d) is not None else 1.0
                                     for d in devices], dtype=np.float64)
        self.inst_recent_idle = np.full(n_inst, INF)
        self.inst_free_at = np.full(n_inst, -INF)
        self.inst_device: list = []
        self.inst_kinds: list = []
        # taking up a payload (dynamic batching): per instance its solo seconds (0: at once) and job kind; the
        # (payload, instance) pairs whose take-up ended this instant, started at the model's next step
        self.inst_pickup = np.array([spec.pickup_s.get(d, 0.0) for d in devices], dtype=np.float64)
        self.inst_pickup_kind: list = []
        self.picked: list = []

    def follow_drift(self, z: np.ndarray, step_s: float, rho: float) -> None:
        """Its services follow the host's latent speed ``z`` (a grid of step ``step_s`` seconds, wrapping) with
        loading ``rho`` (``sim/drift.py``)."""
        self.drift_z = z
        self.drift_step = step_s
        self.drift_rho = rho
        self.drift_rest = (1.0 - rho * rho) ** 0.5
        self.e = ndtri(self.u)

    def refill(self) -> None:
        """The next 4096 uniform draws of the services (and their normal scores where they follow the drift)."""
        self.u = self.rng.random(4096)
        self.ui = 0
        if self.drift_rho > 0.0:
            self.e = ndtri(self.u)

    # -- arrivals ---------------------------------------------------------------------------------------------------
    def arrivals(self) -> tuple[np.ndarray, np.ndarray]:
        """Times (seconds) and owners of every request that reached the queue, in queue order, as arrays."""
        return np.asarray(self.t)[:self.size], np.asarray(self.owner)[:self.size]

    def queued_items(self) -> int:
        arrived = self.cum[self.n_arr]
        taken = self.cum[self.head]
        return arrived - taken

    def admit_until(self, now: float) -> None:
        """Static arrivals: every request with time <= now has arrived (dynamic ones are appended by ``append``)."""
        if self.static and self.n_arr < self.size and self.t[self.n_arr] <= now:
            self.n_arr = _bisect_right(self.t, now, self.n_arr, self.size)

    def append(self, t: float, owner: int, items: int) -> bool:
        """A dynamic arrival (rejection mode, ensemble steps): admit it to the FIFO, or reject it when the FIFO
        already holds ``max_queue_size`` requests (Triton: "Exceeds maximum queue size")."""
        if self.max_queue_size and self.n_arr - self.head >= self.max_queue_size:
            self.rejected.append((owner, t))
            return False
        n = self.size
        if n == self.t.shape[0]:
            self._grow()
        self.t[n] = t
        self.owner[n] = owner
        self.items[n] = items
        self.cum[n + 1] = self.cum[n] + items
        self.size = n + 1
        if items != 1:
            self.all_ones = False
        self.n_arr = self.size
        return True

    def _grow(self) -> None:
        """Room for twice as many requests (new arrays: the static ones are never written)."""
        n = self.size
        room = max(16, 2 * n)
        self.t = np.concatenate((np.asarray(self.t)[:n], np.zeros(room - n)))
        self.owner = np.concatenate((np.asarray(self.owner)[:n], np.zeros(room - n, dtype=np.int64)))
        self.items = np.concatenate((np.asarray(self.items)[:n], np.zeros(room - n, dtype=np.int64)))
        self.cum = np.concatenate((np.asarray(self.cum)[:n + 1], np.zeros(room - n, dtype=np.int64)))

    def arrived_before(self, now: float) -> int:
        """End of the queued requests that arrived strictly before ``now`` (an index in ``[head, n_arr]``)."""
        return _bisect_left(self.t, now, self.head, self.n_arr)

    def arrived_until(self, limit: float) -> int:
        """End of the queued requests that arrived at or before ``limit`` (an index in ``[head, n_arr]``)."""
        return _bisect_right(self.t, limit, self.head, self.n_arr)

    def wake_predicate(self) -> bool:
        """Would an arrival now wake the batcher (Triton's ``wake_batcher``)?"""
        if self.pqueue_len() >= self.slots:
            return False
        cur = self.cur
        return cur.saturated or cur.state == EXECUTING or self.queued_items() >= self.next_pref

    def pqueue_len(self) -> int:
        return len(self.pqueue) - self.pq_head

    def waking_arrival(self) -> int:
        """Static arrivals: the next arrival that would wake the batcher given the current state (-1: none), as the
        first arrival at its time. Only the count of queued items changes between steps, so this is a search on the
        cumulative items."""
        n = self.size
        if self.n_arr >= n:
            return -1
        if not self.dynamic:
            return self.n_arr if self.n_idle else -1
        if self.absorbing or self.pqueue_len() >= self.slots:
            return -1
        cur = self.cur
        need = self.next_pref - self.queued_items()
        if cur.saturated or cur.state == EXECUTING or need <= 1:
            return self.n_arr
        if self.all_ones:  # one item per request: the need-th arrival from now
            j = self.n_arr + need - 1
        else:
            reach = self.cum[self.n_arr] + need  # cumulative items at the waking arrival
            j = _bisect_left(self.cum, reach, self.n_arr + 1, n + 1) - 1
        if j >= n:
            return -1
        while j > self.n_arr and self.t[j - 1] == self.t[j]:
            j -= 1
        return j

    def take_idle(self) -> int:
        """An idle instance (the lowest index) takes work: it is busy from now on."""
        i = 0
        while not self.is_idle[i]:
            i += 1
        self.is_idle[i] = 0
        self.n_idle -= 1
        return i

    def idle_wake(self, after: float) -> float:
        """The first of the batcher's 0.5 s empty-queue wakes at or after ``after`` (inf: inf)."""
        if after == INF:
            return INF
        t0 = self.idle_since
        k = max(math.ceil((after - t0) / DEFAULT_WAIT_S), 1)
        t = t0 + k * DEFAULT_WAIT_S
        return t if t >= after else t0 + (k + 1) * DEFAULT_WAIT_S


def _bisect_right(times: np.ndarray, t: float, lo: int, hi: int) -> int:
    """``bisect.bisect_right(times, t, lo, hi)`` on an array of floats, galloping from ``lo`` (where the answer
    usually is)."""
    bound = lo
    step = 1
    while bound < hi and times[bound] <= t:
        lo = bound + 1
        bound = lo + step
        step += step
    if bound < hi:
        hi = bound
    while lo < hi:
        mid = (lo + hi) >> 1
        if t < times[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _bisect_left(values: np.ndarray, x, lo: int, hi: int) -> int:
    """``bisect.bisect_left(values, x, lo, hi)`` on an array of floats or of ints (compiled: one C version each),
    galloping from ``lo``."""
    bound = lo
    step = 1
    while bound < hi and values[bound] < x:
        lo = bound + 1
        bound = lo + step
        step += step
    if bound < hi:
        hi = bound
    while lo < hi:
        mid = (lo + hi) >> 1
        if values[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo
