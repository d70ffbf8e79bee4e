"""The phase with one instance per model (the module docstring of :mod:`serving_bench.calibrate.measure` says what
each run is for): its steps, each a key and what to measure in a session, run into :attr:`Lab.runs`; and the solo
runs again at one runtime thread per instance."""

from __future__ import annotations

from functools import partial

import numpy as np

from serving_bench.calibrate.estimators import gpu_demand
from serving_bench.calibrate.lab import Lab
from serving_bench.calibrate.paced import Paced, paced_run
from serving_bench.calibrate.plan import HOST_DEVICE, PER_REQUEST_CONCURRENCY, QUIET_RATES_RPS
from serving_bench.calibrate.runs import LoopRun
from serving_bench.calibrate.session import Session, Step
from serving_bench.telemetry.gpu import GpuBusy

GAP_CONCURRENCY = 3
GAP_MIN_REQUESTS = 8  # the gap run lasts at least this many solo requests' time
MIN_SOLO_REQUESTS = 8  # a solo run lasts at least this many requests' time (estimated)
COLD_QUIET_S = (0.0005, 0.002, 0.008, 0.032, 0.128)  # mean random quiet times after an answer, block by block
COLD_BLOCK = 24  # requests per block of the cold-start runs (one block per mean quiet time, rising)


def solo_seconds(lab: Lab, m: str, b: int) -> float:
    """How long the solo run of ``b`` rows lasts: the measuring time, and no less than :data:`MIN_SOLO_REQUESTS`
    requests' time estimated from the largest smaller size measured (its mean latency times ``b`` over its size), so
    that a slow model's larger batches answer enough requests."""
    smaller = [s for s in lab.plan.sizes[m] if s < b and (m, "solo", s) in lab.runs]
    if not smaller:
        return lab.plan.config.seconds
    size = max(smaller)
    estimate = float(np.mean(lab.runs[(m, "solo", size)].latency[m])) * b / size
    return max(lab.plan.config.seconds, MIN_SOLO_REQUESTS * estimate)


def solo(lab: Lab, m: str, b: int, session: Session) -> LoopRun:
    """Requests of ``b`` rows to ``m`` one at a time (on a GPU, with NVML's busy share of the run), for
    :func:`solo_seconds`."""
    device, seconds = lab.plan.devices[m], solo_seconds(lab, m, b)
    if device == HOST_DEVICE:
        run = session.run({m: (b, 1)}, seconds)
    else:
        with GpuBusy(int(device[3:] or 0)) as busy:
            run = session.run({m: (b, 1)}, seconds)
        lab.gpu_busy[(m, b)] = None if busy.share is None else gpu_demand(busy.share, run, m, seconds)
    lab.log(f"{m}: batch {b}: {len(run.latency[m])} requests, server compute {run.compute_s(m) * 1e3:.3f} ms")
    return run


def cold(lab: Lab, name: str, r: int, session: Session) -> LoopRun | Paced:
    """Round ``r`` of the cold-start runs of a model or an ensemble: one-row requests, each a random quiet time
    after the previous one's back-to-back latency (an ensemble's: its members' summed, no less than its own); a
    model of an external server: paced, each a random quiet time after the previous answer."""
    models = lab.plan.models
    index = models.index(name) if name in lab.plan.configs else len(models) + list(lab.plan.ensembles).index(name)
    rng = np.random.default_rng([r, index])  # seeded: the same quiet times in every profile
    quiet = rng.exponential(np.repeat(COLD_QUIET_S, COLD_BLOCK))
    if lab.plan.external is not None and name in lab.plan.configs:  # no runner logs: each request counted
        return paced_run(session.url, name, 1, 0.0, quiet)
    return session.open_loop(name, 1, np.cumsum(lab.cold_spacing(name) + quiet))


def paced(lab: Lab, m: str, b: int, session: Session) -> Paced:
    """Requests of ``b`` rows to ``m`` one at a time, each counted from the statistics' difference around it
    (:func:`~serving_bench.calibrate.paced.paced_run`): the service time's distribution from any Triton."""
    run = paced_run(session.url, m, b, lab.plan.config.seconds)
    median, p99 = (float(np.quantile(run.compute_s, q)) * 1e3 for q in (0.5, 0.99)) if len(run) else (0.0, 0.0)
    lab.log(f"{m}: batch {b}: {len(run)} paced requests ({run.skipped} with other traffic left out), compute median "
            f"{median:.3f} ms, p99 {p99:.3f} ms")
    return run


def gap(lab: Lab, m: str, session: Session) -> LoopRun:
    """Requests of the largest size, :data:`GAP_CONCURRENCY` in flight on one instance, for half the measuring
    time, and no less than :data:`GAP_MIN_REQUESTS` solo requests' time (a slow model's run answers enough)."""
    size = lab.plan.sizes[m][-1]
    solo = lab.runs.get((m, "solo", size))
    latency = float(np.mean(solo.latency[m])) if solo is not None else 0.0
    return session.run({m: (size, GAP_CONCURRENCY)}, max(lab.plan.config.seconds / 2, 0.5, GAP_MIN_REQUESTS * latency))


