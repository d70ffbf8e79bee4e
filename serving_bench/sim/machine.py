"""The run's devices and the jobs started on them, the base of :class:`~serving_bench.sim.core.Server`: each device
with its sharing rule (``device.py``), the job numbering (the devices' order among jobs started at one instant), and
a request's ways in and out (its *phases*) on the spec's request device, each after its wait for a core where the
spec says so (:class:`~serving_bench.sim.spec.CoreWait`).
"""

from __future__ import annotations

import math
from functools import partial

from serving_bench.sim.device import Device
from serving_bench.sim.spec import SimSpec
from serving_bench.sim.state import Clock

INF = math.inf


class Machine:
    """The devices of ``spec`` on ``clock`` (``devices``: name -> :class:`Device`, in the spec's order) and the jobs
    started on them."""

    def __init__(self, spec: SimSpec, clock: Clock):
        self.spec = spec
        self.clock = clock
        self.core_wait = wait = spec.core_wait  # read per request phase: kept at hand
        self.devices = {name: Device(name, rule.law, rule.pairs, _has_curves(rule), i,
                                     wait.slice_s if wait is not None and name == spec.request_device else INF)
                        for i, (name, rule) in enumerate(spec.devices.items())}
        self.job_seq = 0

    def _add_job(self, dev: Device, now: float, work: float, kind, payload, m: int, instance: int) -> None:
        """Start a job of ``work`` solo seconds of ``kind`` on ``dev`` at ``now``, numbered after every job before it
        (``m``, ``instance``: its model and instance, -1 for a request's phase); the clock hears ``dev`` changed."""
        self.job_seq += 1
        dev.add(now, work, kind, self.job_seq, payload, m, instance)
        self.clock.device_changed(dev)

    def start_phase(self, dev: Device, kind, work: float, payload, now: float, u: float = 1.0,
                    quiet: float = INF) -> None:
        """Start ``work`` solo seconds of a request's way in or out on device ``dev`` (the spec's request device) —
        after waiting for a core where the spec says so (``u``: the phase's uniform draw for that, ``quiet``: the
        seconds the host was quiet before, :class:`~serving_bench.sim.spec.CoreWait`); the server's ``on_phase(payload,
        t)`` hears when it is done."""
        w = self.wait_for_core(dev, u, quiet)
        if w > 0.0:
            self.clock.call(now + w, partial(self._run_phase, dev, kind, work, payload))
            return
        self._run_phase(dev, kind, work, payload, now)

    def wait_for_core(self, dev: Device, u: float, quiet: float = INF) -> float:
        """How long a thread that starts now on ``dev`` waits for a core (s; 0 without a
        :class:`~serving_bench.sim.spec.CoreWait` or a long execution), for its uniform draw ``u`` after ``quiet``
        seconds of quiet."""
        wait = self.core_wait
        if wait is None or dev.long_demand <= 0.0:
            return 0.0
        return wait.wait_s(dev.demand, dev.long_demand, dev.law.capacity, u, quiet)

    def _run_phase(self, dev: Device, kind, work: float, payload, now: float) -> None:
        self._add_job(dev, now, work, kind, payload, -1, -1)


def _has_curves(rule) -> bool:
    """Does any kind of a :class:`~serving_bench.sim.spec.DeviceRule` have a measured co-location curve?"""
    return any(kind.curve is not None for kind in rule.kinds.values())
