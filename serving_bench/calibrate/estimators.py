"""Turning what the server reports into profile numbers: pure functions over closed-loop runs, the batches the server
executed (the runners' execution logs, or Triton's request trace) and Triton's per-batch-size statistics
(:mod:`serving_bench.calibrate.measure` runs the server and the load; the estimators
and why each is the way it is are described there). Tested on synthetic data in ``tests/test_profile.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
from scipy.special import ndtri

from serving_bench.errors import InputError
from serving_bench.profiles.distributions import Dist, EnsembleExtra, IdleEffect, recent_means
from serving_bench.serve.execution_log import Executions

MAX_SAMPLES = 2000  # samples kept per distribution (quantiles of more)


@dataclass
class LoopRun:
    """One run: per model its successful requests, in send order — client latency (s, from the intended time: open
    loop runs include the client's own send lateness, closed loop ones have none), and send and completion times
    (``perf_counter`` seconds, the clock of the runners' execution logs) — Triton's statistics for the run
    (``load.driver``'s per-model means), the run's ``perf_counter`` window and, where the server could say, the batches
    it executed in that window (runners' execution logs or Triton's trace; None: unknown)."""

    latency: dict[str, np.ndarray]
    stats: dict[str, dict]
    window: tuple[float, float]
    sent: dict[str, np.ndarray] = field(default_factory=dict)
    done: dict[str, np.ndarray] = field(default_factory=dict)
    executions: dict[str, Executions] | None = None  # the batches each model executed in the window, where known
    cpu_s: float | None = None  # CPU seconds the server, its stubs and the client used in the run, where known
    sender: str | None = None  # the load driver's sender that ran it (``native`` or ``python``), where known

    def compute_s(self, model: str) -> float:
        """Triton's mean compute time per request in this run (input + infer + output), seconds."""
        s = self.stats.get(model) or {}
        return sum(s.get(f"compute_{p}_mean_s") or 0.0 for p in ("input", "infer", "output"))


class Trace:
    """Triton's request trace (``--trace-config level=TIMESTAMPS``), read as executed batches: an optional second
    source of what :mod:`serving_bench.serve.execution_log` records (off by default: see docs/serve.md)."""

    @staticmethod
    def load(path: Path) -> dict[str, Executions]:
        """Per model the executed batches of a Triton trace file (a JSON list of ``{"id", "model_name"}`` and
        ``{"id", "timestamps"}`` items): requests of one batch share its ``COMPUTE_START``; a batch ends at its
        requests' latest ``COMPUTE_END`` (seconds on ``perf_counter``'s clock)."""
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
        grouped: dict[str, list] = {}
        for entry in entries.values():
            if "model" in entry and "COMPUTE_START" in entry and "COMPUTE_END" in entry:
                grouped.setdefault(entry["model"], []).append((entry["COMPUTE_START"], entry["COMPUTE_END"]))
        out = {}
        for model, rows in grouped.items():
            arr = np.array(rows)
            starts, inverse, requests = np.unique(arr[:, 0], return_inverse=True, return_counts=True)
            ends = np.zeros(len(starts))
            np.maximum.at(ends, inverse, arr[:, 1])
            out[model] = Executions(starts, ends, np.full(len(starts), np.nan), np.zeros(len(starts), np.int32),
                                    requests.astype(np.int32), np.zeros(len(starts), np.int32), ("trace",))
        return out


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


def batches_of(run: LoopRun, model: str) -> Executions | None:
    """The model's executed batches in the run (None when the server did not say or the requests' times are
    unknown)."""
    if run.executions is None or model not in run.sent:
        return None
    return run.executions.get(model, Executions.empty()).window(*run.window)


def served_by(run: LoopRun, batches: Executions, model: str) -> tuple[np.ndarray, Executions]:
    """For the requests of a one-at-a-time run: which were matched to a batch (mask over the run's requests) and, for
    each matched one, the batch that served it — the model's first batch that started after the request was sent,
    if it started before the answer came (a batch the batcher merged from two stalled requests serves both)."""
    sent, done = run.sent[model], run.done[model]
    j = np.searchsorted(batches.start_s, sent)
    matched = j < len(batches)
    matched[matched] = batches.start_s[j[matched]] <= done[matched]
    return matched, batches.select(j[matched])


def matched_batches(run: LoopRun, model: str, minimum: int) -> tuple[np.ndarray, Executions] | None:
    """:func:`served_by` on the model's logged batches of a one-at-a-time run, or None where the server did not log
    them or fewer than ``minimum`` requests were matched."""
    executed = batches_of(run, model)
    if executed is None:
        return None
    matched, batches = served_by(run, executed, model)
    return (matched, batches) if len(batches) >= minimum else None


def hop_s(run: LoopRun, batches: Executions, model: str) -> float:
    """What Triton counts as compute beyond what the runner logged (the shared-memory hop to the stub and back, on
    the instance's clock): Triton's mean compute per request of the run minus the logged mean, at least 0. Runs of
    one request per batch only (then Triton's per-request mean is its per-batch mean); 0 without statistics, and
    ~0 for batches read from Triton's own trace."""
    compute = run.compute_s(model)
    return max(compute - float(np.mean(batches.duration_s)), 0.0) if compute > 0 and len(batches) else 0.0


def service_and_overhead(run: LoopRun, model: str, wait_s: float,
                         overhead: float | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Service samples of a concurrency-1 run and, with the executed batches, per-request overhead and dispatch
    samples.

    With batches (each request matched to its batch, :func:`served_by`; ``h`` = :func:`hop_s`, counted half on each
    side of the runner): service = batch duration + h (what occupies Triton's instance); dispatch = from the send to
    the batch's start, less ``wait_s`` (the batcher's own delay, which the simulator models) and h/2 — the request's
    way to the instance (client, network, Triton's threads); overhead = the rest of the latency — the way back.
    Without: service = latency - ``overhead`` - ``wait_s`` (``overhead`` given) or, if None, latency - (mean latency -
    Triton's mean compute), the overhead being that constant mean and the dispatch part of it."""
    latency = run.latency[model]
    found = matched_batches(run, model, 5)
    if found is not None:
        matched, batches = found
        h = hop_s(run, batches, model)
        sent = run.sent[model][matched]
        dispatch = np.clip(batches.start_s - sent - wait_s - h / 2, 0.0, None)
        back = latency[matched] - (batches.end_s - sent) - h / 2
        return batches.duration_s + h, back, dispatch
    compute = run.compute_s(model)
    if overhead is None:
        overhead = max(float(latency.mean()) - compute - wait_s, 0.0) if compute > 0 else 0.0
        return latency - overhead - wait_s, np.array([overhead]), None
    return latency - overhead - wait_s, None, None


DRIFT_LAGS_MS = (0.5, 5.0, 50.0)  # the times apart at which phase_drift correlates two requests' services
DRIFT_MINIMUM = 50  # matched requests phase_drift needs


def normal_scores(x: np.ndarray) -> np.ndarray:
    """Each value's rank mapped through the inverse standard normal CDF: a sample's shape without its marginal."""
    ranks = np.argsort(np.argsort(x, kind="stable"), kind="stable")
    return ndtri((ranks + 0.5) / len(x))


def phase_drift(run: LoopRun, model: str, wait_s: float, lags_ms: Sequence[float] = DRIFT_LAGS_MS) -> dict | None:
    """How the host's speed moves a request's phases together and its services in time, from a one-at-a-time run of
    one-row requests (each matched to its batch, :func:`service_and_overhead`): the correlations of the normal
    scores of way in and service (``in_service``), way in and way out (``in_out``), service and way out
    (``service_out``), and of the services of two requests ``lags_ms`` apart (``service_by_lag_ms``: each request
    against the first whose batch started at least that much later; a lag with fewer such pairs than
    :data:`DRIFT_MINIMUM` is left out). None with fewer than :data:`DRIFT_MINIMUM` matched requests. Simulated by
    :mod:`serving_bench.sim.drift` where the host's law has ``drift`` (docs/sim.md, "The host's speed drifts")."""
    found = matched_batches(run, model, DRIFT_MINIMUM)
    if found is None:
        return None
    service, way_out, way_in = service_and_overhead(run, model, wait_s, None)
    z_in, z_service, z_out = (normal_scores(x) for x in (way_in, service, way_out))

    def corr(a: np.ndarray, b: np.ndarray) -> float:
        return round(float(np.corrcoef(a, b)[0, 1]), 3)

    start = found[1].start_s
    by_lag = {}
    for lag_ms in lags_ms:
        later = np.searchsorted(start, start + lag_ms / 1e3)
        first = np.flatnonzero(later < len(start))
        if len(first) >= DRIFT_MINIMUM:
            by_lag[f"{lag_ms:g}"] = corr(z_service[first], z_service[later[first]])
    return {"in_service": corr(z_in, z_service), "in_out": corr(z_in, z_out), "service_out": corr(z_service, z_out),
            "service_by_lag_ms": by_lag}


def demands(run: LoopRun, model: str) -> tuple[float | None, float, float | None]:
    """(runner demand, hop, hand-off demand) of a one-at-a-time run of one model.

    * runner demand: cores the runner keeps busy while it computes a batch, its logged CPU over its logged time;
    * hop ``h`` (:func:`hop_s`, seconds): the part of Triton's compute time outside the runner;
    * hand-off demand: cores kept busy by everything else a request costs — the client, Triton's threads, the hop,
      the stubs outside their batches — over the time a request spends outside the runner: ``(total CPU - runner
      CPU) / sum of (latency - duration)``, at most 1 (a request is a chain of hand-offs, one thread at a time).
      CPU time overstates it where threads spin while they wait (they yield the core to real work when it is
      busy): the sharing law's ``psi`` scales it (:mod:`serving_bench.sim.spec`).

    Demands are None where the server did not say."""
    found = matched_batches(run, model, 5)
    if found is None or np.isnan(found[1].cpu_s).any():
        return None, 0.0, None
    matched, batches = found
    h = hop_s(run, batches, model)
    runner_cpu = float(batches.cpu_s.sum())
    runner = runner_cpu / float(batches.duration_s.sum()) if batches.duration_s.sum() > 0 else None
    if run.cpu_s is None:
        return runner, h, None
    outside = float(np.sum(run.latency[model][matched] - batches.duration_s))
    handoff = min(max(run.cpu_s - runner_cpu, 0.0) / outside, 1.0) if outside > 0 else None
    return runner, h, handoff


def gpu_demand(busy_share: float, run: LoopRun, model: str, seconds: float) -> float | None:
    """The share of a GPU one batch keeps busy alone: ``busy_share`` (NVML's share of time a kernel ran over a
    one-at-a-time run of ``model`` lasting ``seconds``) over the share of the run its instance spent executing
    (answered batches x Triton's mean compute time / ``seconds``), at most 1; None where the run executed nothing.
    (Eager resnet50 at batch 1 on an H200: 0.21-0.33, docs/serve.md "GPU check".)"""
    executing = len(run.latency[model]) * run.compute_s(model) / seconds
    return min(1.0, busy_share / executing) if executing > 0 else None


def handoff_point(run: LoopRun, model: str) -> tuple[float, float] | None:
    """(requests per executed batch ``n``, host CPU seconds outside the runner per answered request ``o``) of a run
    of ``model``: the run's CPU less its logged batches' over its answered requests; None where the server did not
    say."""
    executed = batches_of(run, model)
    answered = len(run.latency.get(model, ()))
    if executed is None or run.cpu_s is None or not len(executed) or not answered or np.isnan(executed.cpu_s).any():
        return None
    return answered / len(executed), (run.cpu_s - float(executed.cpu_s.sum())) / answered


def handoff_split(points: Sequence[tuple[float, float] | None]) -> tuple[float, float] | None:
    """(per request, per batch) host CPU seconds outside the runner, from runs of one-row requests whose batches held
    different numbers of requests (:func:`handoff_point` of closed loops at several concurrencies on one instance
    with dynamic batching): ``o = c_r + c_b / n``; least squares of ``o`` on ``1 / n`` gives both (each at least 0).
    Loaded runs are the ones to fit: one request at a time the host idles between requests and its threads' polling
    counts against each (docs/sim.md, "Per request and per batch"). None where a run's server did not say,
    or where the runs batched alike (largest ``n`` within 10 % of the smallest)."""
    if len(points) < 2 or any(p is None for p in points):
        return None
    n, o = np.array(points, dtype=float).T
    if n.max() < 1.1 * n.min():
        return None
    per_batch, per_request = np.polyfit(1 / n, o, 1)
    if per_batch < 0:  # no part per batch: all of it per request
        return float(np.mean(o)), 0.0
    if per_request < 0:  # all of it per batch
        return 0.0, float(np.sum(o / n) / np.sum(1 / n ** 2))
    return float(per_request), float(per_batch)


def pickup_s(run: LoopRun, model: str, wait_s: float, dispatch_mean_s: float) -> float:
    """How long an idle instance takes to take up a lone request's payload: Triton's mean queue time in a
    one-at-a-time run, less the batcher's own delay ``wait_s`` (which the simulator imposes itself), between 0 and
    the request's measured dispatch (the take-up is the end of it)."""
    queue = (run.stats.get(model) or {}).get("queue_mean_s") or 0.0
    return min(max(queue - wait_s, 0.0), dispatch_mean_s)


def batch_gap(run: LoopRun, model: str) -> tuple[float, int]:
    """Gap (s) between a batch's end and the next one's start on a busy single instance (requests of the largest
    size, so one per batch, in send order), and how many transitions it rests on: only those where the next request
    had been sent before the previous batch ended. It is what the instance spends per batch beyond Triton's compute
    time: the mean time from one batch's start to the next one's minus Triton's mean compute per batch in the same
    run, at least 0 — means on both sides, so a stall of the shared machine counts once whichever part it hit (the
    runner's log cannot see the hop to the stub, so the gap is not read off the log directly)."""
    batches = batches_of(run, model)
    if batches is None or run.compute_s(model) <= 0:
        return 0.0, 0
    sent = run.sent[model]
    n = min(len(batches), len(sent))
    if n < 3:
        return 0.0, 0
    batches = batches.select(np.arange(len(batches) - n, len(batches)))
    sent = sent[-n:]
    waiting = sent[1:] < batches.end_s[:-1]
    cycles = np.diff(batches.start_s)[waiting]
    if not len(cycles):
        return 0.0, 0
    return max(float(np.mean(cycles)) - run.compute_s(model), 0.0), len(cycles)


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


def per_request_cpu(solo: Sequence[LoopRun], loaded: Sequence[LoopRun], model: str) -> tuple[float, int] | None:
    """Per-request cost inside a batch as the runner's own CPU (its execution log): over the executed batches of
    the ``loaded`` runs (one-row requests, closed loops with dynamic batching), the slope over ``n`` (requests per
    batch, up to the largest size measured alone) of each batch's CPU less what a batch of ``n`` rows costs one
    request at a time (the ``solo`` runs' mean CPU per batch at each size, interpolated), least squares, clamped at
    0. CPU, not time: on a busy host a batch's time also holds its waits for a core, which the sharing law simulates
    (the time's slope counted them twice: docs/sim.md, "Big batches"); a slope, not a level, so a uniformly slower
    machine does not pass for a cost.
    Returns (CPU seconds per request, batches of 2+ requests it rests on); None where the server logged no CPU or
    fewer than two sizes were executed."""
    sizes, costs = [], []
    for run in solo:
        executed = batches_of(run, model)
        if executed is None or not len(executed):
            continue
        single = executed.select(executed.requests == 1)
        if len(single):
            sizes.append(float(np.median(single.rows)))
            costs.append(float(np.mean(single.cpu_s)))
    found = [b for b in (batches_of(run, model) for run in loaded) if b is not None and len(b)]
    if len(sizes) < 2 or not found:
        return None
    n = np.concatenate([b.requests for b in found]).astype(float)
    cpu = np.concatenate([b.cpu_s for b in found])
    within = n <= max(sizes)  # no extrapolating what a batch of n rows costs alone
    n, cpu = n[within], cpu[within]
    order = np.argsort(sizes)
    if np.isnan(cpu).any() or np.isnan(costs).any() or len(np.unique(n)) < 2:
        return None
    excess = cpu - np.interp(n, np.array(sizes)[order], np.array(costs)[order])
    slope = float(np.polyfit(n, excess, 1)[0])
    return max(slope, 0.0), int(np.sum(n >= 2))


def medians(run: LoopRun, model: str, wait_s: float) -> tuple[float, float, float, float | None]:
    """(median service, median overhead, median dispatch, median instance idle before a batch or None) of a
    one-at-a-time run (see :func:`service_and_overhead`). Requests the batcher merged anyway (a stall made them
    overlap) count as one batch: the service is that of single-request batches, the idle time the one between
    consecutive batches. Without executed batches the dispatch is part of the overhead (0)."""
    latency = run.latency[model]
    found = matched_batches(run, model, 3)
    if found is not None:
        matched, batches = found
        h = hop_s(run, batches, model)
        sent = run.sent[model][matched]
        starts, first = np.unique(batches.start_s, return_index=True)
        distinct = batches.select(first)
        single = distinct.requests <= 1
        service = distinct.duration_s[single] if single.any() else distinct.duration_s
        idle = np.clip(starts[1:] - distinct.end_s[:-1] - h, 0.0, None)
        dispatch = np.clip(batches.start_s - sent - wait_s - h / 2, 0.0, None)
        return (float(np.median(service)) + h,
                float(np.median(latency[matched] - (batches.end_s - sent) - h / 2)),
                float(np.median(dispatch)), float(np.median(idle)) if len(idle) else None)
    compute = run.compute_s(model)
    return compute, float(np.median(latency)) - compute - wait_s, 0.0, None


COLD_BINS = 6  # bins of the cold-start runs' requests (equal counts)
COLD_MINIMUM = 12  # requests a bin needs
COLD_MEMORY = 1 / 8  # the newest idle time's weight in an instance's recent idle time (IdleEffect.service_memory)


def quiet_requests(run: LoopRun, model: str, wait_s: float) -> dict[str, np.ndarray] | None:
    """The requests of an open-loop run of one-row requests that met a quiet server — each alone in its batch, sent
    after the previous one was answered — with, per request: ``since`` (s from the previous request's send),
    ``recent_idle`` (s: the exponentially weighted mean of the instance's idle times before the run's batches up to
    its own, the newest weighing :data:`COLD_MEMORY`, as the simulator keeps it), ``service``, ``way_out`` and
    ``way_in`` (as in :func:`service_and_overhead`). None without logged batches or with fewer than
    ``COLD_MINIMUM`` such requests."""
    found = matched_batches(run, model, COLD_MINIMUM)
    if found is None:
        return None
    matched, batches = found
    h = hop_s(run, batches, model)
    sent_all, done_all = run.sent[model], run.done[model]
    since = np.diff(sent_all, prepend=np.nan)[matched]
    after_answer = (sent_all > np.concatenate([[-np.inf], np.maximum.accumulate(done_all)[:-1]]))[matched]
    starts, first = np.unique(batches.start_s, return_index=True)
    j = np.searchsorted(starts, batches.start_s)
    idles = np.concatenate([[np.nan], starts[1:] - batches.end_s[first][:-1] - h])  # per distinct batch
    recent = np.array(recent_means(idles.tolist(), COLD_MEMORY))  # the first one (nan) starts nothing
    idle, recent_idle = idles[j], recent[j]
    sent = sent_all[matched]
    keep = (batches.requests == 1) & after_answer & (idle > 0)  # nan compares false: the run's first batch
    if keep.sum() < COLD_MINIMUM:
        return None
    phases = {"since": since, "recent_idle": recent_idle, "service": batches.duration_s + h,
              "way_out": run.latency[model][matched] - (batches.end_s - sent) - h / 2,
              "way_in": np.clip(batches.start_s - sent - wait_s - h / 2, 0.0, None)}
    return {k: v[keep] for k, v in phases.items()}


def cold_bins(x: np.ndarray) -> list[np.ndarray]:
    """The indices of ``x`` in :data:`COLD_BINS` bins of equal counts by value (fewer where each would hold under
    :data:`COLD_MINIMUM`; at least one): how the cold-start runs' requests are binned."""
    return np.array_split(np.argsort(x, kind="stable"), max(1, min(COLD_BINS, len(x) // COLD_MINIMUM)))


def cold_starts(runs: Mapping, model: str, wait_s: float) -> IdleEffect | None:
    """The cold-start extras (:class:`IdleEffect`) from the back-to-back run at batch 1 (the hot reference: a closed
    loop, where nothing waits) and the open-loop runs of one-row requests at random quiet times of rising mean (keys
    ``(model, "cold", round)``): the requests that met a quiet server (:func:`quiet_requests`), pooled over the
    rounds, fall into :data:`COLD_BINS` bins of equal counts — by the time since the previous request for the ways in
    and out, by the instance's recent idle time for the service — and each bin gives the median's extra over the hot
    median (the ways also the 90th percentile's over the hot one) at the bin's median time. Each extra is the least
    over the rounds (of the bin's requests in each round: a host busy with something else only ever inflates a
    round), never below 0, never smaller after a longer time (a longer idle cannot make a start warmer), a tail's
    never below its median's.

    Why random quiet times and a recent idle time: how much slower a batch starts depends on the model's recent rate,
    not on its last gap alone. On the 2-core VM an ONNX Runtime model's batches under Poisson arrivals took ~110 us
    more than back to back at any last gap from 0.3 ms on, and the same at fixed spacings of the same mean; keyed
    on the weighted mean of the last ~8 idle times, fixed spacings and Poisson arrivals of every rate agree (docs/
    sim.md, "Cold starts under irregular arrivals")."""
    hot_run = runs[(model, "solo", 1)]
    hot_service, hot_out, hot_in = service_and_overhead(hot_run, model, wait_s, None)
    quiet = [q for k, run in sorted(runs.items(), key=lambda item: str(item[0]))
             if len(k) == 3 and k[:2] == (model, "cold") for q in [quiet_requests(run, model, wait_s)] if q is not None]
    if hot_in is None or not quiet:
        return None
    cold = {name: np.concatenate([q[name] for q in quiet]) for name in quiet[0]}
    rounds = np.concatenate([np.full(len(q["since"]), r) for r, q in enumerate(quiet)])

    def binned(key: str, phase: str, hot: np.ndarray, p: float, x0: float) -> tuple[tuple, tuple]:
        groups = cold_bins(cold[key])
        xs = [x0] + [float(np.median(cold[key][g])) for g in groups]
        ys = [0.0] + [least_over_rounds(cold[phase][g], rounds[g], p) - float(np.quantile(hot, p)) for g in groups]
        return monotone(xs, ys)

    hot_period = float(np.mean(np.diff(hot_run.sent[model]))) if len(hot_run.sent[model]) > 1 else 0.0
    _, _, _, hot_idle = medians(hot_run, model, wait_s)
    sx, sy = binned("recent_idle", "service", hot_service, 0.5, hot_idle or 0.0)
    ox, oy = binned("since", "way_out", hot_out, 0.5, hot_period)
    _, dy = binned("since", "way_in", hot_in, 0.5, hot_period)
    _, oy90 = binned("since", "way_out", hot_out, 0.9, hot_period)
    _, dy90 = binned("since", "way_in", hot_in, 0.9, hot_period)
    return IdleEffect(sx, sy, ox, oy, dy, overhead_extra_p90_s=tuple(map(max, oy90, oy)),
                      dispatch_extra_p90_s=tuple(map(max, dy90, dy)), service_memory=COLD_MEMORY)


def ensemble_extra(since: np.ndarray, measured: np.ndarray, simulated: np.ndarray) -> EnsembleExtra | None:
    """An ensemble's time beyond its members' path (:class:`EnsembleExtra`) from its one-row requests alone on the
    server at random quiet times: per request the time since the previous one (s; the first, not finite, is left
    out), the measured latency (s) and the simulated ones (seeds x requests, s) from a profile without it — its
    members' path. The requests fall into :data:`COLD_BINS` bins of equal counts by that time; each bin gives the
    measured median's excess over the simulated median (the same at the 90th percentile) at the bin's median time,
    never below 0, never smaller after a longer time, the p90's never below the median's. None with fewer than
    :data:`COLD_MINIMUM` requests.

    Why: on the 2-core VM the demo's ensemble alone after 60 ms and more of quiet took 3.4 ms at the median where
    its members' simulated path gave 2.8; the hand-off to its combiner alone took 0.47 ms against 0.26 ms back to
    back (docs/sim.md, "An ensemble's own time")."""
    keep = np.isfinite(since) & np.isfinite(measured) & np.isfinite(simulated).all(axis=0)
    if keep.sum() < COLD_MINIMUM:
        return None
    since, measured, simulated = since[keep], measured[keep], simulated[:, keep]
    groups = cold_bins(since)
    xs = [float(np.median(since[g])) for g in groups]

    def excess(p: float) -> list[float]:
        return [float(np.quantile(measured[g], p) - np.quantile(simulated[:, g], p)) for g in groups]

    gaps, median = monotone(xs, excess(0.5))
    _, p90 = monotone(xs, excess(0.9))
    return EnsembleExtra(gaps, median, tuple(map(max, p90, median)))


def least_over_rounds(values: np.ndarray, rounds: np.ndarray, p: float) -> float:
    """The least over the rounds of the ``p``-quantile of each round's ``values`` (rounds with at least
    ``COLD_MINIMUM // 2`` of them; all pooled where none has)."""
    counted = [values[rounds == r] for r in np.unique(rounds) if (rounds == r).sum() >= COLD_MINIMUM // 2]
    return min(float(np.quantile(v, p)) for v in counted) if counted else float(np.quantile(values, p))


def monotone(xs: Sequence[float], ys: Sequence[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Points sorted by x, each y at least 0 and at least every y before it, one point per x (the first)."""
    order = np.argsort(xs, kind="stable")
    xs, ys = np.asarray(xs, dtype=float)[order], np.maximum.accumulate(np.maximum(np.asarray(ys, dtype=float)[order],
                                                                                   0.0))
    keep = np.concatenate([[True], np.diff(xs) > 0])
    return tuple(float(x) for x in xs[keep]), tuple(float(y) for y in ys[keep])


QUIET_MEMORY = 1 / 8  # the newest gap's weight in the host's recent quiet time (CoreWait.memory)
WAITED_S = 0.001  # a way in this much longer than the model's usual one beside no long execution waited for a core
WAIT_MINIMUM = 20  # requests sent during a long execution that the wait's estimate needs
LENGTH_MINIMUM = 10  # waits (> WAITED_S) a run's rate needs for its own length (QuietWait.slice_quiet_s)
QUIET_GRID_S = np.geomspace(5e-4, 1.0, 61)  # the quiet times the estimate searches
P_GRID = np.linspace(0.01, 1.0, 100)  # ... and the probabilities


@dataclass(frozen=True)
class QuietWait:
    """The wait for a core behind a long execution as a law's ``wait_p``, ``wait_s`` and ``wait_quiet_s``
    (:class:`serving_bench.sim.spec.CoreWait`), measured: from ``beside`` requests sent while one ran, ``waited`` of
    them longer than :data:`WAITED_S` on their way in. Where it was measured on two servers, ``p`` holds with
    ``instances`` instances in all on the host and ``p_fewer`` with ``instances_fewer`` (the law's ``wait_instances``,
    ``wait_p_fewer`` and ``wait_instances_fewer``: the chance follows the host's instances, its threads)."""

    p: float
    slice_s: float
    quiet_s: float
    beside: int
    waited: int
    instances: int | None = None
    p_fewer: float | None = None
    instances_fewer: int | None = None
    beside_fewer: int = 0
    waited_fewer: int = 0
    slice_quiet_s: float | None = None  # the wait's length on a quieter host (see quiet_wait)
    gap_s: float | None = None
    gap_quiet_s: float | None = None
    slice_one_s: float | None = None  # where the length follows the quiet: the one length of every wait (before)

    def law(self) -> dict[str, float]:
        out = {"wait_p": self.p, "wait_s": self.slice_s, "wait_quiet_s": self.quiet_s,
               "wait_quiet_memory": QUIET_MEMORY}
        if self.p_fewer is not None and self.instances is not None and self.instances_fewer is not None:
            out.update(wait_instances=float(self.instances), wait_p_fewer=self.p_fewer,
                       wait_instances_fewer=float(self.instances_fewer))
        if self.slice_quiet_s is not None and self.gap_s is not None and self.gap_quiet_s is not None:
            out.update(wait_s_quiet=self.slice_quiet_s, wait_gap_s=self.gap_s, wait_gap_quiet_s=self.gap_quiet_s)
        return out


def beside_long(runs: Sequence[LoopRun], long: str) -> tuple[np.ndarray, np.ndarray]:
    """The requests of open-loop runs sent while a batch of ``long`` ran, each other model's that met their batch
    alone: the host's recent quiet time at the send (s; the weighted mean of the times between sends of any model,
    the newest weighing :data:`QUIET_MEMORY`) and the way in's excess (s; send to batch start, less half the hop,
    over that model's median of those sent while no ``long`` batch ran)."""
    quiet, excess = [], []
    for run in runs:
        executions = run.executions or {}
        if long not in executions or not run.sent:
            continue
        sends = np.sort(np.concatenate(list(run.sent.values())))
        recent = np.array(recent_means(np.diff(sends, prepend=-np.inf).tolist(), QUIET_MEMORY))
        long_runs = executions[long]
        for model in run.sent:
            found = matched_batches(run, model, 5) if model != long else None
            if found is None:
                continue
            matched, batches = found
            alone = batches.requests == 1
            sent = run.sent[model][matched][alone]
            way_in = (batches.start_s - run.sent[model][matched] - hop_s(run, batches, model) / 2)[alone]
            during = long_runs.running_at(sent)
            if during.all() or not during.any():
                continue
            quiet.append(recent[np.searchsorted(sends, sent)][during])
            excess.append(way_in[during] - float(np.median(way_in[~during])))
    if not quiet:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(quiet), np.concatenate(excess)


def quiet_wait(runs: Sequence[LoopRun], long: str, slice_range: tuple[float, float], instances: int | None = None,
               fewer: tuple[int, Sequence[LoopRun]] | None = None) -> QuietWait | None:
    """The wait for a core behind ``long``'s executions, from open-loop runs of it beside other models at different
    rates, every one's batches logged (:func:`beside_long`): a request sent while a ``long`` batch ran that took
    :data:`WAITED_S` longer on its way in waited.

    As :class:`~serving_bench.sim.spec.CoreWait` draws it — with probability ``q = p (1 - exp(-g / quiet_s))``, ``g``
    the host's recent quiet time (how busy the host has been, more than the last gap), a time uniform on
    (0, ``slice_s``) — a request waits longer than :data:`WAITED_S` with probability ``q (1 - WAITED_S / slice_s)``,
    and those that do wait on average ``(slice_s + WAITED_S) / 2`` longer: ``slice_s`` from their mean excess (within
    ``slice_range``), ``p`` and ``quiet_s`` by maximum likelihood over a grid. ``fewer``: the same runs on a server
    with fewer instances in all (``(instances in all, runs)``; ``runs`` had ``instances``) — one ``slice_s`` and one
    ``quiet_s`` for both, a ``p`` for each. Where the runs' two rates each had enough waits (:func:`wait_lengths`),
    the length follows the host's quiet: ``slice_s`` is the busier rate's and ``slice_quiet_s`` the quieter's, and
    each request's ``1 - WAITED_S / slice`` takes its own quiet's length. None with fewer than :data:`WAIT_MINIMUM`
    requests sent during a long batch (without ``fewer``'s ``p`` where only those runs had too few)."""
    per_run = [beside_long([run], long) for run in runs]  # each run once: pooled by server here, by rate below
    per_fewer = [beside_long([run], long) for run in fewer[1]] if fewer is not None else []
    groups = [pooled(per_run)]
    if len(groups[0][0]) < WAIT_MINIMUM:
        return None
    if fewer is not None and len((second := pooled(per_fewer))[0]) >= WAIT_MINIMUM:
        groups.append(second)
    slice_s = wait_length(np.concatenate([e for _, e in groups]), slice_range)
    lengths = wait_lengths(per_run, per_fewer if len(groups) > 1 else [], slice_range)
    likelihoods = []
    for g, e in groups:
        slices = np.interp(g, lengths[0], lengths[1]) if lengths else np.full(len(g), slice_s)
        seen = np.maximum(1.0 - WAITED_S / slices, 0.0)  # [request]
        shape = -np.expm1(-g[None, :] / QUIET_GRID_S[:, None])  # [quiet grid, request]
        chance = np.clip(P_GRID[:, None, None] * seen * shape[None], 1e-12, 1 - 1e-12)  # [p, quiet, request]
        likelihoods.append(np.where(e > WAITED_S, np.log(chance), np.log1p(-chance)).sum(axis=2))  # [p, quiet]
    j = int(np.argmax(sum(lk.max(axis=0) for lk in likelihoods)))  # the quiet time both share
    p = [float(P_GRID[int(np.argmax(lk[:, j]))]) for lk in likelihoods]
    (g, e), rest = groups[0], groups[1:]
    out = QuietWait(p[0], slice_s, float(QUIET_GRID_S[j]), int(len(g)), int((e > WAITED_S).sum()), instances)
    if rest:
        out = replace(out, p_fewer=p[1], instances_fewer=fewer[0], beside_fewer=int(len(rest[0][0])),
                      waited_fewer=int((rest[0][1] > WAITED_S).sum()))
    if lengths:
        (gap_s, gap_quiet_s), (busy_s, quiet_s) = lengths
        out = replace(out, slice_s=busy_s, slice_quiet_s=quiet_s, gap_s=gap_s, gap_quiet_s=gap_quiet_s,
                      slice_one_s=slice_s)
    return out


def wait_length(excess: np.ndarray, slice_range: tuple[float, float]) -> float:
    """The length (s) of a wait uniform on (0, length) whose waits over :data:`WAITED_S` have the mean excess of
    those in ``excess`` (s): ``2 x mean - WAITED_S``, within ``slice_range`` (its low end where none waited)."""
    waited = excess > WAITED_S
    return float(np.clip(2 * excess[waited].mean() - WAITED_S, *slice_range)) if waited.any() else slice_range[0]


def pooled(beside: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Several runs' :func:`beside_long` figures as one run's (what :func:`beside_long` of them all gives)."""
    if not beside:
        return np.zeros(0), np.zeros(0)
    return np.concatenate([g for g, _ in beside]), np.concatenate([e for _, e in beside])


def wait_lengths(runs: Sequence[tuple[np.ndarray, np.ndarray]], fewer: Sequence[tuple[np.ndarray, np.ndarray]],
                 slice_range: tuple[float, float]) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The wait's length by the host's quiet, from the :func:`beside_long` figures of each run at the two send rates
    (``runs``, and ``fewer``'s runs in the same order of rates), each rate's pooled — ((median recent quiet of the
    busier rate, of the quieter), (:func:`wait_length` of each one's excesses)), for the simulator to interpolate
    between, flat outside (:class:`~serving_bench.sim.spec.CoreWait`); None unless there are two rates with
    :data:`LENGTH_MINIMUM` waits each and the quieter one's median quiet at least twice the busier's."""
    if len(runs) != 2 or (fewer and len(fewer) != 2):
        return None
    rates = [pooled([runs[i], *([fewer[i]] if fewer else [])]) for i in range(2)]
    if any(int((e > WAITED_S).sum()) < LENGTH_MINIMUM for _, e in rates):
        return None
    (busy_g, busy_e), (quiet_g, quiet_e) = sorted(rates, key=lambda r: float(np.median(r[0])))
    gaps = (float(np.median(busy_g)), float(np.median(quiet_g)))
    if gaps[1] < 2 * gaps[0]:
        return None
    return gaps, (wait_length(busy_e, slice_range), wait_length(quiet_e, slice_range))


def colocation_speedup(k: float, per_round: Sequence[float], solo: Sequence[float]) -> tuple[float, str]:
    """The co-location speed-up at ``k`` from per-round ratios: their median, at most ``k``, with a note on the
    noise (the solo time's spread between rounds). A slowdown within the noise is kept as measured, never rounded
    up to "none": four CPU-bound batches cannot run four times as fast on two cores because the rounds disagree."""
    s = min(float(np.median(per_round)), k)
    spread = (max(solo) - min(solo)) / float(np.median(solo)) if len(solo) > 1 and np.median(solo) > 0 else 0.0
    return s, f"slowdown {(k / s - 1.0) * 100:.1f} %, solo spread between rounds {spread * 100:.1f} %"
