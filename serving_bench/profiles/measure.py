"""Measure a profile on real Triton: service time per batch size, client/network overhead, the gap between batches,
the per-request cost inside a batch, and co-location curves (per model and per model pair).

Everything is driven closed-loop through the team's driver (``load.driver``) against the team's server
(``serve.server``); times come from the server wherever it can say them, because the simulator models the *server*
and the client's own jitter on a busy machine must not leak into service times:

* **Server-side timestamps.** The embedded server's runners log every executed batch (start, end, rows, requests;
  :mod:`serving_bench.serve.execution_log`) on ``time.perf_counter``'s clock, the driver's, so each closed-loop run's
  batches are the ones inside its time window. Triton's own compute time per batch is longer by the hop to the
  runner's process and back; that difference (Triton's mean compute per request of the run minus the logged mean) is
  added to each logged duration. Triton's request trace is not used by default: with it the bundled tritonserver
  2.51 aborted in most demo profiles (docs/serve.md); ``trace=True`` reads the batches from the trace instead.
  Against an external server (``url``) neither exists: service samples are then client latencies minus the mean
  overhead (their spread includes client jitter).
* **Service samples** per batch size ``b``: one run at concurrency 1 with requests of ``b`` rows; a batch's
  **service time** is what occupies Triton's instance (logged duration + the hop).
* **Dispatch and overhead** (per request, not occupying the instance), from the ``b = 1`` run, each request matched
  to the batch that served it. *Dispatch*: from the send to the batch's start (client, network, Triton's threads:
  the batcher's and the instance's wake-ups), less half the hop and less the queue delay the simulator itself
  imposes on a lone request (``max_queue_delay`` unless the request alone is a preferred size); the simulator
  delays each request's arrival at the batcher by a draw. *Overhead*: the rest of the client latency, the way back
  (from the intended time, so in open-loop runs the client's own send lateness is part of it), added on the return
  path. One sample per request each (without server-side times, one constant overhead covers both).
* **Cold starts** (``idle``): requests of one row sent one at a time with the instance idle ~2, 8, 32 and 64 ms
  between them (open loop, fixed spacing); the median service time, dispatch and overhead at each spacing minus those
  of the back-to-back run give how much a start after idle time costs (runtime threads parked, caches cold: on 2 cores an
  ONNX Runtime model computes twice as long after 16 ms idle as back to back). The simulator adds it per batch from
  the instance's idle time and per request from the time since the previous request.
* **Gap between batches** (``batch_gap_s``): with 3 requests of the largest size in flight on one instance, the time
  from a batch's end to the next one's start when that one had been sent before (Triton's instance thread releasing
  a payload and taking the next), less the hop — median over the run; embedded server only.
* **Per-request cost inside a batch** (``per_request_s``): with dynamic batching, requests of one row at concurrency
  ``min(max_batch_size, 8)``; Triton's per-batch-size statistics (``batch_stats``) give the compute time of batches
  of n one-row requests; their slope over n minus the slope of the service time of one request of n rows is the
  cost of each extra request (clamped at 0).
* **Co-location curve** ``S(k)`` at batch sizes ``colocation_batches``: a server with ``max(colocation)`` instances of
  every model; per round, one run at concurrency 1 (one instance busy: ``t_1``) then one at concurrency k (``t_k``),
  both Triton's mean compute time of executed batches of exactly that size (``batch_stats``: with a queue delay the
  batcher merges concurrent requests, and a merged batch's longer time is not a co-location slowdown);
  ``S(k) = k t_1 / t_k`` per round, median over ``rounds`` rounds.
  Interleaving rounds makes the ratio immune to slow drift of a shared machine. A slowdown ``k / S - 1`` not larger
  than the solo time's own spread between rounds (at least 2 %) is not significant: then ``S(k) = k``. A model that
  does not slow down when co-located (``sleep``) must not be slowed by the simulator.
* **Pair curves**: for every two models on the same device, in the one-instance server, per round each alone at
  concurrency 1, then both together (concurrency 1 each): ``S_pair(2) = t_a1 / t_a2 + t_b1 / t_b2``, median over
  rounds, with the same significance rule; at batch 1 and at the largest batch size both allow.

The estimators (pure functions over the runs, the executed batches and the statistics) are in
:mod:`serving_bench.profiles.estimators`; this module runs the servers and the load.

**Recovery.** Each phase is a list of steps (one per measured point). A server that dies during a step (a crash, a
kill) is started again and the phase resumes at that step, at most :data:`MAX_RESTARTS` times per phase; each restart
is logged and noted in the profile. An external server (``url``) is not restarted.

Threads per instance are fixed for every server of a measurement (``threads``; default what the served
configuration gets: cores // all configured instances of the measured models) and recorded in the profile.
"""

