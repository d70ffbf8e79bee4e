# cython: boundscheck=False, wraparound=False, initializedcheck=False
# (compiled without index checks: every index used here is below its list's or array's length by construction)
"""The fast engine: one heap loop over the same :mod:`core` logic, with arrivals kept as arrays.

It never creates an event per request. A model's arrivals are a sorted list; the engine plans only the *next
arrival that would wake the batcher* (found by a binary search on cumulative items) and admits everything before it
in bulk, so the work is per executed batch (plus per waking arrival), not per request. Ordering is the reference's:
events ordered by (time, insertion); all state changes at an instant before the end-of-instant steps, which run in
the order they were requested. ``tests/test_sim.py`` checks that it returns the same records as the SimPy
reference on the same inputs. Devices changed during an instant are re-planned once at its end (after the
end-of-instant steps), in the order they first changed; the reference does the same with events of a priority
after the steps'.
"""

from __future__ import annotations

import math

import numpy as np

from serving_bench.sim.core import Server
from serving_bench.sim.device import Device
from serving_bench.sim.heap import Calendar, Entry, Heap

ARRIVE, FEED, RELEASE, CALL = 0, 1, 2, 3  # one-off events
INF = math.inf


class Event(Entry):
    """A one-off event at time ``key`` (seconds), in insertion order ``seq``: ``kind`` of event; ``target`` the
    function (CALL); ``index`` the model (or feed); ``version`` the instance (RELEASE), the position in the feed
    (FEED) or the owner (ARRIVE, with ``items``). Made by :meth:`FastClock.push`."""

    __slots__ = ("kind", "target", "index", "version", "items")


class Agenda:
    """Work for the end of an instant, in the order asked for, each of ``size`` items (ints below ``size``) at most
    once: the models to step, the devices to re-plan. A ring, so that an instant's bookkeeping allocates nothing."""

    __slots__ = ("ring", "asked", "size", "head", "count")

    def __init__(self, size: int):
        self.ring = np.zeros(size, dtype=np.intp)
        self.asked = np.zeros(size, dtype=np.uint8)
        self.size = size
        self.head = 0
        self.count = 0

    def add(self, i: int) -> None:
        if not self.asked[i]:
            self.asked[i] = 1
            tail = self.head + self.count
            self.ring[tail if tail < self.size else tail - self.size] = i
            self.count += 1

    def take(self) -> int:
        """The oldest item (the agenda is not empty); it may be asked for again from now on."""
        i = int(self.ring[self.head])
        self.head = self.head + 1 if self.head + 1 < self.size else 0
        self.count -= 1
        self.asked[i] = 0
        return i


class FastClock:
    """Implements :class:`serving_bench.sim.state.Clock`: one-off events in a heap; what is re-planned again and again
    — each model's batcher timer and next waking arrival, each device's next completion — at its own place in a
    :class:`~serving_bench.sim.heap.Calendar`, moved when re-planned, never a stale copy left behind. The order is
    the one a heap of copies gives (time, then insertion of the valid copy); a waking arrival is valid by its time,
    so its valid copy is the *first* one planned at that time and still pending, which ``wake_seq`` remembers per
    arrival. Calendar places: model ``m``'s timer at ``m``, its waking arrival at ``n_models + m``, device ``d``'s
    completion at ``2 n_models + d``."""

    def __init__(self, n_models: int):
        self.now = 0.0
        self.heap = Heap()
        self.seq = 0
        self.n_models = n_models
        self.late = Agenda(n_models)  # models to step at the end of this instant
        self.server: Server | None = None
        self.calendar = Calendar(2 * n_models)
        # per static arrival (model m's j-th at wake_base[m] + j): seq of the first wake planned at it (0: none)
        self.wake_seq = np.zeros(0, dtype=np.int64)
        self.wake_base = np.zeros(n_models, dtype=np.int64)
        self.devices: list[Device] = []  # the run's devices, by index
        self.versions: list[int] = []  # each device's version when its completion was planned
        self.dirty = Agenda(0)  # devices changed in this instant, to re-plan at its end

    def push(self, t: float, kind: int, target, index: int, version: int = 0, items: int = 0) -> None:
        """A one-off event at ``t``."""
        event = Event.__new__(Event)
        event.pos = -1
        event.kind = kind
        event.target = target
        event.index = index
        event.version = version
        event.items = items
        self.plan(event, t)

    def plan(self, event: Event, t: float) -> None:
        """(Re-)plan a one-off ``event`` at ``t``, ordered after everything planned before."""
        self.seq += 1
        event.key = t
        event.seq = self.seq
        self.heap.place(event)

    def plan_place(self, i: int, t: float) -> None:
        """(Re-)plan calendar place ``i`` at ``t`` (inf: not at all), ordered after everything planned before."""
        if t < INF:
            self.seq += 1
            self.calendar.plan(i, t, self.seq)
        else:
            self.calendar.unplan(i)

    def notify(self, m: int) -> None:
        self.late.add(m)

    def timer(self, m: int, t: float) -> None:
        self.plan_place(m, t)

    def device_changed(self, device: Device) -> None:
        self.dirty.add(device.index)

    def watch(self, devices: list[Device]) -> None:
        """The run's devices (each at its ``index``), whose changes this clock will hear of."""
        assert all(device.index == i for i, device in enumerate(devices))
        self.devices = devices
        self.versions = [0] * len(devices)
        self.calendar = Calendar(2 * self.n_models + len(devices))
        self.dirty = Agenda(len(devices))

    def replan(self, d: int) -> None:
        """Plan device ``d``'s next completion (at the end of an instant in which it changed)."""
        device = self.devices[d]
        self.versions[d] = device.version
        self.plan_place(2 * self.n_models + d, device.next_completion(self.now))

    def arrive(self, m: int, t: float, owner: int, items: int) -> None:
        self.push(t, ARRIVE, None, m, owner, items)

    def release(self, m: int, instance: int, t: float) -> None:
        self.push(t, RELEASE, None, m, instance)

    def call(self, t: float, fn) -> None:
        self.push(t, CALL, fn, -1)

    def plan_wake(self, m: int) -> None:
        """Plan model ``m``'s next waking arrival (static arrivals only; see the module docstring)."""
        st = self.server.models[m]
        if not st.static:
            return
        i = self.n_models + m
        j = st.waking_arrival()
        if j < 0:
            self.calendar.unplan(i)
            return
        t = st.t[j]
        if self.calendar.keys[i] == t:
            return
        k = self.wake_base[m] + j
        seq = self.wake_seq[k]
        if seq == 0:  # no earlier copy at this time (an arrival not yet come: a copy at it would still be pending)
            self.seq += 1
            seq = self.wake_seq[k] = self.seq
        self.calendar.plan(i, t, seq)