def per_request(lab: Lab, m: str, session: Session) -> LoopRun:
    """One-row requests at ``min(max_batch_size, 8)`` (its executed batch sizes from the statistics' counters)."""
    with session.untraced():  # statistics only; see Session.untraced
        concurrency = min(lab.plan.configs[m].max_batch_size, PER_REQUEST_CONCURRENCY)
        return session.run({m: (1, concurrency)}, lab.plan.config.seconds)


def split(lab: Lab, m: str, c: int, session: Session) -> LoopRun:
    """One-row requests at concurrency ``c`` (the host CPU outside the runner, split per request and per batch)."""
    with session.untraced():  # merged batch-1 requests: see Session.untraced (a trace has no CPU to split)
        return session.run({m: (1, c)}, lab.plan.config.seconds)


def pair(lab: Lab, a: str, b: str, pb: int, session: Session) -> tuple[list[float], list[float], list[float]]:
    """Per round ``a`` alone, ``b`` alone, then both (batches of ``pb`` rows, one at a time each): the rounds'
    ``S_pair(2)`` and the solo times."""
    values, solo_a, solo_b = [], [], []
    seconds = lab.plan.config.seconds / 2
    for _ in range(lab.plan.config.rounds):
        alone_a = session.run({a: (pb, 1)}, seconds).compute_s(a)
        alone_b = session.run({b: (pb, 1)}, seconds).compute_s(b)
        both = session.run({a: (pb, 1), b: (pb, 1)}, seconds)
        if min(alone_a, alone_b, both.compute_s(a), both.compute_s(b)) > 0:
            values.append(alone_a / both.compute_s(a) + alone_b / both.compute_s(b))
            solo_a.append(alone_a)
            solo_b.append(alone_b)
    return values, solo_a, solo_b


def quiet(lab: Lab, rate: float, session: Session) -> LoopRun:
    """The open loop of every model together beside the longest's occasional batches (:meth:`Lab.quiet_run`)."""
    return lab.quiet_run(session, rate)[1]


def steps(lab: Lab) -> list[Step]:
    """The phase's steps in order: per model its solo runs (an external server: and its paced runs), the first
    cold-start round, the gap run and (batching)
    the per-request and split runs; the later cold-start rounds, the ensembles', the pairs', and the quiet runs
    (after every solo run: the longest model is found from them)."""
    plan = lab.plan
    out: list[Step] = []
    for m in plan.models:
        out += [((m, "solo", b), partial(solo, lab, m, b)) for b in plan.sizes[m]]
        if plan.external is not None:  # no runner logs: the distributions from the statistics, request by request
            out += [((m, "paced", b), partial(paced, lab, m, b)) for b in plan.sizes[m]]
        out.append(((m, "cold", 0), partial(cold, lab, m, 0)))
        out.append(((m, "gap"), partial(gap, lab, m)))
        if plan.batched(m):
            out.append(((m, "per_request"), partial(per_request, lab, m)))
            out += [((m, "split", c), partial(split, lab, m, c)) for c in plan.split_levels(m)]
    rounds = range(plan.config.idle_rounds)
    out += [((m, "cold", r), partial(cold, lab, m, r)) for r in rounds[1:] for m in plan.models]  # later rounds
    out += [((e, "cold", r), partial(cold, lab, e, r)) for r in rounds for e in plan.ensembles]
    for a, b in plan.pairs:
        out += [((a, b, pb), partial(pair, lab, a, b, pb)) for pb in plan.pair_batches(a, b)]
    if plan.quiet_waits:
        out += [(("quiet", 1, rate), partial(quiet, lab, rate)) for rate in QUIET_RATES_RPS]
    return out


def measure_alone(lab: Lab) -> None:
    """Run the phase with one instance per model into :attr:`Lab.runs`."""
    lab.run_phase(steps(lab), lab.runs, lab.sessions(1), "one instance per model")


def one_thread_models(lab: Lab) -> list[str]:
    """The models whose solo batches are measured again at one runtime thread per instance: on the host's cores,
    where the instances run several and a server can be told their threads (:meth:`Plan.sets_threads`), unless
    their variant fixes its own threads."""
    plan = lab.plan
    if plan.threads <= 1:
        return []
    return [m for m in plan.models
            if plan.devices[m] == HOST_DEVICE and plan.sets_threads(m) and not plan.fixed_threads(m)]


def measure_one_thread(lab: Lab) -> None:
    """Run the solo batches at one runtime thread per instance into :attr:`Lab.runs` (key phase
    ``"solo at 1 thread"``)."""
    single = one_thread_models(lab)
    if single:
        lab.run_phase([((m, "solo at 1 thread", b), partial(solo, lab, m, b)) for m in single
                       for b in lab.plan.sizes[m]], lab.runs, lab.sessions(1, 1, single), "one thread per instance")
