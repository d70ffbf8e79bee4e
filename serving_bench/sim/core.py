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
from bisect import bisect_left, bisect_right

import numpy as np

from serving_bench.sim.device import Device, Job
from serving_bench.sim.spec import DEFAULT_WAIT_S, SimSpec

UNINIT, READY, SCHEDULED, EXECUTING = 0, 1, 2, 3
EPS_S = 1e-9  # clock comparisons tolerate 1 ns (Triton's clock resolution)
TIMER_RESOLUTION_S = 1e-6
NEVER = 1 << 62  # Triton waits in whole microseconds; a wait below 1 us is no wait


class Payload:
    """A batch being formed / waiting / running: requests are the local index range(s) ``[a, b)`` of its model."""

    __slots__ = ("ranges", "items", "nreq", "state", "saturated", "start")

    def __init__(self):
        self.ranges: list[list[int]] = []
        self.items = 0
        self.nreq = 0
        self.state = UNINIT
        self.saturated = False
        self.start = math.inf  # batcher start of its oldest request (for the merge-on-dequeue rule)


class Clock:
    """What the core needs from an engine. ``notify`` requests a step of a model at the end of the current instant;
    ``timer`` (re)arms a model's batcher timer (inf: none); ``device_changed`` re-plans a device's next completion;
    ``arrive`` schedules a dynamic arrival (an ensemble step, a closed-loop request) of model ``m`` at ``t``;
    ``release`` calls ``Server.release(m, instance, t)`` at time ``t`` (an instance's gap between batches has
    passed); ``call`` runs ``fn(t)`` at time ``t`` among that instant's state changes (a closed-loop client sending
    its next request)."""

    now: float = 0.0

    def notify(self, m: int) -> None: ...

    def timer(self, m: int, t: float) -> None: ...

    def device_changed(self, device: Device) -> None: ...

    def arrive(self, m: int, t: float, slot: int) -> None: ...

    def release(self, m: int, instance: int, t: float) -> None: ...

    def call(self, t: float, fn) -> None: ...


