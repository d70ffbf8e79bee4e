"""A whole host faster or slower than when its profile was measured: ``at_host_speed(spec, factor)``.

``factor`` multiplies every time the host spends working, as the built :class:`~serving_bench.sim.spec.SimSpec`
holds them: each executed batch's solo service time (every quantile of every table), the cost per extra request in a
batch, an instance's gap after a batch and its take-up of a payload, each request's way in (dispatch) and way out
(client, network), the cold-start extras of a batch, a way and an ensemble, and the ensemble scheduler's cost per
step. ``factor`` > 1 is a slower host (``factor`` 1.1: everything takes 10 % longer, a closed loop's throughput falls
by 1 / 1.1).

What it leaves alone, as no speed of the host changes it: the serving config's times (queue delay, queue timeout),
Triton's batcher sleep, how long a host sat idle before a cold start (the extras' ``idle_s`` / ``gap_s`` points), the
demands and sharing law (shares of a device, no unit of time), the operating system's time slice a way in waits for
behind a long execution (``CoreWait``), and the drift of the host's speed within a run (``sim/drift.py``), which
this factor sets the level of.

The replications of :mod:`serving_bench.sim.intervals` draw one factor per replication from the profile's
``host_spread``; the engine reads the scaled spec as it reads any other (no hook in its loop).
"""

from __future__ import annotations

import dataclasses
import math

from serving_bench.profiles.distributions import EnsembleExtra, IdleEffect
from serving_bench.sim.spec import EnsembleSpec, ModelSpec, SimSpec

IDLE_EXTRAS = ("service_extra_s", "overhead_extra_s", "dispatch_extra_s", "overhead_extra_p90_s",
               "dispatch_extra_p90_s")


def at_host_speed(spec: SimSpec, factor: float) -> SimSpec:
    """``spec`` on a host whose work takes ``factor`` (> 0) times as long (module doc); ``spec`` itself when
    ``factor`` is 1. The result shares nothing mutable with ``spec``."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"a host speed factor must be a finite number > 0, got {factor!r}")
    if factor == 1.0:
        return spec
    return dataclasses.replace(spec, models=[_model(m, factor) for m in spec.models],
                               ensembles=[_ensemble(e, factor) for e in spec.ensembles], step_s=spec.step_s * factor)


def _model(m: ModelSpec, f: float) -> ModelSpec:
    return dataclasses.replace(
        m, tables={d: t * f for d, t in m.tables.items()},
        instance_tables=None if m.instance_tables is None else m.instance_tables * f,
        per_request_s={d: v * f for d, v in m.per_request_s.items()},
        batch_gap_s={d: v * f for d, v in m.batch_gap_s.items()},
        idle={d: _idle(e, f) for d, e in m.idle.items()},
        overhead_grid=[v * f for v in m.overhead_grid], dispatch_grid=[v * f for v in m.dispatch_grid],
        pickup_s={d: v * f for d, v in m.pickup_s.items()})


def _idle(effect: IdleEffect | None, f: float) -> IdleEffect | None:
    if effect is None:
        return None
    return dataclasses.replace(effect, **{k: tuple(v * f for v in getattr(effect, k)) for k in IDLE_EXTRAS})


def _ensemble(e: EnsembleSpec, f: float) -> EnsembleSpec:
    if e.extra is None:
        return dataclasses.replace(e)
    extra = EnsembleExtra(e.extra.gap_s, tuple(v * f for v in e.extra.extra_s),
                          tuple(v * f for v in e.extra.extra_p90_s))
    return dataclasses.replace(e, extra=extra)
