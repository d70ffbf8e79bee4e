"""One evaluation: a candidate ServingConfig on the simulator at the profile's load, scored against the SLOs.

``throughput`` objective: maximise *capacity*, the largest multiple of the profile's load (between ``min_scale`` and
``max_scale``) at which every SLO still holds, reported as req/s offered; the candidate must meet the SLOs at 1x to
be feasible (the planner also uses capacities below 1x: a load that needs several GPUs). ``gpus``
objective: fewest GPUs used among feasible candidates, then capacity. Capacity is found by bisection on a ladder of
scales ``2 ** (i / steps_per_doubling)`` (so schedules are reused), which bounds its error to one rung
(:mod:`serving_bench.tune.capacity`, the same bisection a benchmark runs on real Triton); the load at a scale is
:meth:`Load.at`, grown by the load's rule (superpose or scale).
A candidate meets an SLO when every stated statistic of that model is within its bound and at most
``max_failed_fraction`` of its requests failed (rejected, timed out or errored). Infeasible candidates are ranked by
their worst ``value / bound`` ratio (``violation``), so an unsatisfiable search still names the best achievable.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Mapping

from serving_bench.run.metrics import summarize
from serving_bench.tune import adapters
from serving_bench.tune.capacity import Ladder, Probe, bisect_capacity
from serving_bench.tune.load import Load
from serving_bench.tune.space import Params, SearchSpace

OBJECTIVES = ("throughput", "gpus")
INTERNAL_OBJECTIVES = ("capacity",)  # the planner: largest load multiple, even below 1x


@dataclass(frozen=True)
class ObjectiveConfig:
    name: str = "throughput"
    max_scale: float = 16.0
    min_scale: float = 1.0
    steps_per_doubling: int = 8
    max_failed_fraction: float = 0.001
    sim_seed: int = 0

    @property
    def ladder(self) -> Ladder:
        return Ladder(self.min_scale, self.max_scale, self.steps_per_doubling)


@dataclass(eq=False)
class EvalContext:
    """What every evaluation needs; sent once to each worker (``Executor.map``'s shared object)."""

    space: SearchSpace
    profile: Any
    load: Load
    slos: Mapping[str, Mapping[str, float]]
    objective: ObjectiveConfig = ObjectiveConfig()

    @property
    def offered_rps(self) -> float:
        """Requests per second the load offers at scale 1 (all models)."""
        return self.load.offered_rps

    def summary(self, params: Params, scale: float) -> dict:
        config = self.space.config(params)
        records = adapters.simulate(self.profile, config, self.load.at(scale), self.objective.sim_seed)
        return summarize(records, slos={m: dict(s) for m, s in self.slos.items()})


def check_slos(summary: dict, slos: Mapping[str, Mapping[str, float]], max_failed_fraction: float) -> tuple[bool, float]:
    """(all SLOs met, worst value/bound ratio) for one summary."""
    worst = 0.0
    ok = True
    for model, stats in slos.items():
        s = summary["models"].get(model)
        if s is None:
            return False, math.inf
        c = s["counts"]
        failed = (c["failed"] + c["timeout"]) / max(c["scheduled"], 1)
        if failed > max_failed_fraction:
            ok = False
            worst = max(worst, 1.0 + failed)
        for stat, bound in stats.items():
            value = s.get(f"{stat}_s")
            ratio = math.inf if value is None else value / bound
            worst = max(worst, ratio)
            ok = ok and ratio <= 1.0
    return ok, worst


def _probe(ctx: EvalContext, params: Params, scale: float) -> Probe:
    """``params`` simulated at ``scale``, judged against the SLOs, with the figures a result keeps."""
    summary = ctx.summary(params, scale)
    met, worst = check_slos(summary, ctx.slos, ctx.objective.max_failed_fraction)
    return Probe(scale, met, worst, {
        "throughput_rps": summary["overall"]["throughput_rps"],
        "models": {m: {"p50_s": s["p50_s"], "p99_s": s["p99_s"], "throughput_rps": s["throughput_rps"],
                       "mean_exec_batch": s.get("mean_exec_batch"), "failed": s["counts"]["failed"] +
                       s["counts"]["timeout"]}
                   for m, s in summary["models"].items()}})


def probe_dict(probe: Probe) -> dict:
    """A probe as a result's JSON (``scale``, ``ok``, ``violation`` and its figures)."""
    return {"scale": probe.scale, "ok": probe.ok, "violation": probe.violation, **probe.detail}


def evaluate(ctx: EvalContext, params: Params) -> dict:
    """Simulate ``params`` at 1x and bisect its capacity (:func:`serving_bench.tune.capacity.bisect_capacity`); a
    JSON-able result (see module doc)."""
    t0 = time.perf_counter()
    found = bisect_capacity(lambda scale, attempt: _probe(ctx, params, scale), ctx.objective.ladder)
    at_one = found.step(0).probes[0]
    config = ctx.space.config(params)
    return {
        "feasible": at_one.ok, "violation": at_one.violation,
        "capacity_scale": found.capacity_scale, "capacity_capped": found.capped,
        "capacity_rps": found.capacity_scale * ctx.offered_rps,
        "throughput_rps": at_one.detail["throughput_rps"], "gpus": ctx.space.gpus_used(params),
        "instances": sum(m.instance_count for m in config.models),
        "models": at_one.detail["models"], "probes": sorted(map(probe_dict, found.probes), key=lambda p: p["scale"]),
        "eval_s": time.perf_counter() - t0,
    }


def value(result: dict, objective: str, max_gpus: int = 0) -> float:
    """Scalar score, higher is better; every feasible candidate scores above every infeasible one."""
    if objective == "capacity":
        return result["capacity_scale"] if result["capacity_scale"] > 0 else -float(min(result["violation"], 1e9))
    if not result["feasible"]:
        return -float(min(result["violation"], 1e9))
    if objective == "gpus":
        return (max_gpus + 1 - result["gpus"]) * 1e6 + result["capacity_scale"]
    return float(result["capacity_rps"])


def rank_key(result: dict, key: str, objective: str, max_gpus: int = 0) -> tuple:
    """Sort key (ascending = best first): score, then fewer instances, then the point's key (deterministic)."""
    return (-value(result, objective, max_gpus), result["instances"], key)
