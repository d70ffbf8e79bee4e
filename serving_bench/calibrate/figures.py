"""Each model's figures from the runs with one instance per model (the estimators of
:mod:`serving_bench.calibrate.estimators` and :mod:`serving_bench.calibrate.cold` applied in order, each result
logged): service time, overhead, dispatch and demand per batch size, drift, the gap between batches, the cost of
each request inside a batch and the host CPU split per request and per batch, cold starts; and the solo batches at
one runtime thread per instance."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from serving_bench.calibrate.alone import one_thread_models
from serving_bench.calibrate.cold import cold_starts
from serving_bench.calibrate.estimators import (batch_gap, demands, handoff_point, handoff_split, paced_service,
                                               paced_ways, per_request_cost, per_request_cpu, phase_drift, pickup_s,
                                               service_and_overhead)
from serving_bench.calibrate.lab import Lab, ModelResult
from serving_bench.calibrate.plan import HOST_DEVICE
from serving_bench.calibrate.runs import lone_wait_s, thin
from serving_bench.profiles.distributions import Dist
from serving_bench.profiles.entries import ModelOnDevice, ThreadTable


def us(seconds: Sequence[float]) -> str:
    """Seconds as whole microseconds joined by slashes (a log line's figures)."""
    return "/".join(f"{v * 1e6:.0f}" for v in seconds)


def estimate_model(lab: Lab, m: str) -> None:
    """Every figure of model ``m`` from the phase's runs, into ``lab.results[m]``."""
    r = lab.results[m]
    for b in lab.plan.sizes[m]:
        service_and_demand(lab, m, b)
    if r.drift is not None:
        lags = ", ".join(f"{v:+.2f} {k} ms apart" for k, v in r.drift["service_by_lag_ms"].items())
        lab.log(f"{m}: one request's phases correlate (normal scores): in-service {r.drift['in_service']:+.2f}, "
                f"in-out {r.drift['in_out']:+.2f}, service-out {r.drift['service_out']:+.2f}; two services {lags}")
    if (m, "gap") in lab.runs:
        r.gap_s, count = batch_gap(lab.runs[(m, "gap")], m)
        if count:
            lab.log(f"{m}: gap between batches on a busy instance {r.gap_s * 1e6:.0f} us (from {count} batches)")
    if (m, "per_request") in lab.runs:
        per_request(lab, m)
    r.idle = cold_starts(lab.runs, m, lone_wait_s(lab.plan.configs[m], 1))
    if r.idle is not None:
        e = r.idle
        lab.log(f"{m}: cold start (us): service +{us(e.service_extra_s)} after {us(e.service_idle_s)} idle; way in "
                f"+{us(e.dispatch_extra_s)} (p90 +{us(e.dispatch_extra_p90_s)}), way out "
                f"+{us(e.overhead_extra_s)} (p90 +{us(e.overhead_extra_p90_s)}) after {us(e.overhead_gap_s)} since "
                "the previous request")


def service_and_demand(lab: Lab, m: str, b: int) -> None:
    """Batch size ``b``'s service time and demand from its solo run; at the smallest size the overhead, the
    dispatch, the request demand and the hop too, at size 1 the drift."""
    r, run, first = lab.results[m], lab.runs[(m, "solo", b)], b == lab.plan.sizes[m][0]
    wait_s = lone_wait_s(lab.plan.configs[m], b)
    service, over, dispatch = service_and_overhead(run, m, wait_s)
    paced = lab.runs.get((m, "paced", b))
    if paced is not None and len(paced):  # no runner logs: the shapes of the paced run's requests
        service = paced_service(paced, float(service.mean()))
        if first and over is not None and dispatch is not None:
            dispatch, over = paced_ways(paced, wait_s, float(dispatch.mean()), float(over.mean()))
    if first:
        r.overhead = thin(np.clip(over, 0.0, None)) if over is not None else Dist.constant(0.0)
        r.dispatch = thin(dispatch) if dispatch is not None else None
    r.batches[b] = thin(service)
    batch_demand, hop, request_demand = demands(run, m)
    if r.device != HOST_DEVICE:  # the runner's CPU is the host's: on a GPU, the device's share (or none)
        batch_demand = lab.gpu_busy.get((m, b))
    if batch_demand is not None:
        r.demand[b] = batch_demand
    if first:
        r.request_demand, r.hop_s = request_demand, hop
    if b == 1:
        r.drift = phase_drift(run, m, wait_s)
    lab.log(f"{m}: batch {b}: service mean {r.batches[b].mean * 1e3:.3f} ms, p99 "
            f"{r.batches[b].quantile(0.99) * 1e3:.3f} ms" +
            (f", {batch_demand:.2f} {'cores' if r.device == HOST_DEVICE else 'of the GPU'}"
             if batch_demand is not None else "") +
            (f"; overhead mean {r.overhead.mean * 1e3:.3f} ms, dispatch mean {r.dispatch.mean * 1e3:.3f} ms"
             if first and r.dispatch is not None else "") +
            (f", {request_demand:.2f} cores on the way in and out (hop {hop * 1e6:.0f} us)"
             if first and request_demand is not None else ""))


def per_request(lab: Lab, m: str) -> None:
    """The cost of each request inside a batch (the slope of Triton's compute time; on the host's cores the runner's
    own CPU slope is logged beside it) and the host CPU outside the runtime split per request and per batch
    (:func:`handoff_split`)."""
    r, runs, sizes = lab.results[m], lab.runs, lab.plan.sizes[m]
    batched = runs[(m, "per_request")]
    loaded = [batched] + [runs[(m, "split", c)] for c in lab.plan.split_levels(m)]
    r.per_request_s, used = per_request_cost({}, batched.times[m].batch_counts(),
                                             ServiceMean(ModelOnDevice("n/a", r.batches)))
    by_cpu = (per_request_cpu([runs[(m, "solo", b)] for b in sizes], loaded, m)
              if r.device == HOST_DEVICE else None)
    lab.log(f"{m}: per-request cost inside a batch {r.per_request_s * 1e6:.0f} us of Triton's compute time (from "
            f"{used} batches of 2+ requests): taken" +
            (f"; {by_cpu[0] * 1e6:.0f} us of it the runner's CPU (from {by_cpu[1]} batches)"
             if by_cpu is not None else ""))
    alone = runs[(m, "solo", sizes[0])]
    points = [handoff_point(run, m) for run in (loaded if len(loaded) > 1 else [alone, batched])]
    split = handoff_split(points) if sizes[0] == 1 and r.dispatch is not None else None
    if split is not None:
        split_handoff(lab, r, m, split)
        lab.log(f"{m}: host CPU outside the runtime per request, by requests per batch: " +
                ", ".join(f"{n:.1f}: {o * 1e6:.0f} us" for n, o in sorted(points)))
        lab.log(f"{m}: host CPU outside the runtime {split[0] * 1e6:.0f} us per request "
                f"({r.request_demand:.2f} cores on the way in and out) + {split[1] * 1e6:.0f} us per batch; "
                f"an idle instance takes up a payload in {r.pickup_s * 1e6:.0f} us")


def split_handoff(lab: Lab, r: ModelResult, m: str, split: tuple[float, float]) -> None:
    """The ways in and out cost ``split[0]`` host CPU seconds per request, the hand-offs ``split[1]`` per batch;
    an idle instance takes :func:`pickup_s` to take up a payload."""
    alone = lab.runs[(m, "solo", lab.plan.sizes[m][0])]
    r.pickup_s = pickup_s(alone, m, lone_wait_s(lab.plan.configs[m], 1), r.dispatch.mean)
    outside = r.dispatch.mean - r.pickup_s + r.overhead.mean
    # at most one core: a request's ways are a chain of hand-offs, one thread at a time (more is the server's
    # background CPU, its idle stubs' pollers, counted in the run)
    r.request_demand = min(split[0] / outside, 1.0) if outside > 0 else r.request_demand
    r.handoff_cpu_s = split[1]


class ServiceMean:
    """The mean service time (s) of a batch of ``n`` rows from the measured sizes (interpolated), None outside
    them: what :func:`per_request_cost` compares Triton's batches of ``n`` one-row requests with."""

    def __init__(self, md: ModelOnDevice):
        self.md = md

    def __call__(self, n: int) -> float | None:
        try:
            return self.md.service(n).mean
        except KeyError:
            return None


def estimate_one_thread(lab: Lab) -> None:
    """The solo batches at one runtime thread per instance (service time and demand per batch size) as each
    model's ``other_threads[1]`` (against an external server: each size's mean there, the shape of its paced run at
    the profile's threads)."""
    for m in one_thread_models(lab):
        r, batches, demand = lab.results[m], {}, {}
        for b in lab.plan.sizes[m]:
            run = lab.runs[(m, "solo at 1 thread", b)]
            service = service_and_overhead(run, m, lone_wait_s(lab.plan.configs[m], b))[0]
            paced = lab.runs.get((m, "paced", b))
            batches[b] = thin(paced_service(paced, float(service.mean())) if paced is not None and len(paced)
                              else service)
            batch_demand = demands(run, m)[0]
            if batch_demand is not None:
                demand[b] = batch_demand
            lab.log(f"{m}: batch {b} at 1 thread: service mean {batches[b].mean * 1e3:.3f} ms ("
                    f"{batches[b].mean / r.batches[b].mean:.2f} x at {lab.plan.threads})" +
                    (f", {batch_demand:.2f} cores" if batch_demand is not None else ""))
        r.other_threads[1] = ThreadTable(batches, demand)
