"""A capacity with its interval: each replication finds the capacity on its own, and the interval is taken over them.

    from serving_bench.sim.intervals import Replications
    from serving_bench.tune.capacity import Ladder
    from serving_bench.tune.intervals import CapacityQuestion, capacity_interval
    from serving_bench.tune.load import Load

    question = CapacityQuestion(profile, config, Load(schedule, growth="scale"), {"m": {"p99": 0.05}}, Ladder())
    found = capacity_interval(question, Replications(40, 0.9, profile.host_spread.sigma, seed=0))
    found.low, found.high, found.capacities   # load scales

Replication ``r`` (:class:`~serving_bench.sim.intervals.Replications`) runs its own realisation of the load
(:func:`~serving_bench.tune.load.replica_load`: future traffic is a new one; with ``same_load`` the load itself, as a
benchmark that replays one seeded load at every scale measures it), grown by the load's rule, on its own
simulator seed and on a host of its own speed, and finds the capacity as :func:`~serving_bench.tune.capacity.
bisect_capacity` defines it — the highest rung that met below the lowest that failed, on the same ladder — each probe
one simulation judged by :func:`~serving_bench.tune.objective.check_slos`. Where the SLOs hold for every load up to
some scale and for none above it, the search starts where it is told (``start_scale``: the point prediction) and
walks out in steps of 1, 2, 4 ... rungs until the verdict turns, then bisects: a few probes per replication when
they fall near the start, instead of a whole bisection of the ladder. The interval is the replications' capacities'
(:meth:`~serving_bench.sim.intervals.Replications.interval`); a capacity capped at the top of the ladder counts as
the top. Each replication's capacity is also placed inside its final bracket where its worst ``value / bound`` crosses
1, log-linearly between the two rungs as :func:`~serving_bench.tune.capacity.interpolate` places a measured one
(``crossings``, their interval ``crossing_low`` .. ``crossing_high``): the interval to set beside an interpolated
capacity, not quantised to the ladder's rungs.

Beyond what the profile measured the interval reaches down to it. The profile saw the server answer at most some rate
of model requests (:meth:`~serving_bench.profiles.schema.Profile.request_ceiling_rps`, its busiest calibration run);
the load scale at which this configuration's server answers that rate (an ensemble's request counts once per step) is
the interval's ``ceiling``. Above it the simulator extrapolates the per-request work it measured, and on a CPU host
it is known to over-predict there (docs/accuracy.md): where the replications' interval reaches above the ceiling
(``extrapolated``), its lower ends (``low``, ``crossing_low``) are lowered to the ceiling where they lie above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from serving_bench.profiles.schema import Profile
from serving_bench.run.metrics import summarize
from serving_bench.serving_config import ServingConfig
from serving_bench.sim.intervals import Draw, Replications
from serving_bench.tune import adapters
from serving_bench.tune.capacity import Ladder, zero_of_line
from serving_bench.tune.load import Load, replica_load
from serving_bench.tune.objective import check_slos


@dataclass(frozen=True)
class CapacityQuestion:
    """What a capacity is asked of: ``config`` on ``profile`` under ``load`` (grown by its rule), meeting ``slos``
    (model -> stat -> bound in seconds) with at most ``max_failed_fraction`` of its requests failed, on ``ladder``;
    ``same_load``: every replication runs ``load`` itself (a replay of it), not a realisation of its own (a
    forecast)."""

    profile: Profile
    config: ServingConfig
    load: Load
    slos: Mapping[str, Mapping[str, float]]
    ladder: Ladder = field(default_factory=Ladder)
    max_failed_fraction: float = 0.001
    same_load: bool = False


@dataclass(frozen=True)
class CapacityInterval:
    """The interval ``low`` .. ``high`` (load scales) of the ``capacities`` the replications found (``capped``: a
    replication met the SLOs at the top of the ladder), at ``confidence``, the load grown by ``growth``;
    ``host_spread`` the spread the host speeds were drawn from, ``probes`` the simulations run; ``crossings`` the
    capacities placed inside their brackets (module doc) and ``crossing_low`` .. ``crossing_high`` their interval;
    ``ceiling`` the load scale of the profile's busiest measured run (module doc; None: no calibration run) and
    ``extrapolated`` whether the interval reached above it (its lower ends then lowered to it)."""

    low: float | None
    high: float | None
    capacities: tuple[float, ...]
    capped: tuple[bool, ...]
    confidence: float
    growth: str
    host_spread: float
    seed: int
    probes: int
    crossings: tuple[float, ...] = ()
    crossing_low: float | None = None
    crossing_high: float | None = None
    ceiling: float | None = None
    extrapolated: bool = False

    def to_json(self) -> dict:
        return {"low_scale": self.low, "high_scale": self.high, "capacities": list(self.capacities),
                "capped": list(self.capped), "confidence": self.confidence, "replications": len(self.capacities),
                "growth": self.growth, "host_spread": self.host_spread, "seed": self.seed, "probes": self.probes,
                "crossings": list(self.crossings), "crossing_low_scale": self.crossing_low,
                "crossing_high_scale": self.crossing_high, "ceiling_scale": self.ceiling,
                "extrapolated": self.extrapolated}


def capacity_interval(question: CapacityQuestion, replications: Replications,
                      start_scale: float = 1.0) -> CapacityInterval:
    """The capacity's interval over ``replications`` (module doc), each search starting at the rung of
    ``start_scale`` (> 0)."""
    ladder = question.ladder
    start = ladder.rung(start_scale) if start_scale > 0 else ladder.i_min
    capacities, capped, crossings, probes = [], [], [], 0
    for draw in replications.draws:
        load = question.load if question.same_load else replica_load(question.load, draw.seed)
        violations: dict[int, float] = {}

        def meets(rung: int) -> bool:
            met, violations[rung] = _judge(question, load, draw, ladder.scale(rung))
            return met

        capacity, top, count = climb(meets, ladder, start)
        capacities.append(capacity)
        capped.append(top)
        crossings.append(crossing(capacity, top, violations, ladder))
        probes += count
    low, high = replications.interval(capacities)
    crossing_low, crossing_high = replications.interval(crossings)
    ceiling = ceiling_scale(question)
    extrapolated = ceiling is not None and any(v is not None and v > ceiling for v in (high, crossing_high))
    if extrapolated:
        low, crossing_low = (None if v is None else min(v, ceiling) for v in (low, crossing_low))
    return CapacityInterval(low, high, tuple(capacities), tuple(capped), replications.confidence,
                            question.load.growth, replications.host_sigma, replications.seed, probes,
                            tuple(crossings), crossing_low, crossing_high, ceiling, extrapolated)


def ceiling_scale(question: CapacityQuestion) -> float | None:
    """The load scale at which ``question``'s server answers as many model requests a second as the profile's
    busiest calibration run (module doc); None where the profile has none or the load offers nothing."""
    ceiling = question.profile.request_ceiling_rps()
    base = question.load.base
    if ceiling is None or len(base) == 0:
        return None
    steps = question.config.ensemble_map
    per_entry = np.array([len(steps.get(name, (name,))) for name in base.models], dtype=float)
    model_requests_rps = question.load.offered_rps * float(per_entry[base.model].mean())
    return ceiling / model_requests_rps if model_requests_rps > 0 else None


def _judge(question: CapacityQuestion, load: Load, draw: Draw, scale: float) -> tuple[bool, float]:
    """(whether the SLOs hold, the worst ``value / bound``) at ``scale`` of ``load`` in replication ``draw``'s run."""
    records = adapters.simulate(question.profile, question.config, load.at(scale), draw.seed, draw.host_speed)
    summary = summarize(records, slos={m: dict(s) for m, s in question.slos.items()})
    return check_slos(summary, question.slos, question.max_failed_fraction)


