"""One evaluation: a candidate ServingConfig on the simulator at the profile's load, scored against the SLOs.

``throughput`` objective: maximise *capacity*, the largest multiple of the profile's load (between ``min_scale`` and
``max_scale``) at which every SLO still holds, reported as req/s offered; the candidate must meet the SLOs at 1x to
be feasible (the planner also uses capacities below 1x: a load that needs several GPUs). ``gpus``
objective: fewest GPUs used among feasible candidates, then capacity. ``energy`` objective: least energy (or
CPU-seconds, the profile's proxy) per request at the load among feasible candidates
(:func:`~serving_bench.tune.variants.predicted_energy`). A candidate whose instances are predicted to hold more memory
than a device's budget (:func:`~serving_bench.tune.variants.config_memory`) is infeasible without being simulated, and
ranks after every candidate that fits. Capacity is found by bisection on a ladder of
scales ``2 ** (i / steps_per_doubling)`` (so schedules are reused), which bounds its error to one rung
(:mod:`serving_bench.tune.capacity`, the same bisection a benchmark runs on real Triton); the load at a scale is
:meth:`Load.at`, grown by the load's rule (superpose or scale).
A candidate meets an SLO when every stated statistic of that model is within its bound and at most
``max_failed_fraction`` of its requests failed (rejected, timed out or errored). Infeasible candidates are ranked by
their worst ``value / bound`` ratio (``violation``), so an unsatisfiable search still names the best achievable.

With ``confidence`` (``tune --confidence C``) each probe is judged at the upper end of each figure's interval: the
scale's load is simulated ``replications`` times (:class:`~serving_bench.sim.intervals.Replications`: each its own
realisation of the load, simulator seed and draw of the host's speed from ``host_sigma``), and an SLO holds when the
``(1 + C) / 2`` quantile over them of each stated statistic is within its bound (and of the failed share within
``max_failed_fraction``): at ``C = 0.9``, when 95 % of the runs would meet it. It costs ``replications`` simulations
per probe instead of one. Without it (the default) one simulation per probe, judged as it is.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from serving_bench.run.metrics import summarize
from serving_bench.sim.intervals import DEFAULT_REPLICATIONS, Draw, Replications
from serving_bench.tune import adapters
from serving_bench.tune.capacity import Ladder, Probe, bisect_capacity
from serving_bench.tune.load import Load, replica_load
from serving_bench.tune.space import Params, SearchSpace
from serving_bench.tune.variants import config_memory, over_budget, predicted_energy, profile_view

OBJECTIVES = ("throughput", "gpus", "energy")
MEMORY_VIOLATION = 1e6  # the violation of a candidate over the memory budget: 1e6 + memory / budget
INTERNAL_OBJECTIVES = ("capacity",)  # the planner: largest load multiple, even below 1x


@dataclass(frozen=True)
class ObjectiveConfig:
    name: str = "throughput"
    max_scale: float = 16.0
    min_scale: float = 1.0
    steps_per_doubling: int = 8
    max_failed_fraction: float = 0.001
    sim_seed: int = 0
    confidence: float | None = None  # judge each probe at the upper end of its interval (module doc); None: as run
    replications: int = DEFAULT_REPLICATIONS  # behind each judgment with ``confidence``
    host_sigma: float = 0.0  # the host spread the replications draw from
    memory_budget: tuple[tuple[str, int], ...] = ()  # (device, bytes its instances may hold); none: not checked

    @property
    def ladder(self) -> Ladder:
        return Ladder(self.min_scale, self.max_scale, self.steps_per_doubling)

    @property
    def judged_replications(self) -> Replications | None:
        """The replications each probe is judged over (None: one simulation, judged as it is)."""
        if self.confidence is None:
            return None
        return Replications(self.replications, self.confidence, self.host_sigma, self.sim_seed)


@dataclass(eq=False)
class EvalContext:
    """What every evaluation needs; sent once to each worker (``Executor.map``'s shared object)."""

    space: SearchSpace
    profile: Any
    load: Load
    slos: Mapping[str, Mapping[str, float]]
    objective: ObjectiveConfig = ObjectiveConfig()
    _replicas: dict = field(default_factory=dict, init=False, repr=False)  # draw index -> its Load
    _views: dict = field(default_factory=dict, init=False, repr=False)  # chosen entries -> the profile they see

    def __getstate__(self):  # the replicas' schedules and views are rebuilt where the object lands (a worker)
        state = dict(self.__dict__)
        state["_replicas"], state["_views"] = {}, {}
        return state

    def profile_for(self, params: Params):
        """The profile as the simulator sees ``params``: each model with its chosen variant's measurements."""
        chosen = self.space.entries(params)
        key = tuple(sorted(chosen.items()))
        if key not in self._views:
            self._views[key] = profile_view(self.profile, chosen)
        return self._views[key]

    def memory(self, params: Params) -> tuple[dict[str, int], tuple[str, ...]]:
        """(bytes per device ``params``' instances are predicted to hold, models without memory in the profile)."""
        return config_memory(self.profile_for(params), self.space.config(params))

    @property
    def offered_rps(self) -> float:
        """Requests per second the load offers at scale 1 (all models)."""
        return self.load.offered_rps

    def summary(self, params: Params, scale: float) -> dict:
        """``params`` simulated at ``scale``: the run's summary, with its predicted ``energy`` (None where the
        profile has none)."""
        profile = self.profile_for(params)
        records = adapters.simulate(profile, self.space.config(params), self.load.at(scale), self.objective.sim_seed)
        return self._summarize(records, profile)

    def _summarize(self, records, profile) -> dict:
        return dict(summarize(records, slos={m: dict(s) for m, s in self.slos.items()}),
                    energy=predicted_energy(records, profile))

    def replica_summary(self, params: Params, scale: float, draw: Draw) -> dict:
        """``params`` simulated at ``scale`` as replication ``draw`` runs it: its own realisation of the load
        (:func:`~serving_bench.tune.load.replica_load`), seed and host speed."""
        if draw.index not in self._replicas:
            self._replicas[draw.index] = replica_load(self.load, draw.seed)
        profile = self.profile_for(params)
        records = adapters.simulate(profile, self.space.config(params), self._replicas[draw.index].at(scale),
                                    draw.seed, draw.host_speed)
        return self._summarize(records, profile)


FAILED = "failed"  # an SLO figure: a model's share of failed requests (rejected, timed out or errored)


def slo_figures(summary: dict, slos: Mapping[str, Mapping[str, float]]) -> dict[tuple[str, str], float]:
    """What the SLOs judge of one summary: per (model, stat) its value over its bound (infinite where none), per
    (model, :data:`FAILED`) its failed share; an unserved model as (model, "served"), infinite."""
    out: dict[tuple[str, str], float] = {}
    for model, stats in slos.items():
        s = summary["models"].get(model)
        if s is None:
            out[(model, "served")] = math.inf
            continue
        c = s["counts"]
        out[(model, FAILED)] = (c["failed"] + c["timeout"]) / max(c["scheduled"], 1)
        for stat, bound in stats.items():
            value = s.get(f"{stat}_s")
            out[(model, stat)] = math.inf if value is None else value / bound
    return out


def judge(figures: Mapping[tuple[str, str], float], max_failed_fraction: float) -> tuple[bool, float]:
    """(all SLOs met, worst value/bound ratio, a failed share above ``max_failed_fraction`` counting 1 + share)."""
    worst, ok = 0.0, True
    for (_, what), x in figures.items():
        if what == FAILED:
            if x > max_failed_fraction:
                ok, worst = False, max(worst, 1.0 + x)
        else:
            worst, ok = max(worst, x), ok and x <= 1.0
    return ok, worst


def check_slos(summary: dict, slos: Mapping[str, Mapping[str, float]], max_failed_fraction: float) -> tuple[bool, float]:
    """(all SLOs met, worst value/bound ratio) for one summary."""
    return judge(slo_figures(summary, slos), max_failed_fraction)


def _figures(summary: dict) -> dict:
    """A probe's per-model figures from its summary."""
    return {m: {"p50_s": s["p50_s"], "p99_s": s["p99_s"], "throughput_rps": s["throughput_rps"],
                "mean_exec_batch": s.get("mean_exec_batch"), "failed": s["counts"]["failed"] + s["counts"]["timeout"]}
            for m, s in summary["models"].items()}


def _probe(ctx: EvalContext, params: Params, scale: float) -> Probe:
    """``params`` simulated at ``scale``, judged against the SLOs, with the figures a result keeps."""
    if ctx.objective.confidence is not None:
        return _probe_at_confidence(ctx, params, scale)
    summary = ctx.summary(params, scale)
    met, worst = check_slos(summary, ctx.slos, ctx.objective.max_failed_fraction)
    return Probe(scale, met, worst, {"throughput_rps": summary["overall"]["throughput_rps"],
                                     "models": _figures(summary), "energy": summary.get("energy")})


def _probe_at_confidence(ctx: EvalContext, params: Params, scale: float) -> Probe:
    """``params`` at ``scale`` judged at the upper end of each SLO figure's interval over the replications (module
    doc); its figures are the replications' medians, and ``upper`` the judged ends (``model.stat``)."""
    replications = ctx.objective.judged_replications
    summaries = [ctx.replica_summary(params, scale, draw) for draw in replications.draws]
    each = [slo_figures(s, ctx.slos) for s in summaries]
    upper = {key: replications.upper(f[key] for f in each) for key in each[0]}
    met, worst = judge(upper, ctx.objective.max_failed_fraction)
    figures = [_figures(s) for s in summaries]

    def median(model: str, key: str):
        values = [f[model][key] for f in figures if model in f and f[model][key] is not None]
        return float(np.median(values)) if values else None

    models = {m: {key: median(m, key) for key in figures[0][m]} for m in figures[0]}
    return Probe(scale, met, worst, {
        "throughput_rps": float(np.median([s["overall"]["throughput_rps"] for s in summaries])), "models": models,
        "energy": summaries[0].get("energy"),
        "upper": {f"{m}.{what}": x * ctx.slos[m][what] if what in ctx.slos.get(m, {}) else x
                  for (m, what), x in upper.items()}})


def probe_dict(probe: Probe) -> dict:
    """A probe as a result's JSON (``scale``, ``ok``, ``violation`` and its figures)."""
    return {"scale": probe.scale, "ok": probe.ok, "violation": probe.violation, **probe.detail}


def _over_memory(ctx: EvalContext, params: Params, memory: dict[str, int], ratio: float, t0: float) -> dict:
    """The result of a candidate over the memory budget: infeasible, not simulated."""
    return {"feasible": False, "violation": MEMORY_VIOLATION + ratio, "memory_exceeded": True,
            "memory_bytes": memory, "capacity_scale": 0.0, "capacity_capped": False, "capacity_rps": 0.0,
            "throughput_rps": 0.0, "gpus": ctx.space.gpus_used(params),
            "instances": sum(m.instance_count for m in ctx.space.config(params).models), "models": {}, "probes": [],
            "energy": None, "eval_s": time.perf_counter() - t0}


def evaluate(ctx: EvalContext, params: Params) -> dict:
    """Simulate ``params`` at 1x and bisect its capacity (:func:`serving_bench.tune.capacity.bisect_capacity`); a
    JSON-able result (see module doc). A candidate over the memory budget is not simulated."""
    t0 = time.perf_counter()
    memory, _ = ctx.memory(params)
    ratio = over_budget(memory, dict(ctx.objective.memory_budget))
    if ratio > 1.0:
        return _over_memory(ctx, params, memory, ratio, t0)
    found = bisect_capacity(lambda scale, attempt: _probe(ctx, params, scale), ctx.objective.ladder)
    at_one = found.step(0).probes[0]
    config = ctx.space.config(params)
    judged = ctx.objective.judged_replications
    return {
        "feasible": at_one.ok, "violation": at_one.violation,
        "capacity_scale": found.capacity_scale, "capacity_capped": found.capped,
        "capacity_rps": found.capacity_scale * ctx.offered_rps,
        "throughput_rps": at_one.detail["throughput_rps"], "gpus": ctx.space.gpus_used(params),
        "instances": sum(m.instance_count for m in config.models),
        "models": at_one.detail["models"], "probes": sorted(map(probe_dict, found.probes), key=lambda p: p["scale"]),
        "memory_bytes": memory, "energy": at_one.detail.get("energy"), "eval_s": time.perf_counter() - t0,
        **({"judged_at": {"confidence": judged.confidence, "replications": judged.count,
                          "host_spread": judged.host_sigma}} if judged is not None else {}),
    }


def value(result: dict, objective: str, max_gpus: int = 0) -> float:
    """Scalar score, higher is better; every feasible candidate scores above every infeasible one."""
    if objective == "capacity":
        return result["capacity_scale"] if result["capacity_scale"] > 0 else -float(min(result["violation"], 1e9))
    if not result["feasible"]:
        return -float(min(result["violation"], 1e9))
    if objective == "gpus":
        return (max_gpus + 1 - result["gpus"]) * 1e6 + result["capacity_scale"]
    if objective == "energy":
        energy = (result.get("energy") or {}).get("per_request")
        return 1.0 / energy if energy else 0.0
    return float(result["capacity_rps"])


def rank_key(result: dict, key: str, objective: str, max_gpus: int = 0) -> tuple:
    """Sort key (ascending = best first): score, then fewer instances, then the point's key (deterministic)."""
    return (-value(result, objective, max_gpus), result["instances"], key)
