"""Records -> Summary: one function for both targets, so ``validate`` is a diff of two summaries.

Latency is measured from the *intended* time (``done_s - intended_s``): a late client or a stalled server shows up as
latency, not as missing load (coordinated omission). ``service_s = done_s - sent_s`` is what perf_analyzer reports.
Entries listed in ``meta['ensembles']`` (name -> member models, set by the target) get a second copy of their figures
under ``summary['ensembles']``. Latency statistics use the requests whose intended time falls in the measurement
window ``[warmup_s, duration_s - cooldown_s)``; throughput counts completions inside that window. Accounting (counts
by status) covers every scheduled request; ``failed`` means error + rejected everywhere (timeouts are counted
apart, so ``sent = ok + failed + timeout``). An SLO check with no data in the window is ``None`` ("n/a"), not a
miss. All times in seconds; rates per second.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from serving_bench.run.records import STATUSES, Records, counts_of_codes, status_column_codes

PERCENTILES = (50, 90, 95, 99, 99.9)
INTERVAL_CONFIDENCE = 0.95  # of the latency percentiles' intervals (summarize's ``intervals``)
OK = STATUSES.index("ok")


@dataclass(frozen=True)
class MetricSpec:
    """How to read one summary figure: unit and which direction is better."""

    name: str
    unit: str
    better: str  # "lower" | "higher"
    description: str


METRICS = {spec.name: spec for spec in [
    *(MetricSpec(f"p{p:g}_s", "s", "lower", f"{p:g}th percentile latency from intended time") for p in PERCENTILES),
    MetricSpec("mean_s", "s", "lower", "mean latency from intended time"),
    MetricSpec("service_p50_s", "s", "lower", "median send-to-done latency (what perf_analyzer reports)"),
    MetricSpec("service_p99_s", "s", "lower", "99th percentile send-to-done latency"),
    MetricSpec("throughput_rps", "req/s", "higher", "ok responses per second in the window"),
    MetricSpec("throughput_ips", "infer/s", "higher", "ok items (request batch rows) per second in the window"),
    MetricSpec("goodput_rps", "req/s", "higher", "ok responses within the SLO latency per second"),
    MetricSpec("lateness_p50_s", "s", "lower", "median send lateness (sent - intended)"),
    MetricSpec("lateness_p99_s", "s", "lower", "99th percentile send lateness"),
    MetricSpec("lateness_max_s", "s", "lower", "largest send lateness"),
    MetricSpec("mean_exec_batch", "items", "higher",
               "items per executed batch (per execution, Triton's inference_count / execution_count)"),
]}

# Per-model SLO: percentile name ("p99", "p50", "mean") -> bound in seconds.
Slo = Mapping[str, float]


def _percentiles(values: np.ndarray, prefix: str = "") -> dict[str, float | None]:
    if len(values) == 0:
        return {f"{prefix}p{p:g}_s": None for p in PERCENTILES}
    q = np.percentile(values, PERCENTILES)
    return {f"{prefix}p{p:g}_s": float(v) for p, v in zip(PERCENTILES, q)}


def quantile_intervals(values: np.ndarray, qs, confidence: float = INTERVAL_CONFIDENCE
                       ) -> list[tuple[float | None, float | None]]:
    """Distribution-free ``confidence`` interval for each ``q``-quantile of ``qs`` (0 < q < 1) of what ``values``
    sample, in their unit: the order statistics ``X(l) <= x_q <= X(u)``, where the count of values below ``x_q`` is
    Binomial(n, q), chosen so that each end misses with probability at most (1 - confidence) / 2. An end that no order
    statistic reaches is None: too few values to bound it (a p99 of a few hundred requests has no upper end). The
    values are sorted once for all of ``qs``."""
    n = len(values)
    if n == 0:
        return [(None, None) for _ in qs]
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=float)))])
    k = np.arange(n + 1)
    log_choose = log_factorial[n] - log_factorial[k] - log_factorial[n - k]
    ordered = np.sort(values)
    miss = (1.0 - confidence) / 2.0
    out = []
    for q in qs:
        cdf = np.cumsum(np.exp(log_choose + k * np.log(q) + (n - k) * np.log1p(-q)))
        low = int(np.searchsorted(cdf, miss))  # l: P(count <= l - 1) < miss, so P(X(l) <= x_q) > 1 - miss
        high = int(np.searchsorted(cdf, 1.0 - miss)) + 1  # u: P(count <= u - 1) >= 1 - miss
        out.append(((float(ordered[low - 1]) if low >= 1 else None), (float(ordered[high - 1]) if high <= n else None)))
    return out


def simulated_inside(row: Mapping) -> bool | None:
    """Whether a validation row's ``simulated`` value lies in its measured interval (``measured_low`` ..
    ``measured_high``; an open end, None, bounds nothing); None where the row has no interval or no simulated value."""
    low, high, value = row.get("measured_low"), row.get("measured_high"), row.get("simulated")
    if value is None or (low is None and high is None):
        return None
    return (low is None or value >= low) and (high is None or value <= high)


def per_execution_batch(rows: np.ndarray, exec_batch: np.ndarray) -> float | None:
    """Items per executed batch — THE mean batch of serving-bench, per execution as Triton counts it
    (``inference_count / execution_count``), not the request-weighted mean of the batch each request rode in — from
    requests (``rows`` each) and the size of the executed batch each rode in (<= 0: unknown, left out). A request
    of r rows in a batch of E items is r / E of that execution."""
    known = exec_batch > 0
    if not known.any():
        return None
    return float(rows[known].sum() / (rows[known] / exec_batch[known]).sum())


def slo_verdict(checks) -> bool | None:
    """False if any check is missed, None ("n/a") if none is missed but one has no data, else True."""
    checks = list(checks)
    if any(c is False for c in checks):
        return False
    return None if any(c is None for c in checks) else True


@dataclass(frozen=True)
class Columns:
    """A records table's columns as arrays, for summarising millions of rows without per-group table copies."""

    status: np.ndarray  # codes into STATUSES
    intended: np.ndarray
    sent: np.ndarray
    done: np.ndarray
    batch: np.ndarray
    exec_batch: np.ndarray

    @classmethod
    def of(cls, table: pd.DataFrame) -> "Columns":
        return cls(status_column_codes(table["status"]), table["intended_s"].to_numpy(), table["sent_s"].to_numpy(),
                   table["done_s"].to_numpy(), table["batch"].to_numpy(), table["exec_batch"].to_numpy())

    def take(self, rows: np.ndarray) -> "Columns":
        return Columns(*(getattr(self, f.name)[rows] for f in dataclasses.fields(self)))


