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

import heapq
import math

from serving_bench.sim.core import Server

DEVICE, TIMER, WAKE, ARRIVE, FEED, RELEASE, CALL = 0, 1, 2, 3, 4, 5, 6


class FastClock:
    """Implements :class:`serving_bench.sim.core.Clock` on a binary heap."""

    def __init__(self):
        self.now = 0.0
        self.heap: list = []
        self.seq = 0
        self.late: list[int] = []
        self.late_set: set[int] = set()
        self.server: Server | None = None
        self.device_version: dict = {}
        self.timer_version: list[int] = []
        self.wake_at: list[float] = []
        self.dirty: list = []  # devices changed in this instant, in order

    def push(self, t: float, kind: int, target, version) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, target, version))

    def notify(self, m: int) -> None:
        if m not in self.late_set:
            self.late_set.add(m)
            self.late.append(m)

    def timer(self, m: int, t: float) -> None:
        self.timer_version[m] += 1
        if t < math.inf:
            self.push(t, TIMER, m, self.timer_version[m])

    def device_changed(self, device) -> None:
        if device not in self.dirty:
            self.dirty.append(device)

    def arrive(self, m: int, t: float, owner: int, items: int) -> None:
        self.push(t, ARRIVE, m, (owner, items))

    def release(self, m: int, instance: int, t: float) -> None:
        self.push(t, RELEASE, m, instance)

    def call(self, t: float, fn) -> None:
        self.push(t, CALL, fn, None)


def run_fast(server_factory, n_models: int, feeds=()) -> Server:
    """Run to completion; ``server_factory(clock)`` builds the :class:`Server` on this clock. ``feeds`` are arrival
    streams delivered one event per request (ensembles, models with ``max_queue_size``, requests whose way in is
    simulated): tuples ``(times, record ids, items, handler)``, ``handler(record id, t, items)`` called at each
    time."""
    clock = FastClock()
    clock.timer_version = [0] * n_models
    clock.wake_at = [math.inf] * n_models
    server = server_factory(clock)
    clock.server = server
    models = server.models
    heap = clock.heap
    late = clock.late
    late_set = clock.late_set
    pop = heapq.heappop
    timer_version = clock.timer_version
    wake_at = clock.wake_at

    def plan_wake(m: int) -> None:
        st = models[m]
        if not st.static:
            return
        t = st.next_wake_time()
        if t != wake_at[m]:
            wake_at[m] = t
            if t < math.inf:
                clock.push(t, WAKE, m, t)

    for m in range(n_models):
        plan_wake(m)
    feeds = list(feeds)
    for f, feed in enumerate(feeds):
        if len(feed[0]):
            clock.push(float(feed[0][0]), FEED, f, 0)

    arrive = server.arrive
    dirty = clock.dirty
    while True:
        if late and (not heap or heap[0][0] > clock.now):
            m = late.pop(0)
            late_set.discard(m)
            server.step(m, clock.now)
            plan_wake(m)
            continue
        if dirty and (not heap or heap[0][0] > clock.now):
            device = dirty.pop(0)
            t = device.next_completion(clock.now)
            if t < math.inf:
                clock.push(t, DEVICE, device, device.version)
            continue
        if not heap:
            break
        t, _, kind, target, version = pop(heap)
        clock.now = t
        if kind == DEVICE:
            if target.version == version:
                server.complete(target, t)
        elif kind == WAKE:
            if wake_at[target] == version:
                wake_at[target] = math.inf
                clock.notify(target)
        elif kind == TIMER:
            if timer_version[target] == version:
                clock.notify(target)
        elif kind == RELEASE:
            server.release(target, version, t)
        elif kind == ARRIVE:  # a dynamic arrival (an ensemble step, a closed-loop request)
            arrive(target, t, version[0], version[1])
        elif kind == CALL:
            target(t)
        else:  # FEED: the next request of an arrival stream delivered one by one
            times, ids, items, handler = feeds[target]
            pos = version
            handler(int(ids[pos]), t, int(items[pos]))
            if pos + 1 < len(times):
                clock.push(float(times[pos + 1]), FEED, target, pos + 1)
    return server
