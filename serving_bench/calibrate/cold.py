"""Cold starts and an ensemble's own time: what a start after idle time costs a model's service, way in and way out
(:func:`cold_starts`, from open-loop runs of one-row requests at random quiet times), and an ensemble's time beyond
its members' path (:func:`ensemble_extra`, against the simulator). The measurement:
:mod:`serving_bench.calibrate.measure`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from serving_bench.calibrate.estimators import paced_service, service_and_overhead, service_from_statistics
from serving_bench.calibrate.paced import Paced
from serving_bench.calibrate.runs import LoopRun, hop_s, matched_batches
from serving_bench.profiles.distributions import EnsembleExtra, IdleEffect, recent_means


def medians(run: LoopRun, model: str, wait_s: float) -> tuple[float, float, float, float | None]:
    """(median service, median overhead, median dispatch, median instance idle before a batch or None) of a
    one-at-a-time run (see :func:`~serving_bench.calibrate.estimators.service_and_overhead`). Requests the batcher
    merged anyway (a stall made them overlap) count as one batch: the service is that of single-request batches, the
    idle time the one between consecutive batches. Without executed batches the dispatch is part of the overhead (0)."""
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
    ``way_in`` (as in :func:`~serving_bench.calibrate.estimators.service_and_overhead`). None without logged batches
    or with fewer than ``COLD_MINIMUM`` such requests."""
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
    # per distinct batch, never below 0 (the hop taken off a gap shorter than it is noise, not a negative idle time)
    idles = np.concatenate([[np.nan], np.maximum(starts[1:] - batches.end_s[first][:-1] - h, 0.0)])
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


def paced_requests(paced: Paced, wait_s: float) -> dict[str, np.ndarray] | None:
    """A paced run's counted requests (each alone on the server: sent after the previous answer) as
    :func:`quiet_requests` gives them — ``since``, ``recent_idle`` (the weighted mean of the instance's idle times:
    each the quiet time before the request plus the median ways out and in around it), ``service`` (Triton's compute
    time), ``way_in`` and ``way_out`` (:func:`~serving_bench.calibrate.estimators.paced_ways`' split) — the first
    request (nothing before it) left out; None with fewer than ``COLD_MINIMUM``."""
    if not isinstance(paced, Paced) or len(paced) <= COLD_MINIMUM:
        return None
    way_out = np.clip(paced.latency_s - paced.compute_s - paced.queue_s, 0.0, None) / 2
    way_in = way_out + np.clip(paced.queue_s - wait_s, 0.0, None)
    idle = paced.quiet_s + float(np.median(way_out)) + float(np.median(way_in))
    phases = {"since": paced.since_s, "recent_idle": np.array(recent_means(idle.tolist(), COLD_MEMORY)),
              "service": paced.compute_s, "way_out": way_out, "way_in": way_in}
    keep = np.isfinite(paced.since_s) & np.isfinite(phases["recent_idle"])
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
    on the weighted mean of the last ~8 idle times, fixed spacings and Poisson arrivals of every rate agree
    (docs/profiles.md#cold-starts-under-irregular-arrivals)."""
    cold_runs = [run for k, run in sorted(runs.items(), key=lambda item: str(item[0]))
                 if len(k) == 3 and k[:2] == (model, "cold")]
    if (model, "paced", 1) in runs:  # no runner logs (an external server): paced runs
        hot, back_to_back = paced_requests(runs[(model, "paced", 1)], wait_s), runs[(model, "solo", 1)]
        quiet = [q for q in (paced_requests(run, wait_s) for run in cold_runs if isinstance(run, Paced)) if q]
        if hot is None or not quiet:
            return None
        # the service against the back-to-back run's (a paced request already waited for the counters before it),
        # the ways against the paced run's at batch 1 (the same client as the cold runs')
        hot_service = paced_service(runs[(model, "paced", 1)], back_to_back.compute_s(model))
        hot_out, hot_in = hot["way_out"], hot["way_in"]
        hot_period = float(np.mean(hot["since"]))
        hot_idle = service_from_statistics(back_to_back, model, wait_s)[1]
    else:
        hot_run = runs[(model, "solo", 1)]
        hot_service, hot_out, hot_in = service_and_overhead(hot_run, model, wait_s)
        quiet = [q for q in (quiet_requests(run, model, wait_s) for run in cold_runs) if q is not None]
        if hot_in is None or not quiet:
            return None
        hot_period = float(np.mean(np.diff(hot_run.sent[model]))) if len(hot_run.sent[model]) > 1 else 0.0
        hot_idle = medians(hot_run, model, wait_s)[3]
    cold = {name: np.concatenate([q[name] for q in quiet]) for name in quiet[0]}
    rounds = np.concatenate([np.full(len(q["since"]), r) for r, q in enumerate(quiet)])

    def binned(key: str, phase: str, hot: np.ndarray, p: float, x0: float) -> tuple[tuple, tuple]:
        groups = cold_bins(cold[key])
        xs = [x0] + [float(np.median(cold[key][g])) for g in groups]
        ys = [0.0] + [least_over_rounds(cold[phase][g], rounds[g], p) - float(np.quantile(hot, p)) for g in groups]
        return monotone(xs, ys)

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
    back (docs/profiles.md#an-ensembles-own-time)."""
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
