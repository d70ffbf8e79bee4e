"""MLPerf-style scenarios and a peak-QPS search, on any :class:`~serving_bench.run.target.Target`.

* **Server** — Poisson arrivals at ``qps`` until both ``min_duration_s`` and ``min_queries`` are reached (LoadGen's
  rule); valid when the ``percentile`` latency (from the intended time) is within ``latency_bound_s`` for every
  model, the run was long enough and complete, and nothing failed.
* **Offline** — every query arrives at t = 0 (the server may batch freely); the figure is throughput, with at most
  ``max_in_flight`` requests outstanding (the target's open-loop cap).
* **SingleStream** — one query at a time (closed loop, concurrency 1); the figure is the 90th percentile latency.
* **peak_qps** — the highest Server ``qps`` that is valid: doubling from the start's ``qps`` until a run fails, then
  bisection until the bracket is within ``tolerance`` (relative); every step is recorded.

Traffic mix (models, shares, batch sizes, input samples, SLOs) comes from a :class:`LoadProfile`; the scenario
replaces its arrival process. Seeds: the profile's, so the same scenario gives the same schedule.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from serving_bench.load.arrivals import ArrivalProcess
from serving_bench.load.profile import LoadProfile, ModelLoad, build_schedule
from serving_bench.run.metrics import summarize
from serving_bench.run.records import Records
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop, Target


@dataclass(frozen=True)
class _Fixed(ArrivalProcess):
    """Arrivals given up front (used for the scenarios' query counts)."""

    name = "fixed"
    times_s: tuple[float, ...] = ()

    def times(self, duration_s, rng):
        return np.asarray(self.times_s, dtype=np.float64)

    def expected_rate(self, duration_s):
        return len(self.times_s) / duration_s if duration_s else 0.0

    def describe(self):
        return {"process": "fixed", "queries": len(self.times_s)}


def _shared_mix(profile: LoadProfile) -> tuple[ModelLoad, ...]:
    """The profile's models as shares of one stream (own streams become shares by their mean rate)."""
    out = []
    for m in profile.models:
        share = m.share if m.share is not None else m.arrival.expected_rate(profile.duration_s)
        out.append(dataclasses.replace(m, share=share, arrival=None))
    return tuple(out)


def _with_arrivals(profile: LoadProfile, times: np.ndarray, duration_s: float, scenario: dict) -> Schedule:
    mix = dataclasses.replace(profile, arrival=_Fixed(tuple(float(t) for t in times)), models=_shared_mix(profile),
                              duration_s=duration_s, warmup_s=min(profile.warmup_s, duration_s / 4),
                              cooldown_s=min(profile.cooldown_s, duration_s / 4))
    schedule = build_schedule(mix)
    schedule.meta["scenario"] = scenario
    return schedule


@dataclass(frozen=True)
class ScenarioResult:
    """What a scenario run gave: the records, their summary, validity with reasons, and the headline figure."""

    name: str
    records: Records
    summary: dict
    valid: bool
    reasons: tuple[str, ...]
    figure: dict


@dataclass(frozen=True)
class Server:
    """MLPerf Server: Poisson at ``qps``; valid when the ``percentile`` latency <= ``latency_bound_s`` (default:
    each model's SLO for that percentile in the profile) and the run was long and complete."""

    qps: float
    latency_bound_s: float | None = None
    percentile: float = 99.0
    min_duration_s: float = 60.0
    min_queries: int = 1024

    def schedule(self, profile: LoadProfile, seed: int | None = None) -> Schedule:
        rng = np.random.default_rng([profile.seed if seed is None else seed, 0x5E])
        need = max(self.min_queries, int(math.ceil(self.qps * self.min_duration_s)))
        times = np.cumsum(rng.exponential(1.0 / self.qps, need))
        while times[-1] < self.min_duration_s:  # LoadGen: keep going until both minimums hold
            times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1.0 / self.qps, need))])
        duration = float(times[-1]) + 1e-6
        return _with_arrivals(profile, times, duration, {"name": "server", **dataclasses.asdict(self)})

    def judge(self, profile: LoadProfile, schedule: Schedule, records: Records) -> ScenarioResult:
        key = f"p{self.percentile:g}"
        slos = {m.name: {key: self.latency_bound_s if self.latency_bound_s is not None else dict(m.slo).get(key)}
                for m in profile.models}
        missing = [m for m, s in slos.items() if s[key] is None]
        if missing:
            raise ValueError(f"no {key} bound for {', '.join(missing)}: give latency_bound_s or an SLO in the profile")
        summary = summarize(records, slos=slos)
        reasons = []
        for name, s in summary["models"].items():
            if not s.get("slo_met", False):
                value = s.get(f"{key}_s")
                reasons.append(f"{name}: {key} {value * 1e3:.2f} ms > {slos[name][key] * 1e3:.2f} ms"
                               if value is not None else f"{name}: no successful request")
        c = summary["overall"]["counts"]
        if c["ok"] < self.min_queries:
            reasons.append(f"{c['ok']} successful queries < {self.min_queries}")
        if schedule.duration_s < self.min_duration_s:
            reasons.append(f"duration {schedule.duration_s:.1f} s < {self.min_duration_s:g} s")
        if c["failed"] + c["timeout"]:
            reasons.append(f"{c['failed'] + c['timeout']} requests failed or timed out")
        if summary["partial"]:
            reasons.append(f"run cut short: {records.info.stop_reason}")
        figure = {"qps": self.qps, "achieved_qps": summary["overall"]["throughput_rps"],
                  f"{key}_s": summary["overall"].get(f"{key}_s"),
                  "lateness_p99_s": summary["overall"].get("lateness_p99_s")}
        return ScenarioResult("server", records, summary, not reasons, tuple(reasons), figure)

    def run(self, target: Target, profile: LoadProfile, seed: int | None = None) -> ScenarioResult:
        schedule = self.schedule(profile, seed)
        return self.judge(profile, schedule, target.run(schedule))