def run_fast(server_factory, n_models: int, feeds=()) -> Server:
    """Run to completion; ``server_factory(clock)`` builds the :class:`Server` on this clock. ``feeds`` are arrival
    streams delivered one event per request (ensembles, models with ``max_queue_size``, requests whose way in is
    simulated): tuples ``(times, record ids, items, handler)``, ``handler(record id, t, items)`` called at each
    time."""
    clock = FastClock(n_models)
    server = server_factory(clock)
    clock.server = server
    clock.watch(list(server.devices.values()))
    sizes = [st.size if st.static else 0 for st in server.models]
    clock.wake_base = np.cumsum([0] + sizes, dtype=np.int64)[:n_models]
    clock.wake_seq = np.zeros(sum(sizes), dtype=np.int64)
    heap = clock.heap
    calendar = clock.calendar
    late = clock.late
    dirty = clock.dirty
    n_models = clock.n_models
    for m in range(n_models):
        clock.plan_wake(m)
    streams = [(np.asarray(times, dtype=np.float64).tolist(), np.asarray(ids, dtype=np.int64).tolist(),
                np.asarray(items, dtype=np.int64).tolist(), handler) for times, ids, items, handler in feeds]
    for f, feed in enumerate(streams):
        if feed[0]:
            clock.push(feed[0][0], FEED, None, f, 0)

    while True:
        i = calendar.first_place()
        next_t = float(calendar.keys[i]) if i >= 0 else INF
        if heap.first_key < next_t:
            next_t = heap.first_key
        if late.count and next_t > clock.now:
            m = late.take()
            server.step(m, clock.now)
            clock.plan_wake(m)
            continue
        if dirty.count and next_t > clock.now:
            clock.replan(dirty.take())
            continue
        if i >= 0 and (not heap.n or calendar.before(i, heap.keys[0], heap.seqs[0])):
            calendar.unplan(i)
            t = clock.now = next_t
            if i < 2 * n_models:  # a batcher's timer or waking arrival
                clock.notify(i % n_models)
            else:
                d = i - 2 * n_models
                device = clock.devices[d]
                planned = clock.versions[d]
                if device.version == planned:
                    server.complete(device, t)
            continue
        if not heap.n:
            break
        event = heap.pop()
        t = clock.now = event.key
        kind = event.kind
        if kind == RELEASE:
            server.release(event.index, event.version, t)
        elif kind == ARRIVE:  # a dynamic arrival (an ensemble step, a closed-loop request)
            server.arrive(event.index, t, event.version, event.items)
        elif kind == CALL:
            event.target(t)
        else:  # FEED: the next request of an arrival stream delivered one by one
            times, ids, items, handler = streams[event.index]
            pos = event.version
            handler(ids[pos], t, items[pos])
            if pos + 1 < len(times):
                event.version = pos + 1
                clock.plan(event, times[pos + 1])
    return server
