"""The server logic both engines share: Triton's dynamic batcher, payload queue, instances, devices, ensembles.

The engines (``reference.py``: SimPy processes; ``fast.py``: one heap loop) only decide *when* things happen; this module
decides *what* happens, so both produce identical records. Time semantics, identical in both:

* state changes at an instant (arrivals, batch completions, batcher timers) are applied first;
* then, at the end of the instant, each notified model takes one *step*: idle instances take queued payloads, and the
  batcher loop runs until it waits, exactly as Triton's batcher thread would if it ran in zero time.

What a step does follows Triton's ``DynamicBatchScheduler`` (core r23+, the version bundled in tritonserver 2.51):

* requests wait in a per-model FIFO; ``max_queue_size`` (requests in that FIFO) rejects arrivals beyond it;
  ``default_timeout_microseconds`` rejects queued requests the batcher finds expired (status ``timeout``);
* the batcher forms a *payload* only while the rate limiter has a slot (fewer than 2 x instances payloads waiting);
  a payload handed over but not yet executing keeps growing with later requests until it is *saturated*;
* ``GetDynamicBatch``: take requests in order while they fit ``max_batch_size``; remember the largest pending size
  that is a preferred size; send it at once unless it is not found and ``max_queue_delay`` has not passed since the
  oldest queued request, in which case wait (at most until that delay or the nearest queue timeout); with no
  preferred sizes Triton uses ``{max_batch_size}``;
* the batcher thread is woken by an arrival only when a slot is free and the queued items reach the next preferred
  size (or the payload is saturated/executing), by a payload being taken by an instance, or by its timer (0.5 s when
  the queue was empty);
* an idle instance takes the oldest payload; with a queue delay it merges following unsaturated payloads older than
  the delay while they fit. Idle instances are chosen lowest index first.
* without dynamic batching every request is its own payload, taken in arrival order.

Each payload runs on its instance's device as one job of ``items`` (rows) whose solo service time is drawn from the
profile (per-model seeded stream, in dispatch order) plus ``per_request_s`` per extra request; the device shares
itself among its running jobs (``device.py``). A finished request's ``done_s`` adds its sampled client/network
overhead (all of it on the return path; the server sees the request at its send time).
"""

from __future__ import annotations

import math

import numpy as np

from serving_bench.sim.device import Device
from serving_bench.sim.spec import DEFAULT_WAIT_S, SimSpec

UNINIT, READY, SCHEDULED, EXECUTING = 0, 1, 2, 3
EPS_S = 1e-9  # clock comparisons tolerate 1 ns (Triton's clock resolution)
TIMER_RESOLUTION_S = 1e-6
NEVER = 1 << 62  # Triton waits in whole microseconds; a wait below 1 us is no wait
INF = math.inf


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
        self.timer_at = INF
        self.idle_since: float | None = None  # when the batcher last went to sleep on an empty queue
        self.absorbing = False  # see Server._absorb
        # outputs
        self.rejected: list[tuple[int, float]] = []  # (owner, time) rejected at arrival (queue full)
        self.timed_out: list[tuple[int, int, float]] = []  # (a, b, t)
        self.errors: list[int] = []
        self.executed = Executed(self.size)
        self.busy_s = 0.0
        self.executions = 0  # executed batches
        self.executed_items = 0
        # per instance: its service-time table (``[batch size, quantile point]``), per-request cost, gap before it
        # takes the next payload, cold starts (IdleEffect or None), when it last became free (-inf: never busy); the
        # Server adds its device and its sharing rule per batch size
        devices = spec.instance_devices
        self.inst_table = spec.instance_tables
        self.inst_per_request = np.array([spec.per_request_s[d] for d in devices], dtype=np.float64)
        self.inst_gap = np.array([spec.batch_gap_s.get(d, 0.0) for d in devices], dtype=np.float64)
        self.inst_idle: list = [spec.idle.get(d) for d in devices]
        self.inst_free_at = np.full(n_inst, -INF)
        self.inst_device: list = []
        self.inst_kinds: list = []

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