from __future__ import annotations

import platform
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, ContextManager, Sequence

import numpy as np

from serving_bench.errors import InputError
from serving_bench.export.repository import CONFIG_NAME, entry_dir, read_config
from serving_bench.profiles.estimators import (LoopRun, batch_gap, idle_effect, lone_wait_s, per_request_cost,
                                              service_and_overhead, significant_speedup, thin)
from serving_bench.profiles.distributions import Curve, Dist, IdleEffect
from serving_bench.profiles.schema import DeviceInfo, ModelOnDevice, ModelProfile, PairCurve, Profile
from serving_bench.profiles.session import MAX_RESTARTS, Session, Step, open_session, run_steps
from serving_bench.serve.runners import cpu_cores, default_threads
from serving_bench.serving_config import model_serving_from_config

DEFAULT_SECONDS = 2.0
DEFAULT_ROUNDS = 3
PER_REQUEST_CONCURRENCY = 8
GAP_CONCURRENCY = 3
IDLE_GAPS_S = (0.002, 0.008, 0.032, 0.064)  # idle time between spaced requests for the cold-start measurement
IDLE_COUNT = 25  # requests per spacing


def default_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to and including ``max_batch_size`` (just 1 without batching)."""
    if max_batch_size <= 1:
        return [1]
    sizes = [1]
    while sizes[-1] * 2 < max_batch_size:
        sizes.append(sizes[-1] * 2)
    return sizes + [max_batch_size]


# -- the measurement ---------------------------------------------------------------------------------------------------

@dataclass
class _ModelResult:
    device: str
    config: object
    batches: dict[int, Dist] = field(default_factory=dict)
    overhead: Dist | None = None
    gap_s: float = 0.0
    per_request_s: float = 0.0
    curves: list[Curve] = field(default_factory=list)
    idle: IdleEffect | None = None
    dispatch: Dist | None = None


def _device_of(config) -> str:
    return model_serving_from_config(config).instances[0][0]


def measure_profile(repo: str | Path, models: Sequence[str], out_path: str | Path | None = None, *,
                    batch_sizes: Sequence[int] | None = None, colocation: Sequence[int] = (1, 2, 4),
                    colocation_batches: Sequence[int] | None = None, pairs: bool = True,
                    seconds: float = DEFAULT_SECONDS, rounds: int = DEFAULT_ROUNDS, threads: int | None = None,
                    url: str | None = None, trace: bool = False,
                    log: Callable[[str], None] | None = None) -> Profile:
    """Measure ``models`` of ``repo`` on the embedded server (or the external one at ``url``); save to
    ``out_path``. ``colocation``: instance counts for S(k) (k > 1 measured); ``colocation_batches``: batch sizes of
    the curves (default 1 and the largest measured); ``pairs``: measure pair curves; ``rounds``: interleaved rounds
    per curve point; ``threads``: threads per instance (embedded server); ``trace``: server-side times from
    Triton's request trace instead of the runners' execution logs."""
    log = log or (lambda _msg: None)
    repo = Path(repo)
    if rounds < 1:
        raise InputError("--rounds", str(rounds), "expected an integer >= 1")
    configs = {m: read_config(entry_dir(repo, m) / CONFIG_NAME) for m in models}
    for m, config in configs.items():
        if config.platform == "ensemble":
            raise InputError("--models", m, "an ensemble is simulated from its members; profile the members")
    cores = cpu_cores()
    if threads is None:
        threads = default_threads(sum(max(sum(g.count or 1 for g in c.instance_group), 1) for c in configs.values()))
    results = {m: _ModelResult(_device_of(c), c) for m, c in configs.items()}
    sizes = {}
    for m, config in configs.items():
        wanted = list(batch_sizes) if batch_sizes else default_batch_sizes(config.max_batch_size)
        sizes[m] = sorted({b for b in wanted if b <= max(config.max_batch_size, 1)} | {1})
    ks = sorted({int(k) for k in colocation if k > 1})
    pair_list = [(a, b) for i, a in enumerate(models) for b in models[i + 1:]
                 if pairs and results[a].device == results[b].device]
    notes = [f"closed loop, {seconds:g} s per point, {rounds} interleaved rounds per co-location point; "
             f"{threads} thread(s) per instance"]
    if url:
        threads = 1
        notes[0] = notes[0].replace("thread(s) per instance", "thread(s) per instance recorded (the external server's "
                                    "own setting applies)")
        notes.append(f"external server {url}: no server-side batch times, so service samples are client latency - "
                     "mean overhead and the gap between batches is not measured")

    def sessions(instances: int) -> Callable[[], ContextManager[Session]]:
        return lambda: open_session(repo, models, instances, threads, trace, notes, log, url)

    # -- phase 1: one instance per model ---------------------------------------------------------------------------
    runs: dict = {}

    def solo(m: str, b: int) -> Step:
        def measure(session: Session) -> LoopRun:
            run = session.run({m: (b, 1)}, seconds)
            log(f"{m}: batch {b}: {len(run.latency[m])} requests, server compute {run.compute_s(m) * 1e3:.3f} ms")
            return run
        return (m, "solo", b), measure

    def idle(m: str, g: float) -> Step:
        return (m, "idle", g), lambda s: s.spaced(m, 1, g + float(np.mean(runs[(m, "solo", 1)].latency[m])),
                                                  IDLE_COUNT)

    def per_request(m: str) -> Step:
        def measure(session: Session) -> tuple:
            before = session.batch_stats([m])[m]
            with session.untraced():  # statistics only; see Session.untraced
                session.run({m: (1, min(configs[m].max_batch_size, PER_REQUEST_CONCURRENCY))}, seconds)
            return before, session.batch_stats([m])[m]
        return (m, "per_request"), measure

    def pair(a: str, b: str, pb: int) -> Step:
        def measure(session: Session) -> tuple[list[float], list[float], list[float]]:
            values, solo_a, solo_b = [], [], []
            for _ in range(rounds):
                alone_a = session.run({a: (pb, 1)}, seconds / 2).compute_s(a)
                alone_b = session.run({b: (pb, 1)}, seconds / 2).compute_s(b)
                both = session.run({a: (pb, 1), b: (pb, 1)}, seconds / 2)
                if min(alone_a, alone_b, both.compute_s(a), both.compute_s(b)) > 0:
                    values.append(alone_a / both.compute_s(a) + alone_b / both.compute_s(b))
                    solo_a.append(alone_a)
                    solo_b.append(alone_b)
            return values, solo_a, solo_b
        return (a, b, pb), measure

    steps: list[Step] = []
    for m in models:
        config = configs[m]
        steps += [solo(m, b) for b in sizes[m]] + [idle(m, g) for g in IDLE_GAPS_S]
        if not url:
            steps.append(((m, "gap"), lambda s, m=m: s.run({m: (sizes[m][-1], GAP_CONCURRENCY)},
                                                           max(seconds / 2, 0.5))))
        if config.HasField("dynamic_batching") and config.max_batch_size > 1:
            steps.append(per_request(m))
    for a, b in pair_list:
        steps += [pair(a, b, pb) for pb in sorted({1, min(sizes[a][-1], sizes[b][-1])})]
    restarts = 0 if url else MAX_RESTARTS  # an external server is not ours to start again
    run_steps(steps, runs, sessions(1), log, notes, "one instance per model", restarts)

    for m in models:
        r = results[m]
        config = configs[m]
        overhead_mean = None
        for b in sizes[m]:
            service, over, dispatch = service_and_overhead(runs[(m, "solo", b)], m, lone_wait_s(config, b),
                                                           overhead_mean)
            if b == sizes[m][0]:
                r.overhead = thin(np.clip(over, 0.0, None)) if over is not None else Dist.constant(0.0)
                r.dispatch = thin(dispatch) if dispatch is not None else None
                overhead_mean = r.overhead.mean + (r.dispatch.mean if r.dispatch is not None else 0.0)
            r.batches[b] = thin(service)
            log(f"{m}: batch {b}: service mean {r.batches[b].mean * 1e3:.3f} ms, p99 "
                f"{r.batches[b].quantile(0.99) * 1e3:.3f} ms" + (
                    f"; overhead mean {r.overhead.mean * 1e3:.3f} ms, dispatch mean "
                    f"{r.dispatch.mean * 1e3:.3f} ms" if b == sizes[m][0] and r.dispatch is not None else ""))
        if (m, "gap") in runs:
            r.gap_s, count = batch_gap(runs[(m, "gap")], m)
            if count:
                log(f"{m}: gap between batches on a busy instance {r.gap_s * 1e6:.0f} us (median of {count})")
        if (m, "per_request") in runs:
            md = ModelOnDevice("n/a", r.batches)

            def service_mean(n, md=md):
                try:
                    return md.service(n).mean
                except KeyError:
                    return None

            before, after = runs[(m, "per_request")]
            r.per_request_s, used = per_request_cost(before, after, service_mean)
            log(f"{m}: per-request cost inside a batch {r.per_request_s * 1e6:.0f} us (from {used} batches of 2+ "
                "requests)")

        r.idle = idle_effect(runs, m, lone_wait_s(config, 1))
        if r.idle is not None:
            log(f"{m}: cold start: service +" + ", +".join(
                f"{e * 1e6:.0f} us after {i * 1e3:.1f} ms idle" for i, e in zip(r.idle.service_idle_s,
                                                                              r.idle.service_extra_s)) +
                "; overhead +" + ", +".join(f"{e * 1e6:.0f} us after a {g * 1e3:.1f} ms gap"
                                            for g, e in zip(r.idle.overhead_gap_s, r.idle.overhead_extra_s)))

    # -- phase 2: co-location curves -------------------------------------------------------------------------------
    if ks:
        kmax = max(ks)
        available = ({m: model_serving_from_config(configs[m]).instance_count for m in models} if url
                     else {m: kmax for m in models})

        def curve(m: str, b: int, usable: list[int]) -> Step:
            def measure(session: Session) -> Curve | None:
                solo_times, ratios = [], {k: [] for k in usable}
                for _ in range(rounds):
                    t1 = session.execution_time(m, b, 1, seconds / 2)
                    solo_times.append(t1)
                    for k in usable:
                        tk = session.execution_time(m, b, k, seconds / 2)
                        if t1 > 0 and tk > 0:
                            ratios[k].append(k * t1 / tk)
                points = [(1.0, 1.0)]
                for k, values in ratios.items():
                    if values:
                        s, why = significant_speedup(float(k), values, solo_times)
                        points.append((float(k), s))
                        log(f"{m}: batch {b}: {k} batches at once: S({k}) = {s:.2f} "
                            f"(rounds {', '.join(f'{x:.2f}' for x in values)}; {why})")
                return Curve(b, tuple(k for k, _ in points), tuple(s for _, s in points)) if len(points) > 1 else None
            return (m, b), measure

        curve_steps = []
        for m in models:
            usable = [k for k in ks if k <= available.get(m, 1)]
            cb = sorted({b for b in (colocation_batches or (1, sizes[m][-1])) if b <= sizes[m][-1]})
            curve_steps += [curve(m, b, usable) for b in cb] if usable else []
        curves: dict = {}
        run_steps(curve_steps, curves, sessions(kmax), log, notes, "co-location", restarts)
        for (m, _), measured in curves.items():
            if measured is not None:
                results[m].curves.append(measured)

    pair_curves = []
    for a, b in pair_list:
        for pb in sorted({1, min(sizes[a][-1], sizes[b][-1])}):
            values, solo_a, solo_b = runs[(a, b, pb)]
            if not values:
                continue
            s, why = significant_speedup(2.0, values, solo_a + solo_b)
            log(f"{a} + {b}: batch {pb}: one batch of each at once: S_pair(2) = {s:.2f} "
                f"(rounds {', '.join(f'{x:.2f}' for x in values)}; {why})")
            pair_curves.append(PairCurve(results[a].device, (a, b), Curve(pb, (1.0, 2.0), (1.0, s))))

    profiles = {}
    for m in models:
        r = results[m]
        md = ModelOnDevice(_mode_of(r.config), r.batches, tuple(sorted(r.curves, key=lambda c: c.batch)), threads,
                           r.per_request_s, None, r.gap_s, r.idle)
        profiles[m] = ModelProfile(m, r.config.platform or r.config.backend, "fp32", {r.device: md}, r.overhead,
                                   r.dispatch)
    devices = {}
    for d in sorted({r.device for r in results.values()}):
        if d == "cpu":
            devices[d] = DeviceInfo(d, "cpu", platform.processor() or platform.machine(), cores=cores)
        else:
            devices[d] = DeviceInfo(d, "gpu", _gpu_name(int(d[3:]) if d[3:].isdigit() else 0))
    overall = Dist.constant(float(np.mean([profiles[m].overhead.mean for m in models])))
    where = url or "embedded tritonserver"
    server_side = any(run.executions is not None for run in runs.values() if isinstance(run, LoopRun))
    source = ("Triton's request trace" if trace else "the runners' execution logs, plus Triton's hop to the runner")
    profile = Profile(devices, profiles, overall, tuple(pair_curves),
                      host={"hostname": socket.gethostname(), "cpu": platform.processor() or platform.machine(),
                            "cores": cores, "os": platform.platform(), "server": where},
                      source=f"measured on {where} from {repo}",
                      created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      notes=tuple(notes + [f"service = Triton's compute time per batch ({source})" if server_side
                                           else "service = client latency - mean overhead"]))
    if out_path is not None:
        profile.save(out_path)
    return profile


def _gpu_name(index: int) -> str:
    try:
        import pynvml  # optional: only where a GPU is

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no NVML here: the name is only informative
        return ""


def _mode_of(config) -> str:
    params = {k: v.string_value for k, v in config.parameters.items()}
    if params.get("cuda_graphs", "").lower() in ("1", "true", "yes"):
        return "cuda_graphs"
    if config.platform == "tensorrt_plan":
        return "tensorrt"
    if config.platform in ("pytorch_libtorch",) or config.backend == "pytorch":
        return "eager"
    return "n/a"
