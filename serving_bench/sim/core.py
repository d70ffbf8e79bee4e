"""The server logic both engines share: Triton's dynamic batcher, payload queue, instances, devices, ensembles.

The engines (``reference.py``: SimPy processes; ``fast.py``: one heap loop) only decide *when* things happen; this module
decides *what* happens, so both produce identical records: on the run's devices (its base, ``machine.py``: the jobs,
the requests' ways in and out) and with the batcher's decisions of ``batcher.py``. Time semantics, identical in both:

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
from dataclasses import dataclass
from typing import Callable

from serving_bench.sim.batcher import absorb, expire, get_dynamic_batch
from serving_bench.sim.device import Device
from serving_bench.sim.drift import GRID_STEP_S
from serving_bench.sim.machine import Machine
from serving_bench.sim.spec import SimSpec
from serving_bench.sim.state import PAYLOAD_STATES, Clock, ModelState, Payload, recent_mean

UNINIT, READY, SCHEDULED, EXECUTING = PAYLOAD_STATES
INF = math.inf
SQRT_HALF = math.sqrt(0.5)


@dataclass(frozen=True)
class Hooks:
    """Who hears what from the server (the workload). ``on_phase(payload, now)``: a request's way in or out is done
    (:meth:`Machine.start_phase`). ``on_done(owner, now)``: a request is answered; ``on_failed(owner, now,
    outcome)``: the server refused it (``"rejected"``: queue full) or dropped it (``"timeout"``: queue timeout) —
    these two hear of ensemble steps (negative owners) always, of every request when ``report_all`` (a closed loop
    sends the next request when one is answered)."""

    on_done: Callable[[int, float], None] | None = None
    on_failed: Callable[[int, float, str], None] | None = None
    on_phase: Callable[[object, float], None] | None = None
    report_all: bool = False


class Server(Machine):
    """All models and devices of one run (``arrivals[m]``: model ``m``'s static arrivals; ``seed``: the run's); the
    engine calls ``step``, ``complete`` and ``release``, and ``hooks`` hear of the requests' fates (:class:`Hooks`)."""

    def __init__(self, spec: SimSpec, clock: Clock, arrivals: list, seed: int, hooks: Hooks = Hooks(), *,
                 lazy: bool = True):
        super().__init__(spec, clock)
        self.on_done = hooks.on_done  # read per answered request: the typed attributes, not the hooks
        self.on_failed = hooks.on_failed
        self.on_phase = hooks.on_phase
        self.report_all = hooks.report_all
        self.lazy = lazy  # bulk replay of absorbed arrivals (fast engine); the SimPy reference steps per arrival
        self.models = [ModelState(ms, (seed, 1, ms.index), arrivals[ms.index]) for ms in spec.models]
        for st in self.models:
            ms = st.spec
            for device in ms.instance_devices:
                kinds = spec.devices[device].kinds
                st.inst_device.append(self.devices[device])
                st.inst_kinds.append([None] + [kinds[(ms.index, b)] for b in range(1, max(ms.max_batch, 1) + 1)])
                st.inst_pickup_kind.append(kinds.get((ms.index, -1)))
            if spec.drift is not None and ms.drift is not None and ms.drift.service > 0.0:
                st.follow_drift(spec.drift.latent(seed), GRID_STEP_S, ms.drift.service)

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
            absorb(st, now)
        self._dispatch(st, now)
        self._batcher_loop(st, now)
        if st.picked:
            self._start_picked(st, now)

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
            self._take(st, p, st.take_idle(), now)

    def _take(self, st: ModelState, p: Payload, instance: int, now: float) -> None:
        """Instance ``instance`` takes payload ``p``: at once, or after taking it up (its thread waking up: solo
        seconds on its device that stretch when the device is busy). Until then the payload keeps growing — Triton
        marks a payload executing only when its instance runs it — and it starts at the model's step after."""
        pickup = st.inst_pickup[instance]
        if pickup <= 0.0:
            self._start(st, p, instance, now)
            return
        p.state = SCHEDULED
        self._add_job(st.inst_device[instance], now, pickup, st.inst_pickup_kind[instance], p, st.m, instance)

    def _start_picked(self, st: ModelState, now: float) -> None:
        """The payloads whose instance took them up this instant stop growing and start (at the end of the
        instant: requests that arrived in it joined them first)."""
        picked = st.picked
        st.picked = []
        for k in range(len(picked)):
            p, instance = picked[k]
            p.state = EXECUTING
            self._start(st, p, instance, now)

    def _start(self, st: ModelState, p: Payload, instance: int, now: float) -> None:
        """Instance ``instance`` starts payload ``p``: one service-time draw, plus the per-request cost of every
        request after the first, plus the cold-start extra for the instance's recent idle time (the exponentially
        weighted mean of its idle times, this one's included: ``IdleEffect.service_memory``), becomes a job on the
        instance's device."""
        items = p.items
        ui = st.ui
        if ui >= st.u.shape[0]:
            st.refill()
            ui = 0
        st.ui = ui + 1
        u = st.u[ui]
        if st.drift_rho > 0.0:  # the host's speed now: Phi(rho Z(now) + sqrt(1 - rho^2) Phi^-1(u)) (sim/drift.py)
            zi = int(now / st.drift_step) % st.drift_z.shape[0]
            u = 0.5 * math.erfc(-(st.drift_rho * st.drift_z[zi] + st.drift_rest * st.e[ui]) * SQRT_HALF)
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
            idle_s = recent_mean(st.inst_recent_idle[instance], now - st.inst_free_at[instance],
                                 st.inst_memory[instance])
            st.inst_recent_idle[instance] = idle_s
            work += idle.at(idle_s)
        self._add_job(st.inst_device[instance], now, work, st.inst_kinds[instance][items], p, st.m, instance)

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
            if job.kind.batch < 0:  # the instance has taken up its payload: it starts at the model's step
                st.picked.append((p, instance))
                self.clock.notify(m)
                continue
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
            self._expire(st, now)
            wait, n, items = get_dynamic_batch(st, now)
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
        # payload (or start the next one); the fast engine replays that in bulk at the next step (``absorb``)
        st.absorbing = (self.lazy and st.static and st.all_ones and st.delay_s == 0.0 and not st.n_idle
                        and st.head >= st.n_arr and st.next_pref == 0)

    def idle_arrival(self, st: "ModelState") -> None:
        """A dynamic arrival did not wake an idle batcher: arm its periodic empty-queue wake."""
        if st.idle_since is not None and st.timer_at == INF:
            st.timer_at = st.idle_wake(st.t[st.size - 1])
            self.clock.timer(st.m, st.timer_at)

    def _expire(self, st: ModelState, now: float) -> None:
        """Reject the queued requests whose queue timeout has passed (:func:`~serving_bench.sim.batcher.expire`)."""
        h = expire(st, now)
        if self.on_failed is not None:
            for k in range(h, st.head):
                o = st.owner[k]
                if o < 0 or self.report_all:
                    self.on_failed(o, now, "timeout")

    def _report_done(self, st: ModelState, p: Payload, now: float) -> None:
        report_all, on_done = self.report_all, self.on_done
        ranges = p.ranges()
        for k in range(0, len(ranges), 2):
            for i in range(ranges[k], ranges[k + 1]):
                o = st.owner[i]
                if o < 0 or report_all:
                    on_done(o, now)