class Server:
    """All models and devices of one run; the engine calls ``step``, ``complete`` and ``release``.

    ``on_phase(payload, now)`` hears of finished request phases (:meth:`start_phase`); ``on_done(owner, now)`` hears
    of answered requests and ``on_failed(owner, now, outcome)`` of requests the server
    refused (``"rejected"``: queue full) or dropped (``"timeout"``: queue timeout): those of ensemble steps (negative owners) always, every request when
    ``report_all`` (a closed loop sends the next request when one is answered)."""

    def __init__(self, spec: SimSpec, clock: Clock, arrivals: list, seed: int, *, lazy: bool = True,
                 on_done=None, on_failed=None, on_phase=None, report_all: bool = False):
        self.spec = spec
        self.on_done = on_done
        self.on_failed = on_failed
        self.on_phase = on_phase
        self.report_all = report_all
        self.lazy = lazy  # bulk replay of absorbed arrivals (fast engine); the SimPy reference steps per arrival
        self.clock = clock
        self.models = [ModelState(ms, (seed, 1, ms.index), arrivals[ms.index]) for ms in spec.models]
        self.devices = {name: Device(name, rule.law, rule.pairs, _has_curves(rule), i)
                        for i, (name, rule) in enumerate(spec.devices.items())}
        for st in self.models:
            ms = st.spec
            for device in ms.instance_devices:
                kinds = spec.devices[device].kinds
                st.inst_device.append(self.devices[device])
                st.inst_kinds.append([None] + [kinds[(ms.index, b)] for b in range(1, max(ms.max_batch, 1) + 1)])
        self.job_seq = 0

    # -- the step ----------------------------------------------------------------------------------------------------
    def step(self, m: int, now: float) -> None:
        """End-of-instant work of model ``m``: dispatch to idle instances, then run the batcher until it waits."""
        st = self.models[m]
        st.admit_until(now)
        if not st.dynamic:
            self._direct(st, now)
            return
        st.idle_since = None
        if st.absorbing:
            self._absorb(st, now)
        self._dispatch(st, now)
        self._batcher_loop(st, now)

    def _direct(self, st: ModelState, now: float) -> None:
        """No dynamic batching: each request is a payload of its own, taken in arrival order by idle instances."""
        while st.n_idle and st.head < st.n_arr:
            p = Payload()
            i = st.head
            p.take(i, 1, st.items[i] if st.max_batch > 0 else 1)
            st.head = i + 1
            if st.max_batch > 0 and p.items > st.max_batch:
                st.errors.append(i)
                continue
            self._start(st, p, st.take_idle(), now)

    def _dispatch(self, st: ModelState, now: float) -> None:
        """Idle instances take the oldest handed-over payloads (merging old unsaturated ones when a delay is set)."""
        while st.n_idle and st.pq_head < len(st.pqueue):
            p = st.pqueue[st.pq_head]
            st.pqueue[st.pq_head] = None
            st.pq_head += 1
            p.state = EXECUTING
            if st.delay_s > 0 and st.max_batch > 1 and not p.saturated:
                while st.pq_head < len(st.pqueue):
                    f = st.pqueue[st.pq_head]
                    if f.saturated or not (now - f.start > st.delay_s) or p.items + f.items > st.max_batch:
                        break
                    f.state = EXECUTING
                    p.merge(f)
                    st.pqueue[st.pq_head] = None
                    st.pq_head += 1
            if st.pq_head > 64 and st.pq_head * 2 > len(st.pqueue):
                del st.pqueue[:st.pq_head]
                st.pq_head = 0
            self._start(st, p, st.take_idle(), now)

    def _start(self, st: ModelState, p: Payload, instance: int, now: float) -> None:
        """Instance ``instance`` starts payload ``p``: one service-time draw, plus the per-request cost of every
        request after the first, plus the cold-start extra for the time the instance sat idle, becomes a job on the
        instance's device."""
        items = p.items
        ui = st.ui
        if ui >= st.u.shape[0]:
            st.u = st.rng.random(4096)
            ui = 0
        st.ui = ui + 1
        u = st.u[ui]
        last = st.inst_table.shape[2] - 1
        x = u * last
        i = int(x)
        if i >= last:
            work = st.inst_table[instance, items, last]
        else:
            lo = st.inst_table[instance, items, i]
            hi = st.inst_table[instance, items, i + 1]
            work = lo + (x - i) * (hi - lo)
        if p.nreq > 1:
            per_request = st.inst_per_request[instance]
            work += per_request * (p.nreq - 1)
        idle = st.inst_idle[instance]
        if idle is not None:
            work += idle.service_extra(now - st.inst_free_at[instance])
        dev = st.inst_device[instance]
        self.job_seq += 1
        dev.add(now, work, st.inst_kinds[instance][items], self.job_seq, p, st.m, instance)
        self.clock.device_changed(dev)

    def complete(self, dev: Device, now: float) -> None:
        """A device's planned completion time has come: finish the done jobs (their requests are answered now) and
        free their instances, at once or after the instance's measured gap between batches."""
        done = dev.pop_finished(now)
        self.clock.device_changed(dev)
        for job in done:
            if job.instance < 0:  # a request's way in or out, not a batch
                self.on_phase(job.payload, now)
                continue
            m, instance = job.model, job.instance
            st = self.models[m]
            p = job.payload
            st.executed.add(p.a, p.b, now, p.items, instance)
            if p.more is not None:
                more = p.more
                for k in range(0, len(more), 2):
                    st.executed.add(more[k], more[k + 1], now, p.items, instance)
            st.busy_s += now - job.start
            st.executions += 1
            st.executed_items += p.items
            if self.on_done is not None:
                self._report_done(st, p, now)
            gap = st.inst_gap[instance]
            if gap > 0.0:
                self.clock.release(m, instance, now + gap)
            else:
                self.release(m, instance, now)

    def start_phase(self, device: str, kind, work: float, payload, now: float) -> None:
        """Start ``work`` solo seconds of a request's way in or out on ``device``; ``on_phase(payload, t)`` when done."""
        dev = self.devices[device]
        self.job_seq += 1
        dev.add(now, work, kind, self.job_seq, payload, -1, -1)
        self.clock.device_changed(dev)

    def arrive(self, m: int, now: float, owner: int, items: int) -> None:
        """A dynamically fed request reaches model ``m``'s queue at ``now`` (the engines call this)."""
        st = self.models[m]
        if st.append(now, owner, items):
            if st.wake_predicate() if st.dynamic else st.n_idle:
                self.clock.notify(m)
            elif st.dynamic:
                self.idle_arrival(st)
        elif self.on_failed is not None and (owner < 0 or self.report_all):
            self.on_failed(owner, now, "rejected")

    def release(self, m: int, instance: int, now: float) -> None:
        """Instance ``instance`` of model ``m`` is free again: it joins the idle ones (lowest index first)."""
        st = self.models[m]
        st.is_idle[instance] = 1
        st.n_idle += 1
        st.inst_free_at[instance] = now
        self.clock.notify(m)

    # -- Triton's batcher thread --------------------------------------------------------------------------------------
    def _batcher_loop(self, st: ModelState, now: float) -> None:
        timer = INF
        while True:
            cur = st.cur
            if cur.saturated or cur.state == EXECUTING:
                st.cur = cur = Payload()
                st.next_pref = 0
            if st.head >= st.n_arr:
                # Triton sleeps 0.5 s (again and again) on an empty queue; that matters only when a later arrival
                # does not wake the batcher itself (next_pref > 0): the first such wake after it is planned then
                if st.next_pref > 0:
                    st.idle_since = now
                    timer = st.idle_wake(st.t[st.n_arr] if st.static and st.n_arr < st.size else INF)
                break
            if st.pqueue_len() >= st.slots:
                break  # waits for a slot; a payload taken by an instance notifies
            wait, n, items = self._get_dynamic_batch(st, now)
            if wait == 0.0 and n > 0:
                a = st.head
                if cur.nreq == 0:
                    cur.start = st.t[a]
                cur.take(a, n, items)
                st.head = a + n
                if cur.state == UNINIT:
                    cur.state = READY
            if wait > 0.0:
                timer = now + wait
                break
            if cur.state == READY:
                cur.state = SCHEDULED
                st.pqueue.append(cur)
                self._dispatch(st, now)
        if timer != st.timer_at:
            st.timer_at = timer
            self.clock.timer(st.m, timer)
        # delay 0, every instance busy, nothing queued: each later arrival would only be absorbed into the growing
        # payload (or start the next one); the fast engine replays that in bulk at the next step (``_absorb``)
        st.absorbing = (self.lazy and st.static and st.all_ones and st.delay_s == 0.0 and not st.n_idle
                        and st.head >= st.n_arr and st.next_pref == 0)

    def _absorb(self, st: "ModelState", now: float) -> None:
        """Replay, in bulk, the steps the arrivals since the last step (strictly before ``now``) would each have
        taken: exactly what ``_batcher_loop`` does for one request of 1 item with delay 0 and no idle instance."""
        st.absorbing = False
        end = _bisect_left(st.t, now, st.head, st.n_arr)
        i = st.head
        pref = st.preferred
        while i < end:
            cur = st.cur
            if cur.saturated or cur.state == EXECUTING:
                st.cur = cur = Payload()
            if st.pqueue_len() >= st.slots:
                break
            p = cur.items
            if p == 0:
                n = 1
                cur.start = st.t[i]
                cur.saturated = 1 in pref
            else:
                x = _next_size(pref, p)  # the payload is below the largest preferred size
                n = min(x - p, end - i)
                cur.saturated = p + n == x
            cur.take(i, n, n)
            i += n
            if cur.state == UNINIT:
                cur.state = SCHEDULED
                st.pqueue.append(cur)
        st.head = i

    def idle_arrival(self, st: "ModelState") -> None:
        """A dynamic arrival did not wake an idle batcher: arm its periodic empty-queue wake."""
        if st.idle_since is not None and st.timer_at == INF:
            st.timer_at = st.idle_wake(st.t[st.size - 1])
            self.clock.timer(st.m, st.timer_at)

    def _expire(self, st: ModelState, now: float) -> None:
        """Reject the queued requests whose queue timeout has passed (they are at the head: one timeout per model)."""
        timeout = st.timeout_s
        if timeout <= 0.0:
            return
        h = st.head
        end = st.n_arr
        limit = now - timeout + EPS_S
        if h < end and st.t[h] <= limit:
            j = _bisect_right(st.t, limit, h, end)
            st.timed_out.append((h, j, now))
            st.head = j
            if self.on_failed is not None:
                for k in range(h, j):
                    o = st.owner[k]
                    if o < 0 or self.report_all:
                        self.on_failed(o, now, "timeout")

    def _get_dynamic_batch(self, st: ModelState, now: float) -> tuple[float, int, int]:
        """Triton's ``GetDynamicBatch``: (wait seconds or 0 to send, requests to move, their items)."""
        self._expire(st, now)
        h, end = st.head, st.n_arr
        if h >= end:
            return 0.0, 0, 0
        cur = st.cur
        p = cur.items
        max_b, max_p, pref = st.max_batch, st.max_preferred_size, st.preferred
        best_items = best_n = 0
        send_now = False
        if st.all_ones:
            n_q = end - h
            # requests taken while they fit max_batch (the first one always)
            k_fit = min(n_q, max_b - p) if p + n_q > 0 else 0
            if p == 0:
                k_fit = max(k_fit, 1)
            send_now = k_fit < n_q
            for x in pref:  # the largest preferred total reachable
                k = x - p
                if 1 <= k <= k_fit:
                    best_items = best_n = k
            # first examined request whose addition crosses the largest preferred size
            i_c = max(max_p - p, 0)
            examined = min(n_q, k_fit + 1)
            if (p > 0 or i_c >= 1) and i_c < examined:
                cur.saturated = True
                if best_n == 0:  # the crossing marks the pending size before it (a second crossing if that is 0)
                    if i_c > 0:
                        best_items = best_n = i_c
                    elif 1 < examined:
                        best_items = best_n = 1
            pending_n = k_fit
            pending_items = k_fit
        else:
            pending_items = pending_n = 0
            i = h
            while i < end:
                s = st.items[i]
                if p + pending_n != 0:
                    if p + pending_items + s > max_p and best_items == 0:
                        best_items, best_n = pending_items, pending_n
                        cur.saturated = True
                    if p + pending_items + s > max_b:
                        send_now = True
                        break
                pending_items += s
                pending_n += 1
                i += 1
                if p + pending_items in pref:
                    best_items, best_n = pending_items, pending_n
        delay = st.delay_s
        oldest = st.t[h]
        delay_exceeded = delay != 0.0 and now - oldest >= delay - EPS_S
        if best_items != 0 and not delay_exceeded:
            if delay == 0.0:
                cur.saturated = True
            return 0.0, best_n, best_items
        if pending_n == 0:
            return 0.0, 0, 0
        if send_now or p + pending_items >= max_p:
            cur.saturated = True
            return 0.0, pending_n, pending_items
        if delay_exceeded or delay == 0.0:
            return 0.0, pending_n, pending_items
        total = pending_items + p
        nxt = _next_size(pref, total)
        if nxt == 0 and pref:
            nxt = pref[0]
        # size_t in Triton: a next preferred size below the payload underflows, and arrivals never wake the batcher
        st.next_pref = (nxt - p if nxt >= p else NEVER) if nxt else 0
        if not cur.saturated and p != 0 and p not in pref:
            return 0.0, pending_n, pending_items
        wait = delay - (now - oldest)
        if st.timeout_s > 0.0:
            closest = oldest + st.timeout_s
            wait = min(closest - now, wait) if now <= closest else TIMER_RESOLUTION_S
        if wait < TIMER_RESOLUTION_S:
            return 0.0, pending_n, pending_items
        return wait, 0, 0

    def _report_done(self, st: ModelState, p: Payload, now: float) -> None:
        report_all, on_done = self.report_all, self.on_done
        ranges = p.ranges()
        for k in range(0, len(ranges), 2):
            for i in range(ranges[k], ranges[k + 1]):
                o = st.owner[i]
                if o < 0 or report_all:
                    on_done(o, now)


def _has_curves(rule) -> bool:
    """Does any kind of a :class:`~serving_bench.sim.spec.DeviceRule` have a measured co-location curve?"""
    return any(kind.curve is not None for kind in rule.kinds.values())


def _next_size(sizes: tuple, n: int) -> int:
    """The first of ``sizes`` (ascending) above ``n``; 0 when none is."""
    for x in sizes:
        if x > n:
            return x
    return 0


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

