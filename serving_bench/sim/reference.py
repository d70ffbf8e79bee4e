"""The reference engine: the model as SimPy entities, one event per request (slow, plain, the ground truth).

Entities (all on one SimPy ``Environment``, through its public API only):

* an **arrival process** per request stream: waits until each request's time, hands it to its model's queue and,
  when Triton's wake rule says so, asks for that model's batcher to step;
* a **batcher** step per model at the end of an instant (after every state change of that instant: the run loop
  below looks at ``Environment.peek()``), taking one step of :mod:`serving_bench.sim.core` (instances take
  payloads; Triton's batcher loop runs until it waits); its timer is a timeout;
* a **device** per device name: its next planned completion is a timeout, re-planned at the end of an instant in
  which it changed; when it fires the finished batches are taken off the device and their instances freed.

The fast engine (:mod:`serving_bench.sim.fast`) runs the same core with arrivals as arrays and must return identical
records (tested). SimPy schedules by relative delay (``now + delay``), and ``t - now`` added back to ``now`` can miss
``t`` by an ulp, while both engines must agree on times bit for bit (ties between simultaneous events decide the
order of the instant's work). So SimPy's clock here counts in :func:`ticks`: the IEEE-754 bit pattern of the time as
an integer, which orders non-negative floats exactly as their values, so integer delays land exactly.
"""

from __future__ import annotations

import math
import struct

import simpy

from serving_bench.sim.core import Server
from serving_bench.sim.state import Clock


_DOUBLE, _INT = struct.Struct("<d"), struct.Struct("<q")


def ticks(t: float) -> int:
    """SimPy's clock value for time ``t >= 0`` seconds: the bits of the float, as an integer (same order)."""
    return _INT.unpack(_DOUBLE.pack(t + 0.0))[0]  # + 0.0: -0.0 becomes 0.0


def seconds(ticks_: int) -> float:
    return _DOUBLE.unpack(_INT.pack(ticks_))[0]


def delay_to(env: simpy.Environment, t: float) -> int:
    """The integer delay that makes SimPy fire at exactly ``t`` seconds (never in the past)."""
    return max(ticks(t) - env.now, 0)


class SimPyClock(Clock):
    """:class:`serving_bench.sim.state.Clock` on SimPy timeouts; the end-of-instant work (model steps, device
    re-plans, each in the order asked for) is run by :func:`run_simpy`'s loop."""

    def __init__(self, env: simpy.Environment, n_models: int):
        self.env = env
        self.server: Server | None = None
        self.late: list[int] = []  # models to step at the end of this instant, in order
        self.late_set: set[int] = set()
        self.dirty: list = []  # devices to re-plan at the end of this instant, in order
        self.timer_version = [0] * n_models

    @property
    def now(self) -> float:
        return seconds(self.env.now)

    def at(self, t: float, fn) -> simpy.Event:
        """Run ``fn()`` at absolute time ``t`` seconds (an ordinary event of that instant)."""
        event = self.env.timeout(delay_to(self.env, t))
        event.callbacks.append(lambda _ev: fn())
        return event

    def notify(self, m: int) -> None:
        """Step model ``m``'s batcher at the end of this instant (once, however many things notify it)."""
        if m not in self.late_set:
            self.late_set.add(m)
            self.late.append(m)

    def timer(self, m: int, t: float) -> None:
        self.timer_version[m] += 1
        if t < math.inf:
            version = self.timer_version[m]
            self.at(t, lambda: self.timer_version[m] == version and self.notify(m))

    def device_changed(self, device) -> None:
        """Re-plan ``device`` at the end of this instant (once, however often it changes in it)."""
        if device not in self.dirty:
            self.dirty.append(device)

    def replan(self, device) -> None:
        t = device.next_completion(self.now)
        if t < math.inf:
            version = device.version
            self.at(t, lambda: device.version == version and self.server.complete(device, self.now))

    def release(self, m: int, instance: int, t: float) -> None:
        self.at(t, lambda: self.server.release(m, instance, self.now))

    def arrive(self, m: int, t: float, owner: int, items: int) -> None:
        self.at(t, lambda: self.server.arrive(m, self.now, owner, items))

    def call(self, t: float, fn) -> None:
        self.at(t, lambda: fn(self.now))


def _static_arrivals(clock: SimPyClock, m: int):
    """Arrival process of a model whose requests are known up front: one event per request."""
    env = clock.env
    st = clock.server.models[m]
    for t in st.arrivals()[0].tolist():
        yield env.timeout(delay_to(env, t))
        st.admit_until(clock.now)
        if st.wake_predicate() if st.spec.dynamic else st.n_idle:
            clock.notify(m)


def _feed(clock: SimPyClock, feed):
    env = clock.env
    times, ids, items, handler = feed
    for pos in range(len(times)):
        yield env.timeout(delay_to(env, float(times[pos])))
        handler(int(ids[pos]), clock.now, int(items[pos]))


def run_simpy(server_factory, n_models: int, feeds=()) -> Server:
    """Run to completion on SimPy; same contract as :func:`serving_bench.sim.fast.run_fast`. The loop steps SimPy
    while events of the current instant remain, then does the instant's end work: each notified model's step (in
    the order notified), then each changed device's re-plan (in the order changed) — the fast engine's order."""
    env = simpy.Environment()
    clock = SimPyClock(env, n_models)
    server = server_factory(clock)
    server.lazy = False
    clock.server = server
    for st in server.models:
        if st.static and st.size:
            env.process(_static_arrivals(clock, st.m))
    for feed in feeds:
        if len(feed[0]):
            env.process(_feed(clock, feed))
    while True:
        upcoming = env.peek()
        if clock.late and upcoming > env.now:
            m = clock.late.pop(0)
            clock.late_set.discard(m)
            server.step(m, clock.now)
        elif clock.dirty and upcoming > env.now:
            clock.replan(clock.dirty.pop(0))
        elif upcoming == math.inf:
            break
        else:
            env.step()
    return server
