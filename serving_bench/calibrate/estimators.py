"""Turning what the server reports into profile numbers: pure functions over closed-loop runs, the batches the server
executed (the runners' execution logs, or Triton's request trace) and Triton's per-batch-size statistics
(:mod:`serving_bench.calibrate.measure` runs the server and the load; the estimators
and why each is the way it is are described there). Tested on synthetic data in ``tests/test_profile.py``.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
from scipy.special import ndtri

from serving_bench.calibrate.paced import Paced
from serving_bench.calibrate.runs import LoopRun, batches_of, hop_s, matched_batches
from serving_bench.profiles.schema import HostSpread


def service_and_overhead(run: LoopRun, model: str,
                         wait_s: float) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Service samples of a concurrency-1 run and, with the executed batches, per-request overhead and dispatch
    samples.

    With batches (each request matched to its batch, :func:`~serving_bench.calibrate.runs.served_by`; ``h`` =
    :func:`~serving_bench.calibrate.runs.hop_s`, counted half on each side of the runner): service = batch duration + h
    (what occupies Triton's instance); dispatch = from the send to the batch's start, less ``wait_s`` (the batcher's own
    delay, which the simulator models) and h/2 — the request's way to the instance (client, network, Triton's threads);
    overhead = the rest of the latency — the way back. Without them (any Triton): :func:`service_from_statistics`,
    the dispatch and overhead each one constant (:func:`ways_from_statistics`)."""
    latency = run.latency[model]
    found = matched_batches(run, model, 5)
    if found is not None:
        matched, batches = found
        h = hop_s(run, batches, model)
        sent = run.sent[model][matched]
        dispatch = np.clip(batches.start_s - sent - wait_s - h / 2, 0.0, None)
        back = latency[matched] - (batches.end_s - sent) - h / 2
        return batches.duration_s + h, back, dispatch
    service, _ = service_from_statistics(run, model, wait_s)
    way_in, way_out = ways_from_statistics(run, model, wait_s)
    return service, np.array([way_out]), np.array([way_in])


def service_from_statistics(run: LoopRun, model: str, wait_s: float) -> tuple[np.ndarray, float]:
    """(service samples, the mean of the ways in and out) of a concurrency-1 run from what any Triton says, its
    statistics extension: the samples' mean is Triton's mean compute time per request of the run (one request a
    batch: per batch of the run's size; the driver's counters leave out its warm-up request), their spread the
    client latencies' — each latency less the run's mean ways, ``mean latency - mean compute - wait_s``. The
    extension gives sums, not samples: this shape counts the client's own stalls as the service's, so a profile
    takes the shape of a paced run instead where it has one (:func:`paced_service`; docs/profiles.md, "Against any
    Triton")."""
    latency = run.latency[model]
    compute = run.compute_s(model)
    ways = max(float(latency.mean()) - compute - wait_s, 0.0) if compute > 0 else 0.0
    return latency - ways - wait_s, ways


def ways_from_statistics(run: LoopRun, model: str, wait_s: float) -> tuple[float, float]:
    """(way in, way out), seconds, of a concurrency-1 run's requests from Triton's statistics alone: of
    :func:`service_from_statistics`' ways, Triton's mean queue time (less the batcher's own delay ``wait_s``, which
    the simulator imposes) is on the way in, the rest split evenly. (Triton's ``success`` time does not bound the
    time inside the server: the python backend reports it when it releases the request, after the answer left;
    on the 2-core VM it was longer than the client's latency for many requests.)"""
    ways = service_from_statistics(run, model, wait_s)[1]
    queue = min(max(((run.stats.get(model) or {}).get("queue_mean_s") or 0.0) - wait_s, 0.0), ways)
    return queue + (ways - queue) / 2, (ways - queue) / 2


def paced_service(paced: Paced, mean_s: float) -> np.ndarray:
    """Service samples of one batch size from a paced run's per-request compute times (their shape: each request
    waited for the counters before it, so its batch started after a little idle time) scaled to ``mean_s``, the
    back-to-back run's mean compute time (Triton's counters over it)."""
    compute = paced.compute_s
    return compute * (mean_s / float(compute.mean())) if len(compute) and compute.mean() > 0 else compute


