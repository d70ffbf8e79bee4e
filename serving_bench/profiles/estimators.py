"""Turning what Triton reports into profile numbers: pure functions over closed-loop runs, Triton's request trace and
its per-batch-size statistics (:mod:`serving_bench.profiles.measure` runs the server and the load; the estimators
and why each is the way it is are described there). Tested on synthetic data in ``tests/test_profile.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from serving_bench.errors import InputError
from serving_bench.profiles.schema import Dist, IdleEffect

MAX_SAMPLES = 2000  # samples kept per distribution (quantiles of more)
MIN_SIGNIFICANT = 0.02  # a co-location slowdown below 2 % is never taken as real


@dataclass
class LoopRun:
    """One run: per model its successful requests' client latency (s, from the intended time, in send order: open
    loop runs include the client's own send lateness, closed loop ones have none), Triton's statistics for the run
    (``load.driver``'s per-model means) and the run's ``perf_counter`` window."""

    latency: dict[str, np.ndarray]
    stats: dict[str, dict]
    window: tuple[float, float]

    def compute_s(self, model: str) -> float:
        """Triton's mean compute time per request in this run (input + infer + output), seconds."""
        s = self.stats.get(model) or {}
        return sum(s.get(f"compute_{p}_mean_s") or 0.0 for p in ("input", "infer", "output"))


@dataclass
class Trace:
    """Triton's per-request timestamps (seconds on ``perf_counter``'s clock), per model, in request order."""

    by_model: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> "Trace":
        """Parse a Triton trace file (a JSON list of ``{"id", "model_name"}`` and ``{"id", "timestamps"}`` items)."""
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise InputError(path, None, f"cannot read Triton's trace: {err}") from None
        entries: dict[int, dict] = {}
        for item in raw:
            entry = entries.setdefault(item.get("id"), {})
            if "model_name" in item:
                entry["model"] = item["model_name"]
            for stamp in item.get("timestamps", ()):
                entry[stamp["name"]] = stamp["ns"] * 1e-9
        keys = ("REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END")
        grouped: dict[str, list] = {}
        for entry in entries.values():
            if "model" in entry and all(k in entry for k in keys):
                grouped.setdefault(entry["model"], []).append(tuple(entry[k] for k in keys))
        out = {}
        for model, rows in grouped.items():
            arr = np.array(sorted(rows))
            out[model] = {k: arr[:, i] for i, k in enumerate(keys)}
        return cls(out)

    def window(self, model: str, window: tuple[float, float]) -> dict[str, np.ndarray]:
        """The model's requests that started inside ``window``."""
        rows = self.by_model.get(model)
        if rows is None:
            return {k: np.zeros(0) for k in ("REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END")}
        sel = (rows["REQUEST_START"] >= window[0]) & (rows["REQUEST_START"] <= window[1])
        return {k: v[sel] for k, v in rows.items()}


def trace_batches(rows: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Executed batches of a trace window: (compute start, compute end, earliest queue start), by start time.
    Requests of one batch share its compute timestamps."""
    if not len(rows["COMPUTE_START"]):
        return np.zeros(0), np.zeros(0), np.zeros(0)
    starts, inverse = np.unique(rows["COMPUTE_START"], return_inverse=True)
    ends = np.zeros(len(starts))
    queued = np.full(len(starts), np.inf)
    np.maximum.at(ends, inverse, rows["COMPUTE_END"])
    np.minimum.at(queued, inverse, rows["QUEUE_START"])
    return starts, ends, queued


def lone_wait_s(config, rows: int) -> float:
    """The queue delay the simulator imposes on a lone request of ``rows`` rows (Triton's dynamic batcher waits
    ``max_queue_delay`` unless the request alone reaches a preferred size or the largest one)."""
    if not config.HasField("dynamic_batching") or config.max_batch_size < 1:
        return 0.0
    db = config.dynamic_batching
    preferred = set(db.preferred_batch_size) or {config.max_batch_size}
    if rows in preferred or rows >= max(preferred):
        return 0.0
    return db.max_queue_delay_microseconds * 1e-6


def thin(samples: np.ndarray) -> Dist:
    samples = np.clip(np.asarray(samples, dtype=float), 1e-7, None)
    if len(samples) > MAX_SAMPLES:
        samples = np.quantile(samples, np.linspace(0, 1, MAX_SAMPLES))
    return Dist.from_samples(samples)


def service_and_overhead(run: LoopRun, trace: Trace | None, model: str, wait_s: float,
                         overhead: float | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Service samples of a concurrency-1 run and, with a trace, per-request overhead and dispatch samples.

    With a trace (requests matched in order: at concurrency 1 they run one after another; the driver's warm-up
    request precedes the run's): service = the batches' compute durations; dispatch = time from the request reaching
    Triton to its compute start, less ``wait_s`` (the batcher's own delay, which the simulator models); overhead =
    client latency - time inside Triton. Without: service = latency - ``overhead`` - ``wait_s`` (``overhead`` given)
    or, if None, latency - (mean latency - Triton's mean compute), the overhead being that constant mean and the
    dispatch part of it."""
    latency = run.latency[model]
    if trace is not None:
        rows = trace.window(model, run.window)
        if len(rows["COMPUTE_START"]) >= len(latency) >= 5:
            rows = {k: v[-len(latency):] for k, v in rows.items()}
            compute = rows["COMPUTE_END"] - rows["COMPUTE_START"]
            dispatch = np.clip(rows["COMPUTE_START"] - rows["REQUEST_START"] - wait_s, 0.0, None)
            return compute, latency - (rows["COMPUTE_END"] - rows["REQUEST_START"]), dispatch
    compute = run.compute_s(model)
    if overhead is None:
        overhead = max(float(latency.mean()) - compute - wait_s, 0.0) if compute > 0 else 0.0
        return latency - overhead - wait_s, np.array([overhead]), None
    return latency - overhead - wait_s, None, None


def batch_gap(run: LoopRun, trace: Trace, model: str) -> tuple[float, int]:
    """Median gap (s) between a batch's end and the next one's start on a busy single instance, and how many
    transitions it is the median of (only those where the next batch was already queued when the previous ended).
    The median: on a shared machine a few stalls of milliseconds dominate the mean of a short run (a mean of 350 us
    against a median of 100 us was seen), and the service samples already carry the machine's stalls; on a quiet
    machine mean and median agree."""
    starts, ends, queued = trace_batches(trace.window(model, run.window))
    if len(starts) < 3:
        return 0.0, 0
    waiting = queued[1:] < ends[:-1]
    gaps = (starts[1:] - ends[:-1])[waiting]
    gaps = gaps[gaps >= 0]
    return (float(np.median(gaps)), len(gaps)) if len(gaps) else (0.0, 0)


def per_request_cost(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
                     service_mean: Callable[[int], float | None]) -> tuple[float, int]:
    """Per-request cost from batches of n one-row requests (``batch_stats`` deltas of one run): the slope of their
    compute time over n, minus the slope of the service time of *one* request of n rows over the same sizes (both
    weighted least squares, weights = executions). Slopes, not levels, so a machine that is uniformly slower during
    this run than during the service measurement does not pass for a per-request cost. Clamped at 0. Returns
    (seconds, executions of n >= 2 it rests on); 0 when fewer than two sizes were executed."""
    ns, ts, ss, ws = [], [], [], []
    for n, (count, total) in after.items():
        c0, t0 = before.get(n, (0, 0))
        count, total = count - c0, total - t0
        s = service_mean(n)
        if count <= 0 or s is None:
            continue
        ns.append(n)
        ts.append(total * 1e-9 / count)
        ss.append(s)
        ws.append(count)
    if len(ns) < 2:
        return 0.0, 0
    n, w = np.array(ns, dtype=float), np.array(ws, dtype=float)
    centred = n - np.average(n, weights=w)
    den = float(np.sum(w * centred ** 2))
    slope_multi = float(np.sum(w * centred * np.array(ts))) / den
    slope_solo = float(np.sum(w * centred * np.array(ss))) / den
    return max(slope_multi - slope_solo, 0.0), int(sum(c for m, c in zip(ns, ws) if m >= 2))


def medians(run: LoopRun, trace: Trace | None, model: str,
             wait_s: float) -> tuple[float, float, float, float | None]:
    """(median service, median overhead, median dispatch, median instance idle before a batch or None) of a
    one-at-a-time run (see :func:`service_and_overhead`). Requests the batcher merged anyway (a stall made them
    overlap) count as one batch: the service is that of single-request batches, the idle time the one between
    consecutive batches. Without a trace the dispatch is part of the overhead (0)."""
    latency = run.latency[model]
    if trace is not None:
        rows = trace.window(model, run.window)
        if len(rows["COMPUTE_START"]) >= len(latency) >= 3:
            rows = {k: v[-len(latency):] for k, v in rows.items()}
            starts, ends, _ = trace_batches(rows)
            _, counts = np.unique(rows["COMPUTE_START"], return_counts=True)
            single = (ends - starts)[counts == 1]
            idle = np.clip(starts[1:] - ends[:-1], 0.0, None)
            dispatch = np.clip(rows["COMPUTE_START"] - rows["REQUEST_START"] - wait_s, 0.0, None)
            return (float(np.median(single if len(single) else ends - starts)),
                    float(np.median(latency - (rows["COMPUTE_END"] - rows["REQUEST_START"]))),
                    float(np.median(dispatch)), float(np.median(idle)) if len(idle) else None)
    compute = run.compute_s(model)
    return compute, float(np.median(latency)) - compute - wait_s, 0.0, None


def idle_effect(runs: Mapping, trace: Trace | None, model: str, wait_s: float) -> IdleEffect | None:
    """The cold-start extras (:class:`IdleEffect`) from the back-to-back run at batch 1 (the hot reference) and the
    spaced runs: per spacing, median service and overhead minus the hot medians (at least 0, and never smaller
    after a longer idle: a longer idle cannot make a start warmer). The service's x is the instance's median idle
    time from the trace (without one: the spacing minus the hot latency); the overhead's x is the spacing."""
    hot_run = runs[(model, "solo", 1)]
    hot_service, hot_overhead, hot_dispatch, hot_idle = medians(hot_run, trace, model, wait_s)
    hot_latency = float(np.mean(hot_run.latency[model]))
    points = sorted(k[2] for k in runs if k[0] == model and k[1] == "idle")
    if not points:
        return None
    s_x, s_y = [hot_idle if hot_idle is not None else 0.0], [0.0]
    o_x, o_y, d_y = [hot_latency], [0.0], [0.0]
    for g in points:
        run = runs[(model, "idle", g)]
        service, overhead, dispatch, idle = medians(run, trace, model, wait_s)
        period = g + hot_latency
        s_x.append(idle if idle is not None else max(period - hot_latency, 0.0))
        s_y.append(max(service - hot_service, 0.0))
        o_x.append(period)
        o_y.append(max(overhead - hot_overhead, 0.0))
        d_y.append(max(dispatch - hot_dispatch, 0.0))

    def monotone(xs, ys):
        order = np.argsort(xs, kind="stable")
        xs, ys = np.asarray(xs)[order], np.maximum.accumulate(np.asarray(ys)[order])
        keep = np.concatenate([[True], np.diff(xs) > 0])
        return tuple(float(x) for x in xs[keep]), tuple(float(y) for y in ys[keep])

    (sx, sy), (ox, oy), (_, dy) = monotone(s_x, s_y), monotone(o_x, o_y), monotone(o_x, d_y)
    return IdleEffect(sx, sy, ox, oy, dy if trace is not None else ())


def significant_speedup(k: float, per_round: Sequence[float], solo: Sequence[float]) -> tuple[float, str]:
    """The co-location speed-up at ``k`` from per-round ratios, with the significance rule of the module docstring.
    Returns (S, a note on how it was decided)."""
    s = float(np.median(per_round))
    s = min(s, k)
    spread = (max(solo) - min(solo)) / float(np.median(solo)) if len(solo) > 1 and np.median(solo) > 0 else 0.0
    floor = max(spread, MIN_SIGNIFICANT)
    slowdown = k / s - 1.0
    if slowdown <= floor:
        return k, f"slowdown {slowdown * 100:.1f} % within noise {floor * 100:.1f} %: S = k"
    return s, f"slowdown {slowdown * 100:.1f} % (noise {floor * 100:.1f} %)"