def summarize_group(cols: Columns, *, window: tuple[float, float], slo: Slo | None = None,
                    intervals: bool = False) -> dict:
    """Summary of one group of requests (a model's rows, or all); ``window`` = (start_s, end_s) of the
    measurement. With ``intervals``, ``intervals_s`` holds each latency percentile's distribution-free confidence
    interval (``"p99": [low, high]``, an end None where the requests are too few to bound it)."""
    start, end = window
    length = max(end - start, 1e-12)
    intended, sent, done, batch = cols.intended, cols.sent, cols.done, cols.batch
    ok = cols.status == OK
    in_window = (intended >= start) & (intended < end)
    measured = ok & in_window
    latency = done[measured] - intended[measured]
    service = done[measured] - sent[measured]
    was_sent = ~np.isnan(sent) & in_window
    lateness = sent[was_sent] - intended[was_sent]
    completed = ok & (done >= start) & (done < end)

    out: dict = {"counts": counts_of_codes(cols.status), "window_s": [start, end]}
    out.update(_percentiles(latency))
    if intervals:
        out["intervals_s"] = {f"p{p:g}": list(interval) for p, interval in
                              zip(PERCENTILES, quantile_intervals(latency, [p / 100.0 for p in PERCENTILES]))}
    out["mean_s"] = float(latency.mean()) if len(latency) else None
    service_q = _percentiles(service, "service_")
    out["service_p50_s"], out["service_p99_s"] = service_q["service_p50_s"], service_q["service_p99_s"]
    out["service_mean_s"] = float(service.mean()) if len(service) else None
    out["throughput_rps"] = float(completed.sum() / length)
    out["throughput_ips"] = float(batch[completed].sum() / length)
    if len(lateness):
        out["lateness_p50_s"], out["lateness_p99_s"] = (float(v) for v in np.percentile(lateness, [50, 99]))
        out["lateness_max_s"] = float(lateness.max())
    else:
        out["lateness_p50_s"] = out["lateness_p99_s"] = out["lateness_max_s"] = None
    out["mean_exec_batch"] = per_execution_batch(batch[measured], cols.exec_batch[measured])

    if slo:
        deadline = max(slo.values())
        good = completed & (done - intended <= deadline)
        out["goodput_rps"] = float(good.sum() / length)
        checks = {}
        for stat, bound in slo.items():
            value = out.get(f"{stat}_s")
            checks[stat] = {"bound_s": bound, "value_s": value, "met": None if value is None else value <= bound}
        out["slo"] = checks
        out["slo_met"] = slo_verdict(c["met"] for c in checks.values())
    else:
        out["goodput_rps"] = out["throughput_rps"]
    return out