@dataclass(frozen=True)
class Offline:
    """MLPerf Offline: ``queries`` requests all at t = 0; the figure is throughput (first send to last answer)."""

    queries: int = 1024

    def schedule(self, profile: LoadProfile) -> Schedule:
        return _with_arrivals(profile, np.zeros(self.queries), 1e-6, {"name": "offline", "queries": self.queries})

    def run(self, target: Target, profile: LoadProfile) -> ScenarioResult:
        schedule = self.schedule(profile)
        records = target.run(schedule)
        table = records.table
        ok = table[table["status"].astype(str) == "ok"]
        span = float(ok["done_s"].max() - table["sent_s"].min()) if len(ok) else math.nan
        summary = summarize(records, warmup_s=0.0, cooldown_s=0.0, duration_s=1e-6)
        items = float(ok["batch"].sum())
        figure = {"queries": self.queries, "throughput_rps": len(ok) / span if span > 0 else None,
                  "throughput_ips": items / span if span > 0 else None, "span_s": span}
        reasons = [] if len(ok) == len(records) else [f"{len(records) - len(ok)} queries did not succeed"]
        return ScenarioResult("offline", records, summary, not reasons, tuple(reasons), figure)


@dataclass(frozen=True)
class SingleStream:
    """MLPerf SingleStream: one query at a time for ``min_duration_s`` and at least ``min_queries``; the figure is
    the 90th percentile latency, in the target's closed loop."""

    min_duration_s: float = 60.0
    min_queries: int = 1024

    def run(self, target: Target, profile: LoadProfile) -> ScenarioResult:
        n = max(self.min_queries * 4, 4096)
        schedule = _with_arrivals(profile, np.zeros(n), self.min_duration_s,
                                  {"name": "singlestream", **dataclasses.asdict(self)})
        records = target.run(schedule, ClosedLoop(concurrency=1, duration_s=self.min_duration_s))
        summary = summarize(records, warmup_s=0.0, cooldown_s=0.0, duration_s=self.min_duration_s)
        c = summary["overall"]["counts"]
        reasons = []
        if c["ok"] < self.min_queries:
            reasons.append(f"{c['ok']} successful queries < {self.min_queries} in {self.min_duration_s:g} s")
        if c["failed"] + c["timeout"]:
            reasons.append(f"{c['failed'] + c['timeout']} requests failed or timed out")
        figure = {"p90_s": summary["overall"]["p90_s"], "queries": c["ok"]}
        return ScenarioResult("singlestream", records, summary, not reasons, tuple(reasons), figure)


@dataclass(frozen=True)
class PeakResult:
    """The highest valid qps found and every step tried (qps, valid, reasons, figure)."""

    qps: float | None
    steps: tuple[dict, ...] = field(default_factory=tuple)


def peak_qps(target: Target, profile: LoadProfile, start: Server, *, tolerance: float = 0.05, max_steps: int = 12,
             on_step: Callable[[dict], None] | None = None) -> PeakResult:
    """Binary search of the highest Server qps meeting the latency bound (see the module doc): ``start`` is the
    first Server run (its ``qps`` the start of the doubling), every step the same scenario at another ``qps``;
    ``on_step`` is called with each step as it is recorded."""
    steps: list[dict] = []

    def trial(qps: float) -> bool:
        result = dataclasses.replace(start, qps=qps).run(target, profile)
        step = {"qps": qps, "valid": result.valid, "reasons": list(result.reasons), **result.figure}
        steps.append(step)
        if on_step is not None:
            on_step(step)
        return result.valid

    good, bad = None, None
    qps = start.qps
    while len(steps) < max_steps:
        if trial(qps):
            good = qps
            qps *= 2
        else:
            bad = qps
            break
    while good is None and bad is not None and len(steps) < max_steps and bad > 1e-3:
        qps = bad / 2  # even the start failed: halve until something passes
        if trial(qps):
            good = qps
        else:
            bad = qps
    while good is not None and bad is not None and (bad - good) / bad > tolerance and len(steps) < max_steps:
        qps = (good + bad) / 2
        if trial(qps):
            good = qps
        else:
            bad = qps
    return PeakResult(good, tuple(steps))


def scenario_figures(result: Any) -> dict:
    """JSON-able summary of a ScenarioResult or PeakResult."""
    if isinstance(result, PeakResult):
        return {"scenario": "peak_qps", "peak_qps": result.qps, "steps": list(result.steps)}
    return {"scenario": result.name, "valid": result.valid, "reasons": list(result.reasons), **result.figure}

