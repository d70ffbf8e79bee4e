"""Measured co-location curves (optional overrides of the sharing law): per model ``S(k)`` on a server of
``max(colocation)`` instances of every model, and per pair of models on one device ``S_pair(2)`` from the runs with one
instance per model (:func:`~serving_bench.calibrate.alone.pair`)."""

from __future__ import annotations

from functools import partial

from serving_bench.calibrate.estimators import colocation_speedup
from serving_bench.calibrate.lab import Lab
from serving_bench.calibrate.session import Session, Step
from serving_bench.profiles.distributions import Curve
from serving_bench.profiles.schema import PairCurve
from serving_bench.serving_config import default_threads


def curve(lab: Lab, m: str, b: int, usable: list[int], session: Session) -> Curve | None:
    """``S(k)`` of model ``m`` at batch ``b`` for each ``k`` of ``usable``: per round one run at concurrency 1
    (``t_1``) then one at each ``k`` (``t_k``), Triton's mean compute of batches of exactly ``b`` rows;
    ``S(k) = k t_1 / t_k`` per round (:func:`~serving_bench.calibrate.estimators.colocation_speedup` over the
    rounds); None where no round gave one."""
    seconds = lab.plan.config.seconds / 2
    solo_times, ratios = [], {k: [] for k in usable}
    for _ in range(lab.plan.config.rounds):
        t1 = session.execution_time(m, b, 1, seconds)
        solo_times.append(t1)
        for k in usable:
            tk = session.execution_time(m, b, k, seconds)
            if t1 > 0 and tk > 0:
                ratios[k].append(k * t1 / tk)
    points = [(1.0, 1.0)]
    for k, values in ratios.items():
        if values:
            s, why = colocation_speedup(float(k), values, solo_times)
            points.append((float(k), s))
            lab.log(f"{m}: batch {b}: {k} batches at once: S({k}) = {s:.2f} "
                    f"(rounds {', '.join(f'{x:.2f}' for x in values)}; {why})")
    return Curve(b, tuple(k for k, _ in points), tuple(s for _, s in points)) if len(points) > 1 else None


def curve_threads(lab: Lab) -> int:
    """The runtime threads per instance of the curves' server: where the host's cores are spread, as a served
    configuration of that many instances would have; else the plan's."""
    plan = lab.plan
    return default_threads(max(plan.ks) * len(plan.models)) if plan.spread and plan.ks else plan.threads


def curve_steps(lab: Lab) -> list[Step]:
    """Per model a step per batch size of its curves (default 1 and its largest), at the instance counts it can have
    (an external server that does not allow model control: those it serves)."""
    plan = lab.plan
    kmax = max(plan.ks)
    steps = []
    for m in plan.models:
        usable = [k for k in plan.ks if k <= plan.instances_at_most(m, kmax)]
        largest = plan.sizes[m][-1]
        batches = sorted({b for b in (plan.config.colocation_batches or (1, largest)) if b <= largest})
        steps += [((m, b), partial(curve, lab, m, b, usable)) for b in batches] if usable else []
    return steps


def measure_curves(lab: Lab) -> int:
    """The co-location curves into each model's results (none without ``colocation`` counts > 1); the threads per
    instance they were measured at (:func:`curve_threads`)."""
    threads = curve_threads(lab)
    if lab.plan.ks:
        curves: dict = {}
        lab.run_phase(curve_steps(lab), curves, lab.sessions(max(lab.plan.ks), threads), "co-location")
        for (m, _), measured in curves.items():
            if measured is not None:
                lab.results[m].curves.append(measured)
    return threads


def pair_curves(lab: Lab) -> list[PairCurve]:
    """``S_pair(2) = t_a1 / t_a2 + t_b1 / t_b2`` of each measured pair at each of its batch sizes (the median over
    rounds, :func:`~serving_bench.calibrate.estimators.colocation_speedup`)."""
    out = []
    for a, b in lab.plan.pairs:
        for pb in lab.plan.pair_batches(a, b):
            values, solo_a, solo_b = lab.runs[(a, b, pb)]
            if not values:
                continue
            s, why = colocation_speedup(2.0, values, solo_a + solo_b)
            lab.log(f"{a} + {b}: batch {pb}: one batch of each at once: S_pair(2) = {s:.2f} "
                    f"(rounds {', '.join(f'{x:.2f}' for x in values)}; {why})")
            out.append(PairCurve(lab.plan.devices[a], (a, b), Curve(pb, (1.0, 2.0), (1.0, s))))
    return out
