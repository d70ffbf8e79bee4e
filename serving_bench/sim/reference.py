"""The reference engine: the model as SimPy entities, one event per request (slow, plain, the ground truth).

Entities (all on one :class:`SimEnv`):

* an **arrival process** per request stream: waits until each request's time, hands it to its model's queue and,
  when Triton's wake rule says so, wakes that model's batcher;
* a **batcher** per model: a process that sleeps on a *late* event (priority after every ordinary event of the same
  instant) and, when woken, takes one step of :mod:`serving_bench.sim.core` (instances take payloads; Triton's
  batcher loop runs until it waits); its timer is an ordinary timeout;
* a **device** per device name: its next planned completion is a timeout; when it fires the finished batches are
  taken off the device and their instances freed.

The fast engine (:mod:`serving_bench.sim.fast`) runs the same core with arrivals as arrays and must return identical
records (tested). SimPy schedules by relative delay (``now + delay``); both engines need the same absolute float
times, so :class:`SimEnv` adds ``at(t)``, which pushes an event at absolute time ``t`` onto SimPy's queue exactly as
``Environment.schedule`` does.
"""

from __future__ import annotations

import math
from heapq import heappush

import simpy
from simpy.events import NORMAL

from serving_bench.sim.core import Server

LATE = NORMAL + 1  # end-of-instant steps run after every ordinary event of the same time
REPLAN = NORMAL + 2  # devices changed in the instant are re-planned after its steps


class SimEnv(simpy.Environment):
    """A SimPy environment that can schedule at an absolute time (bit-exact clocks across engines)."""

    def at(self, t: float, priority: int = NORMAL) -> simpy.Event:
        event = simpy.Event(self)
        event._ok = True  # a triggered event, as Timeout makes one
        event._value = None
        heappush(self._queue, (t, priority, next(self._eid), event))
        return event


class SimPyClock:
    """:class:`serving_bench.sim.core.Clock` on SimPy events."""

    def __init__(self, env: SimEnv, n_models: int):
        self.env = env
        self.server: Server | None = None
        self.wake_events: list[simpy.Event | None] = [None] * n_models
        self.timer_version = [0] * n_models
        self.device_version: dict = {}
        self.replan: set = set()

    @property
    def now(self) -> float:
        return self.env.now

    def notify(self, m: int) -> None:
        """Wake model ``m``'s batcher at the end of this instant (once, however many things notify it)."""
        if self.wake_events[m] is None:
            event = self.env.at(self.env.now, LATE)
            self.wake_events[m] = event
            event.callbacks.append(lambda _ev, m=m: self._step(m))

    def _step(self, m: int) -> None:
        self.wake_events[m] = None
        self.server.step(m, self.env.now)

    def timer(self, m: int, t: float) -> None:
        self.timer_version[m] += 1
        if t < math.inf:
            version = self.timer_version[m]
            event = self.env.at(t)
            event.callbacks.append(lambda _ev, m=m, v=version: self.timer_version[m] == v and self.notify(m))

    def device_changed(self, device) -> None:
        """Re-plan ``device`` at the end of this instant (once, however often it changes in it)."""
        if device not in self.replan:
            self.replan.add(device)
            self.env.at(self.env.now, REPLAN).callbacks.append(lambda _ev, d=device: self._replan(d))

    def _replan(self, device) -> None:
        self.replan.discard(device)
        t = device.next_completion(self.env.now)
        if t < math.inf:
            version = device.version
            event = self.env.at(t)
            event.callbacks.append(
                lambda _ev, d=device, v=version: d.version == v and self.server.complete(d, self.env.now))

    def release(self, m: int, instance: int, t: float) -> None:
        event = self.env.at(t)
        event.callbacks.append(lambda _ev, m=m, i=instance: self.server.release(m, i, self.env.now))

    def arrive(self, m: int, t: float, owner: int, items: int) -> None:
        self.env.process(self._one_arrival(m, t, owner, items))

    def _one_arrival(self, m: int, t: float, owner: int, items: int):
        yield self.env.at(t)
        self.deliver(m, owner, items)

    def deliver(self, m: int, owner: int, items: int) -> None:
        """A dynamically fed request reaches model ``m``'s queue."""
        st = self.server.models[m]
        if st.append(self.env.now, owner, items):
            if st.wake_predicate() if st.spec.dynamic else st.idle:
                self.notify(m)
            elif st.spec.dynamic:
                self.server.idle_arrival(st)


def _static_arrivals(clock: SimPyClock, m: int):
    """Arrival process of a model whose requests are known up front: one event per request."""
    env = clock.env
    st = clock.server.models[m]
    for t in list(st.t):
        yield env.at(t)
        st.admit_until(env.now)
        if st.wake_predicate() if st.spec.dynamic else st.idle:
            clock.notify(m)


def _feed(clock: SimPyClock, feed, ensemble_arrival):
    env = clock.env
    times, ids, items, (what, index) = feed
    for pos in range(len(times)):
        yield env.at(float(times[pos]))
        if what == "model":
            clock.deliver(index, int(ids[pos]), int(items[pos]))
        else:
            ensemble_arrival(index, int(ids[pos]), env.now, int(items[pos]))


def run_simpy(server_factory, n_models: int, feeds=(), ensemble_arrival=None) -> Server:
    """Run to completion on SimPy; same contract as :func:`serving_bench.sim.fast.run_fast`."""
    env = SimEnv()
    clock = SimPyClock(env, n_models)
    server = server_factory(clock)
    server.lazy = False
    clock.server = server
    for st in server.models:
        if st.static and st.t:
            env.process(_static_arrivals(clock, st.m))
    for feed in feeds:
        if len(feed[0]):
            env.process(_feed(clock, feed, ensemble_arrival))
    env.run()
    return server