def crossing(capacity: float, capped: bool, violations: Mapping[int, float], ladder: Ladder) -> float:
    """``capacity`` (a rung's scale, the highest that met) placed inside its bracket: where ``log(violation)`` crosses
    0 on the line through the bracket's two rungs (``violations``: rung -> worst ``value / bound``), in
    ``log(scale)``; the bracket's geometric middle where the line gives no crossing inside it (a violation that is
    not a finite positive number), the capacity itself where it has no bracket (none met, or capped)."""
    if capacity <= 0 or capped:
        return capacity
    lo = ladder.rung(capacity)
    v_lo, v_hi = violations.get(lo), violations.get(lo + 1)
    x_lo, x_hi = math.log(capacity), math.log(ladder.scale(lo + 1))
    if v_lo is None or v_hi is None:
        return capacity
    if not (0 < v_lo <= 1 < v_hi < math.inf):
        return math.exp((x_lo + x_hi) / 2)
    return math.exp(zero_of_line(x_lo, x_hi, math.log(v_lo), math.log(v_hi)))


def climb(meets, ladder: Ladder, start: int) -> tuple[float, bool, int]:
    """(capacity, capped, probes) of ``meets(rung) -> bool`` on ``ladder`` searched from rung ``start`` (module
    doc): the capacity and its cap as :func:`~serving_bench.tune.capacity.bisect_capacity` defines them (the ladder
    from ``min(i_min, 0)`` to ``max(i_max, 0)``), each rung probed at most once."""
    bottom, top = min(ladder.i_min, 0), max(ladder.i_max, 0)
    judged: dict[int, bool] = {}

    def ok(rung: int) -> bool:
        if rung not in judged:
            judged[rung] = bool(meets(rung))
        return judged[rung]

    at = min(max(start, bottom), top)
    lo, hi, step = (at, top + 1, 1) if ok(at) else (bottom - 1, at, 1)
    while judged[at] and lo < top:  # walk up while it meets
        rung = min(lo + step, top)
        if not ok(rung):
            hi = rung
            break
        lo, step = rung, 2 * step
    while not judged[at] and hi > bottom:  # walk down while it fails
        rung = max(hi - step, bottom)
        if ok(rung):
            lo = rung
            break
        hi, step = rung, 2 * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return (ladder.scale(lo) if lo >= ladder.i_min else 0.0), hi > top, len(judged)