class ModelState:
    """One served model: its arrivals (local lists), request FIFO, batcher state, payload queue and instances."""

    def __init__(self, spec, rng_seed: tuple, static_arrivals):
        self.spec = spec
        self.m = spec.index
        # local request lists, in arrival order at the server: time, owner (record index, or -1 - ensemble slot), items
        t, owner, items = static_arrivals
        self.t: list[float] = t
        self.owner: list[int] = owner
        self.items: list[int] = items
        arr = np.asarray(items, dtype=np.int64)
        self.cum: list[int] = [0] + np.cumsum(arr).tolist()
        self.all_ones = bool(np.all(arr == 1))
        self.static = True
        self.n_arr = 0  # requests arrived (admitted) so far
        self.head = 0  # first request still in the FIFO
        self.next_pref = 0
        self.cur = Payload()
        self.pqueue: list[Payload] = []  # payloads handed over, not yet executing
        self.pq_head = 0
        n_inst = len(spec.instance_devices)
        self.slots = 2 * n_inst
        self.idle = list(range(n_inst))  # kept sorted: lowest index first
        self.rng = np.random.default_rng(rng_seed)
        self.u = self.rng.random(4096).tolist()
        self.ui = 0
        self.timer_at = math.inf
        self.idle_since: float | None = None  # when the batcher last went to sleep on an empty queue
        self.absorbing = False  # see Server._absorb
        # outputs
        self.rejected: list[tuple[int, float]] = []  # (owner, time) rejected at arrival (queue full)
        self.timed_out: list[tuple[int, int, float]] = []  # (a, b, t)
        self.errors: list[int] = []
        # executed request ranges [out_a, out_b) with their batch's end time, items and instance (flat, one per range)
        self.out_a: list[int] = []
        self.out_b: list[int] = []
        self.out_t: list[float] = []
        self.out_items: list[int] = []
        self.out_inst: list[int] = []
        self.busy_s = 0.0
        self.executions = 0  # executed batches
        self.executed_items = 0
        # per instance, filled by the Server: its device, service-time table, sharing rule per batch size, per-request
        # cost and the gap before it takes the next payload
        self.inst_device: list = []
        self.inst_table: list = []
        self.inst_kinds: list = []
        self.inst_per_request: list[float] = []
        self.inst_gap: list[float] = []
        self.inst_idle: list = []  # IdleEffect or None
        self.inst_free_at: list[float] = []  # when each instance last became free (-inf: never busy)

    # -- arrivals ---------------------------------------------------------------------------------------------------
    def queued_items(self) -> int:
        return self.cum[self.n_arr] - self.cum[self.head]

    def admit_until(self, now: float) -> None:
        """Static arrivals: every request with time <= now has arrived (dynamic ones are appended by ``append``)."""
        if self.static and self.n_arr < len(self.t) and self.t[self.n_arr] <= now:
            self.n_arr = bisect_right(self.t, now, self.n_arr)

    def append(self, t: float, owner: int, items: int) -> bool:
        """A dynamic arrival (rejection mode, ensemble steps): admit it to the FIFO, or reject it when the FIFO
        already holds ``max_queue_size`` requests (Triton: "Exceeds maximum queue size")."""
        spec = self.spec
        if spec.max_queue_size and self.n_arr - self.head >= spec.max_queue_size:
            self.rejected.append((owner, t))
            return False
        self.t.append(t)
        self.owner.append(owner)
        self.items.append(items)
        self.cum.append(self.cum[-1] + items)
        if items != 1:
            self.all_ones = False
        self.n_arr = len(self.t)
        return True

    def wake_predicate(self) -> bool:
        """Would an arrival now wake the batcher (Triton's ``wake_batcher``)?"""
        if self.pqueue_len() >= self.slots:
            return False
        cur = self.cur
        return cur.saturated or cur.state == EXECUTING or self.queued_items() >= self.next_pref

    def pqueue_len(self) -> int:
        return len(self.pqueue) - self.pq_head

    def next_wake_time(self) -> float:
        """Static arrivals: time of the next arrival that would wake the batcher given the current state (inf: none).
        Only the count of queued items changes between steps, so this is a search on the cumulative items."""
        if not self.spec.dynamic:
            return self.t[self.n_arr] if self.n_arr < len(self.t) and self.idle else math.inf
        if self.absorbing:
            return math.inf
        if self.n_arr >= len(self.t) or self.pqueue_len() >= self.slots:
            return math.inf
        cur = self.cur
        need = self.next_pref - self.queued_items()
        if cur.saturated or cur.state == EXECUTING or need <= 1:
            return self.t[self.n_arr]
        j = bisect_left(self.cum, self.cum[self.n_arr] + need, self.n_arr + 1)
        return self.t[j - 1] if j <= len(self.t) else math.inf

    def idle_wake(self, after: float | None = None) -> float:
        """The first of the batcher's 0.5 s empty-queue wakes at or after the next arrival (inf if none is known)."""
        if after is None:
            if self.n_arr >= len(self.t) or not self.static:
                return math.inf
            after = self.t[self.n_arr]
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
        self.devices = {name: Device(name, rule.law, rule.pairs) for name, rule in spec.devices.items()}
        for st in self.models:
            ms = st.spec
            for device in ms.instance_devices:
                kinds = spec.devices[device].kinds
                st.inst_device.append(self.devices[device])
                st.inst_table.append(ms.tables[device])
                st.inst_kinds.append([None] + [kinds[(ms.index, b)] for b in range(1, max(ms.max_batch, 1) + 1)])
                st.inst_per_request.append(ms.per_request_s[device])
                st.inst_gap.append(ms.batch_gap_s.get(device, 0.0))
                st.inst_idle.append(ms.idle.get(device))
                st.inst_free_at.append(-math.inf)
        self.job_seq = 0
        self.ensemble_done: list = []

    # -- the step ----------------------------------------------------------------------------------------------------
    def step(self, m: int, now: float) -> None:
        """End-of-instant work of model ``m``: dispatch to idle instances, then run the batcher until it waits."""
        st = self.models[m]
        st.admit_until(now)
        spec = st.spec
        if not spec.dynamic:
            self._direct(st, now)
            return
        st.idle_since = None
        if st.absorbing:
            self._absorb(st, now)
        self._dispatch(st, now)
        self._batcher_loop(st, now)

    def _direct(self, st: ModelState, now: float) -> None:
        """No dynamic batching: each request is a payload of its own, taken in arrival order by idle instances."""
        while st.idle and st.head < st.n_arr:
            p = Payload()
            i = st.head
            p.ranges.append([i, i + 1])
            p.items = st.items[i] if st.spec.max_batch > 0 else 1
            p.nreq = 1
            st.head = i + 1
            if st.spec.max_batch > 0 and p.items > st.spec.max_batch:
                st.errors.append(i)
                continue
            self._start(st, p, st.idle.pop(0), now)

    def _dispatch(self, st: ModelState, now: float) -> None:
        """Idle instances take the oldest handed-over payloads (merging old unsaturated ones when a delay is set)."""
        spec = st.spec
        while st.idle and st.pq_head < len(st.pqueue):
            p = st.pqueue[st.pq_head]
            st.pqueue[st.pq_head] = None
            st.pq_head += 1
            p.state = EXECUTING
            if spec.delay_s > 0 and spec.max_batch > 1 and not p.saturated:
                while st.pq_head < len(st.pqueue):
                    f = st.pqueue[st.pq_head]
                    if f.saturated or not (now - f.start > spec.delay_s) or p.items + f.items > spec.max_batch:
                        break
                    f.state = EXECUTING
                    p.ranges.extend(f.ranges)
                    p.items += f.items
                    p.nreq += f.nreq
                    st.pqueue[st.pq_head] = None
                    st.pq_head += 1
            if st.pq_head > 64 and st.pq_head * 2 > len(st.pqueue):
                del st.pqueue[:st.pq_head]
                st.pq_head = 0
            self._start(st, p, st.idle.pop(0), now)

    def _start(self, st: ModelState, p: Payload, instance: int, now: float) -> None:
        """Instance ``instance`` starts payload ``p``: one service-time draw, plus the per-request cost of every
        request after the first, plus the cold-start extra for the time the instance sat idle, becomes a job on the
        instance's device."""
        items = p.items
        grid = st.inst_table[instance][items]
        ui = st.ui
        if ui >= len(st.u):
            st.u = st.rng.random(4096).tolist()
            ui = 0
        st.ui = ui + 1
        x = st.u[ui] * (len(grid) - 1)
        i = int(x)
        work = grid[-1] if i >= len(grid) - 1 else grid[i] + (x - i) * (grid[i + 1] - grid[i])
        if p.nreq > 1:
            work += st.inst_per_request[instance] * (p.nreq - 1)
        idle = st.inst_idle[instance]
        if idle is not None:
            work += idle.service_extra(now - st.inst_free_at[instance])
        dev = st.inst_device[instance]
        self.job_seq += 1
        dev.add(now, Job(work, st.inst_kinds[instance][items], self.job_seq, p, (st.m, instance), now))
        self.clock.device_changed(dev)

    def complete(self, dev: Device, now: float) -> None:
        """A device's planned completion time has come: finish the done jobs (their requests are answered now) and
        free their instances, at once or after the instance's measured gap between batches."""
        done = dev.pop_finished(now)
        self.clock.device_changed(dev)
        for job in done:
            if job.instance is None:  # a request's way in or out, not a batch
                self.on_phase(job.payload, now)
                continue
            m, instance = job.instance
            st = self.models[m]
            p = job.payload
            for a, b in p.ranges:
                st.out_a.append(a)
                st.out_b.append(b)
                st.out_t.append(now)
                st.out_items.append(p.items)
                st.out_inst.append(instance)
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
        dev.add(now, Job(work, kind, self.job_seq, payload, None, now))
        self.clock.device_changed(dev)

    def arrive(self, m: int, now: float, owner: int, items: int) -> None:
        """A dynamically fed request reaches model ``m``'s queue at ``now`` (the engines call this)."""
        st = self.models[m]
        if st.append(now, owner, items):
            if st.wake_predicate() if st.spec.dynamic else st.idle:
                self.clock.notify(m)
            elif st.spec.dynamic:
                self.idle_arrival(st)
        elif self.on_failed is not None and (owner < 0 or self.report_all):
            self.on_failed(owner, now, "rejected")

    def release(self, m: int, instance: int, now: float) -> None:
        """Instance ``instance`` of model ``m`` is free again: it joins the idle ones (lowest index first)."""
        st = self.models[m]
        st.idle.insert(bisect_left(st.idle, instance), instance)
        st.inst_free_at[instance] = now
        self.clock.notify(m)

    # -- Triton's batcher thread --------------------------------------------------------------------------------------
    def _batcher_loop(self, st: ModelState, now: float) -> None:
        spec = st.spec
        timer = math.inf
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
                    timer = st.idle_wake()
                break
            if st.pqueue_len() >= st.slots:
                break  # waits for a slot; a payload taken by an instance notifies
            wait, n, items = self._get_dynamic_batch(st, now)
            if wait == 0.0 and n > 0:
                a = st.head
                if cur.ranges and cur.ranges[-1][1] == a:
                    cur.ranges[-1][1] = a + n
                else:
                    cur.ranges.append([a, a + n])
                if cur.nreq == 0:
                    cur.start = st.t[a]
                cur.items += items
                cur.nreq += n
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
        st.absorbing = (self.lazy and st.static and st.all_ones and spec.delay_s == 0.0 and not st.idle
                        and st.head >= st.n_arr and st.next_pref == 0)

    def _absorb(self, st: "ModelState", now: float) -> None:
        """Replay, in bulk, the steps the arrivals since the last step (strictly before ``now``) would each have
        taken: exactly what ``_batcher_loop`` does for one request of 1 item with delay 0 and no idle instance."""
        st.absorbing = False
        end = bisect_left(st.t, now, st.head, st.n_arr)
        i = st.head
        pref = st.spec.preferred
        t = st.t
        while i < end:
            cur = st.cur
            if cur.saturated or cur.state == EXECUTING:
                st.cur = cur = Payload()
            if st.pqueue_len() >= st.slots:
                break
            p = cur.items
            if p == 0:
                n = 1
                cur.start = t[i]
                cur.saturated = 1 in pref
            else:
                x = next(v for v in pref if v > p)
                n = min(x - p, end - i)
                cur.saturated = p + n == x
            if cur.ranges and cur.ranges[-1][1] == i:
                cur.ranges[-1][1] = i + n
            else:
                cur.ranges.append([i, i + n])
            cur.items += n
            cur.nreq += n
            i += n
            if cur.state == UNINIT:
                cur.state = SCHEDULED
                st.pqueue.append(cur)
        st.head = i

    def idle_arrival(self, st: "ModelState") -> None:
        """A dynamic arrival did not wake an idle batcher: arm its periodic empty-queue wake."""
        if st.idle_since is not None and st.timer_at == math.inf:
            st.timer_at = st.idle_wake(st.t[-1])
            self.clock.timer(st.m, st.timer_at)

    def _expire(self, st: ModelState, now: float) -> None:
        """Reject the queued requests whose queue timeout has passed (they are at the head: one timeout per model)."""
        timeout = st.spec.timeout_s
        if timeout <= 0.0:
            return
        h = st.head
        end = st.n_arr
        t = st.t
        limit = now - timeout + EPS_S
        if h < end and t[h] <= limit:
            j = bisect_right(t, limit, h, end)
            st.timed_out.append((h, j, now))
            st.head = j
            if self.on_failed is not None:
                for o in st.owner[h:j]:
                    if o < 0 or self.report_all:
                        self.on_failed(o, now, "timeout")

    def _get_dynamic_batch(self, st: ModelState, now: float) -> tuple[float, int, int]:
        """Triton's ``GetDynamicBatch``: (wait seconds or 0 to send, requests to move, their items)."""
        spec = st.spec
        self._expire(st, now)
        h, end = st.head, st.n_arr
        if h >= end:
            return 0.0, 0, 0
        cur = st.cur
        p = cur.items
        max_b, max_p, pref = spec.max_batch, spec.max_preferred_size, spec.preferred
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
            items = st.items
            pending_items = pending_n = 0
            i = h
            while i < end:
                s = items[i]
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
        delay = spec.delay_s
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
        nxt = 0
        for x in pref:
            if x > total:
                nxt = x
                break
        if nxt == 0 and pref:
            nxt = pref[0]
        # size_t in Triton: a next preferred size below the payload underflows, and arrivals never wake the batcher
        st.next_pref = (nxt - p if nxt >= p else NEVER) if nxt else 0
        if not cur.saturated and p != 0 and p not in pref:
            return 0.0, pending_n, pending_items
        wait = delay - (now - oldest)
        if spec.timeout_s > 0.0:
            closest = oldest + spec.timeout_s
            wait = min(closest - now, wait) if now <= closest else TIMER_RESOLUTION_S
        if wait < TIMER_RESOLUTION_S:
            return 0.0, pending_n, pending_items
        return wait, 0, 0

    def _report_done(self, st: ModelState, p: Payload, now: float) -> None:
        owner, report_all, on_done = st.owner, self.report_all, self.on_done
        for a, b in p.ranges:
            for i in range(a, b):
                o = owner[i]
                if o < 0 or report_all:
                    on_done(o, now)
