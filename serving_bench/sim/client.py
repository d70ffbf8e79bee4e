"""Another client than the one a profile was measured through.

A profile's ways in and out (``dispatch``, ``overhead``) and the host CPU a request costs on them
(``request_demand``) include its sender's own work (``host.sender``). A different client — perf_analyzer, a
production client — spends more or less host CPU per request; where it shares the host's cores with the server (a
CPU host: the profile's ``request_device``), that changes the server's capacity, not only the latency
(docs/notes/tune-history.md#model-analyzer-comparison: perf_analyzer's 103 µs per request against serving-bench's native
sender's 39 µs took 23 % off a 2-core host's closed-loop throughput).

``through_client(profile, extra_cpu_s)`` is the profile as that client would have measured it: every model's way out
grows by ``extra_cpu_s`` seconds spent on the host's cores at full demand (a client's work between an answer and the
next request, one thread's worth), so a request's way in and out keeps the simulated host CPU it had plus
``extra_cpu_s`` busy. The demand is re-weighted over the way it was measured on (``calibrate.measure``: the way in
less an idle instance's take-up, ``pickup_s``, plus the way out), which is what the simulator keeps busy under
dynamic batching. A negative figure (a cheaper client) takes that much off the way out, no quantile below 0.
"""

from __future__ import annotations

import dataclasses
import math

from serving_bench.errors import InputError
from serving_bench.profiles.distributions import Dist
from serving_bench.profiles.schema import Profile
from serving_bench.sim.spec import handoff_share


def client_cpu_s(client_cpu_us: float) -> float:
    """``--client-cpu-us`` (``simulate``, ``tune``) in seconds; :class:`InputError` unless a finite number."""
    if not math.isfinite(client_cpu_us):
        raise InputError("--client-cpu-us", None, f"expected a number of microseconds, got {client_cpu_us}")
    return client_cpu_us * 1e-6


def through_client(profile: Profile, extra_cpu_s: float) -> Profile:
    """``profile`` as measured through a client costing ``extra_cpu_s`` (seconds) more host CPU per request than the
    profile's sender. Models without a ``request_demand`` (requests not simulated on the cores) only get the longer
    way out."""
    if extra_cpu_s == 0.0:
        return profile
    host = profile.devices.get(profile.request_device) if profile.request_device is not None else None
    psi = handoff_share(host) if host is not None else 1.0  # the simulator scales request demands by psi
    models = {}
    for name, model in profile.models.items():
        way_out = profile.overhead_for(name)
        longer = Dist(way_out.q, tuple(max(s + extra_cpu_s, 0.0) for s in way_out.s))
        demand = model.request_demand
        if demand is not None and host is not None:
            pickup_s = max((md.pickup_s for md in model.devices.values()), default=0.0)
            way_in = max(model.dispatch.mean - pickup_s, 0.0) if model.dispatch is not None else 0.0
            cpu_s = psi * demand * (way_in + way_out.mean) + extra_cpu_s  # simulated host CPU per request
            demand = max(cpu_s, 0.0) / (psi * (way_in + longer.mean)) if way_in + longer.mean > 0 else demand
        models[name] = dataclasses.replace(model, overhead=longer, request_demand=demand)
    return dataclasses.replace(profile, models=models)