def _rows_by_model(model: pd.Series) -> dict[str, np.ndarray]:
    """Row indices of each model (categories in their order, else sorted names), ascending within a model."""
    if hasattr(model, "cat"):
        names, codes = [str(m) for m in model.cat.categories], model.cat.codes.to_numpy()
    else:
        uniques, codes = np.unique(model.to_numpy().astype(str), return_inverse=True)
        names = [str(m) for m in uniques]
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    return {name: order[bounds[i]:bounds[i + 1]] for i, name in enumerate(names)}


def summarize(records: Records, *, slos: Mapping[str, Slo] | None = None, warmup_s: float | None = None,
              cooldown_s: float | None = None, duration_s: float | None = None,
              telemetry: Mapping | None = None, intervals: bool = False) -> dict:
    """Summary per model and overall. Window bounds and SLOs default to the schedule's meta (``records.info.meta``);
    ``intervals``: each model's latency percentiles with their confidence intervals (:func:`summarize_group`)."""
    meta = records.info.meta
    table = records.table
    slos = dict(slos if slos is not None else meta.get("slos", {}))
    warmup_s = float(meta.get("warmup_s", 0.0) if warmup_s is None else warmup_s)
    cooldown_s = float(meta.get("cooldown_s", 0.0) if cooldown_s is None else cooldown_s)
    if duration_s is None:
        duration_s = float(meta.get("duration_s", table["intended_s"].max() if len(table) else 0.0))
    window = (warmup_s, max(duration_s - cooldown_s, warmup_s))
    cols = Columns.of(table)
    summary = {
        "target": records.info.target,
        "partial": bool(records.info.partial),
        "overall": summarize_group(cols, window=window),
        "models": {m: summarize_group(cols.take(rows), window=window, slo=slos.get(m), intervals=intervals)
                   for m, rows in _rows_by_model(table["model"]).items()},
    }
    ensembles = meta.get("ensembles") or {}
    if ensembles:  # an ensemble is requested like a model; listed again here with the members it calls
        summary["ensembles"] = {name: {**summary["models"][name], "members": list(members)}
                                for name, members in ensembles.items() if name in summary["models"]}
    summary["valid"] = all(s.get("slo_met", True) for s in summary["models"].values()) and not summary["partial"]
    # the replay's detection of Triton 2.51's queue-policy collapse (serving_bench.load.collapse): None, or per model
    # the reason and figures; the measurement is still valid (it is what that server did)
    summary["queue_policy_collapse"] = records.info.queue_policy_collapse
    if telemetry is not None:
        summary["telemetry"] = dict(telemetry)
    return summary