def paced_ways(paced: Paced, wait_s: float, way_in_s: float, way_out_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(way in, way out) samples from a paced run's per-request times, split as :func:`ways_from_statistics` splits
    the means — each request's latency beyond its queue and compute time half each way, its queue time (less
    ``wait_s``) on the way in — each shifted to the load driver's means ``way_in_s`` and ``way_out_s`` (the paced
    run's client is another, so only its spread is taken), at least 0."""
    queue = np.clip(paced.queue_s - wait_s, 0.0, None)
    way_out = np.clip(paced.latency_s - paced.compute_s - paced.queue_s, 0.0, None) / 2
    way_in = way_out + queue
    return (np.clip(way_in - way_in.mean() + way_in_s, 0.0, None),
            np.clip(way_out - way_out.mean() + way_out_s, 0.0, None))


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
    :mod:`serving_bench.sim.drift` where the host's law has ``drift`` (docs/sim.md#the-hosts-speed-drifts)."""
    found = matched_batches(run, model, DRIFT_MINIMUM)
    if found is None:
        return None
    service, way_out, way_in = service_and_overhead(run, model, wait_s)
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
    * hop ``h`` (:func:`~serving_bench.calibrate.runs.hop_s`, seconds): the part of Triton's compute time outside
      the runner;
    * hand-off demand: cores kept busy by everything else a request costs — the client, Triton's threads, the hop,
      the stubs outside their batches — over the time a request spends outside the runner: ``(total CPU - runner
      CPU) / sum of (latency - duration)``, at most 1 (a request is a chain of hand-offs, one thread at a time).
      CPU time overstates it where threads spin while they wait (they yield the core to real work when it is
      busy): the sharing law's ``psi`` scales it (:mod:`serving_bench.sim.spec`).

    Demands are None where the server did not say; without a runner log, :func:`process_demands` (hop 0)."""
    if batches_of(run, model) is None:
        runner, handoff = process_demands(run, model)
        return runner, 0.0, handoff
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


def process_demands(run: LoopRun, model: str) -> tuple[float | None, float | None]:
    """(runner demand, hand-off demand) of a one-at-a-time run of one model where no runner logs its batches but
    the host's CPU is measured and the instances run in processes of their own (an external server on this machine:
    the python backend's stubs, ``LoopRun.runner_cpu_s``) — :func:`demands` without the log: the instances' CPU over
    Triton's summed compute time of the run's batches, and the rest of the run's CPU over the time its requests
    spent outside the instance (latency less Triton's mean compute, summed), at most 1. None where unknown."""
    times = run.times.get(model)
    if times is None or run.cpu_s is None or run.runner_cpu_s is None:
        return None, None
    compute = sum(ns for phases in times.by_batch.values() for _, ns in phases.values()) * 1e-9
    outside = float(np.sum(np.clip(run.latency[model] - run.compute_s(model), 0.0, None)))
    runner = run.runner_cpu_s / compute if compute > 0 else None
    handoff = min(max(run.cpu_s - run.runner_cpu_s, 0.0) / outside, 1.0) if outside > 0 else None
    return runner, handoff


def gpu_demand(busy_share: float, run: LoopRun, model: str, seconds: float) -> float | None:
    """The share of a GPU one batch keeps busy alone: ``busy_share`` (NVML's share of time a kernel ran over a
    one-at-a-time run of ``model`` lasting ``seconds``) over the share of the run its instance spent executing
    (answered batches x Triton's mean compute time / ``seconds``), at most 1; None where the run executed nothing.
    (Eager resnet50 at batch 1 on an H200: 0.21-0.33, docs/serve.md#what-the-gpu-check-has-measured.)"""
    executing = len(run.latency[model]) * run.compute_s(model) / seconds
    return min(1.0, busy_share / executing) if executing > 0 else None


def handoff_point(run: LoopRun, model: str) -> tuple[float, float] | None:
    """(requests per executed batch ``n``, host CPU seconds outside the runner per answered request ``o``) of a run
    of ``model``: the run's CPU less its logged batches' (without a log: its instances' processes', over Triton's
    count of batches) over its answered requests; None where the server did not say."""
    executed = batches_of(run, model)
    answered = len(run.latency.get(model, ()))
    if executed is None:  # no runner log: the instances' processes' CPU and Triton's count of batches, where known
        times = run.times.get(model)
        if times is None or run.cpu_s is None or run.runner_cpu_s is None or not times.executions or not answered:
            return None
        return answered / times.executions, (run.cpu_s - run.runner_cpu_s) / answered
    if run.cpu_s is None or not len(executed) or not answered or np.isnan(executed.cpu_s).any():
        return None
    return answered / len(executed), (run.cpu_s - float(executed.cpu_s.sum())) / answered


def handoff_split(points: Sequence[tuple[float, float] | None]) -> tuple[float, float] | None:
    """(per request, per batch) host CPU seconds outside the runner, from runs of one-row requests whose batches held
    different numbers of requests (:func:`handoff_point` of closed loops at several concurrencies on one instance
    with dynamic batching): ``o = c_r + c_b / n``; least squares of ``o`` on ``1 / n`` gives both (each at least 0).
    Loaded runs are the ones to fit: one request at a time the host idles between requests and its threads' polling
    counts against each (docs/sim.md#per-request-and-per-batch). None where a run's server did not say,
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
    runner's log cannot see the hop to the stub, so the gap is not read off the log directly). Without the batches
    (any Triton): :func:`cycle_gap`."""
    batches = batches_of(run, model)
    if batches is None:
        return cycle_gap(run, model)
    if run.compute_s(model) <= 0:
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


def cycle_gap(run: LoopRun, model: str) -> tuple[float, int]:
    """The gap between batches on a busy instance from Triton's statistics alone (any Triton), and the batches it
    rests on: the run's requests (each a batch of the largest size) followed one another on the instance from the
    first send to the last answer, less one request's ways in and out (its mean latency less Triton's mean queue
    and compute time), so each batch's cycle less Triton's mean compute time is the gap, at least 0 ((0, 0) with
    fewer than 3 requests or no statistics)."""
    latency = run.latency.get(model, np.zeros(0))
    compute = run.compute_s(model)
    if len(latency) < 3 or compute <= 0 or model not in run.sent:
        return 0.0, 0
    ways = float(latency.mean()) - ((run.stats.get(model) or {}).get("queue_mean_s") or 0.0) - compute
    span = float(run.done[model].max() - run.sent[model].min()) - max(ways, 0.0)
    return max(span / len(latency) - compute, 0.0), len(latency)


def per_request_cost(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
                     service_mean: Callable[[int], float | None]) -> tuple[float, int]:
    """Per-request cost from batches of n one-row requests (the statistics' counters before and after one run,
    ``{batch size: (executions, compute ns)}``; ``before`` ``{}`` where ``after`` is the run's already): the slope
    of their compute time over n, minus the slope of the service time of *one* request of n rows over the same
    sizes (both weighted least squares, weights = executions). Slopes, not levels, so a machine that is uniformly
    slower during this run than during the service measurement does not pass for a per-request cost. Clamped at 0. Returns
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
    0: the part of :func:`per_request_cost` spent inside the runner (docs/profiles.md#big-batches); a slope, not a
    level, so a uniformly slower machine does not pass for a cost.
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


def colocation_speedup(k: float, per_round: Sequence[float], solo: Sequence[float]) -> tuple[float, str]:
    """The co-location speed-up at ``k`` from per-round ratios: their median, at most ``k``, with a note on the
    noise (the solo time's spread between rounds). A slowdown within the noise is kept as measured, never rounded
    up to "none": four CPU-bound batches cannot run four times as fast on two cores because the rounds disagree."""
    s = min(float(np.median(per_round)), k)
    spread = (max(solo) - min(solo)) / float(np.median(solo)) if len(solo) > 1 and np.median(solo) > 0 else 0.0
    return s, f"slowdown {(k / s - 1.0) * 100:.1f} %, solo spread between rounds {spread * 100:.1f} %"


def round_speed(done: Mapping[str, np.ndarray], slices: int = 5) -> tuple[float, float] | None:
    """One round of a closed-loop run, from each model's completion times (s): its speed ``y``, the mean over the
    models of the log of their throughput over the round's span (first to last completion), and the variance ``v``
    a run of that length has of ``y`` from its own finite sample, by batch means: the span cut in ``B`` equal slices
    (``slices``, fewer where a model answered fewer than 8 requests a slice), ``y_b`` each slice's speed,
    ``v = var(y_b) / B`` (a round's ``y`` is about the slices' mean; slices of a second or so are far apart next to
    the loop's memory). None where a model answered too few requests for two slices."""
    times = {m: np.sort(np.asarray(t, dtype=float)) for m, t in done.items()}
    if not times or min(len(t) for t in times.values()) < 16:
        return None
    first = min(float(t[0]) for t in times.values())
    last = max(float(t[-1]) for t in times.values())
    count = min(slices, min(len(t) for t in times.values()) // 8)
    if last <= first:
        return None
    edges = np.linspace(first, last, count + 1)
    per_slice = np.array([np.histogram(t, edges)[0] for t in times.values()], dtype=float)  # models x slices
    if (per_slice == 0).any():
        return None
    span = (last - first) / count
    y_slices = np.log(per_slice / span).mean(axis=0)
    y = float(np.mean([math.log(len(t) / (last - first)) for t in times.values()]))
    return y, float(y_slices.var(ddof=1)) / count


def host_spread(repeats: Sequence[Sequence[tuple[float, float]]]) -> HostSpread | None:
    """The host's run-to-run spread from runs each repeated in rounds (per run, per round :func:`round_speed`'s
    ``(y, v)``): the pooled variance of ``y`` between the rounds of each run,
    ``s^2 = sum_i sum_j (y_ij - mean_i)^2 / sum_i (n_i - 1)`` with ``df = sum_i (n_i - 1)`` degrees of freedom, less
    the part the runs' finite samples explain (the mean of ``v``, which the simulator's replications draw on their
    own), at least 0: ``sigma = sqrt(max(s^2 - mean(v), 0))``. None without a run of two rounds or more."""
    runs = [r for r in repeats if len(r) >= 2]
    if not runs:
        return None
    df = sum(len(r) - 1 for r in runs)
    between = sum(float(np.sum((np.array([y for y, _ in r]) - np.mean([y for y, _ in r])) ** 2)) for r in runs) / df
    finite = float(np.mean([v for r in runs for _, v in r]))
    return HostSpread(math.sqrt(max(between - finite, 0.0)), df, len(runs))
