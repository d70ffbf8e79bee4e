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
* **At one thread** (``other_threads``): where the instances run several runtime threads (``threads`` > 1, the
  host's cores, embedded server), the same solo runs once more on a server of one thread per instance: the service
  time and demand of every batch size when the host's cores are split over more instances than one per model (the
  simulator takes each served configuration's count: ``ModelOnDevice.for_threads``).
* **Dispatch and overhead** (per request, not occupying the instance), from the ``b = 1`` run, each request matched
  to the batch that served it. *Dispatch*: from the send to the batch's start (client, network, Triton's threads:
  the batcher's and the instance's wake-ups), less half the hop and less the queue delay the simulator itself
  imposes on a lone request (``max_queue_delay`` unless the request alone is a preferred size); the simulator
  delays each request's arrival at the batcher by a draw. *Overhead*: the rest of the client latency, the way back
  (from the intended time, so in open-loop runs the client's own send lateness is part of it), added on the return
  path. One sample per request each (without server-side times, one constant overhead covers both).
* **Drift** (``drift``; simulated where the host's law has ``drift``, form ``pool_eff+wait+drift``:
  :mod:`serving_bench.sim.drift`): from the ``b = 1`` run, how the host's speed moves a request's way in, service and
  way out together and two requests' services some milliseconds apart
  (:func:`~serving_bench.calibrate.estimators.phase_drift`; docs/sim.md, "The host's speed drifts").
* **Cold starts** (``idle``): requests of one row sent one at a time, each after the previous answer plus a random
  quiet time (exponential, seeded; open loop; :data:`COLD_BLOCK` requests at each mean of :data:`COLD_QUIET_S`,
  rising); binned by the time since the previous request (by the instance's recent idle time for the service: the
  weighted mean of its last idle times), the median service time, dispatch and overhead of each bin minus those of
  the back-to-back run give how much a start after idle time costs (runtime threads parked, caches cold: on 2 cores
  an ONNX Runtime model computes twice as long after 16 ms idle as back to back). A batch's warmth follows the
  model's recent rate, not only its last gap (:func:`~serving_bench.calibrate.estimators.cold_starts`). The
  simulator adds it per batch from the instance's recent idle time and per request from the time since the previous
  request. The ways in and out also keep their extra at the 90th percentile: a cold way's tail grows more than its
  middle (docs/sim.md, "The host's speed drifts"); a draw takes the median extra up to probability 0.5 and the p90
  one from 0.9.
* **An ensemble's own time** (``ensembles``; an ensemble named in ``models``: its members are measured as models):
  the ensemble's one-row requests alone, sent as the cold-start runs are, against the same requests simulated with
  the members' profile; per bin of the time since the previous request, how much longer it took at the median and
  the 90th percentile — Triton's ensemble scheduler handing each step on (:func:`ensembles_alone`).
* **Gap between batches** (``batch_gap_s``): with 3 requests of the largest size in flight on one instance, what the
  instance spends per batch beyond Triton's compute time (its thread releasing a payload and taking the next): the
  mean time from one batch's start to the next (when that one had been sent already) minus Triton's mean compute;
  embedded server only.
* **Per-request cost inside a batch** (``per_request_s``): with dynamic batching, requests of one row at concurrency
  ``min(max_batch_size, 8)``; Triton's per-batch-size statistics (``batch_stats``) give the compute time of batches
  of n one-row requests; their slope over n minus the slope of the service time of one request of n rows is the
  cost of each extra request (clamped at 0). On the host's cores, where the runners log their CPU, the runner's CPU
  is taken instead, over the split runs too (:func:`~serving_bench.calibrate.estimators.per_request_cpu`): those
  runs keep the host busy, and a batch's time there holds its waits for a core, which the sharing law adds itself.
* **Demands** (what the interference model shares, :mod:`serving_bench.sim.device`): per batch size, the cores a
  batch keeps busy (the runner's logged CPU, plus the hop, over the batch's time on the instance) — on a GPU the
  share of the device it keeps busy instead (:func:`~serving_bench.calibrate.estimators.gpu_demand`: NVML's busy
  share over the solo run, :class:`~serving_bench.telemetry.gpu.GpuBusy`; without NVML none is recorded and the
  simulator estimates it from the batch scaling); per model, the
  cores a request keeps busy on its way in and out (the rest of the run's CPU — client, Triton's threads, the stubs
  outside their batches — over the time requests spend outside the instance). The requests are handled on the
  host's cores (``request_device``). Where the per-request cost run batched requests (more requests per executed
  batch than one at a time), the host CPU outside the runner is split into a part per request and a part per batch
  (``estimators.handoff_split``): the ways in and out then carry only the first (``request_demand``), each batch
  the second (``handoff_cpu_s``), and an idle instance takes ``pickup_s`` (Triton's queue time of a lone request)
  to take up a payload, which grows meanwhile.
* **Calibration** (``calibrate`` instances per model, one server): closed loops of one-row requests — each model
  alone with ``calibrate`` clients, each beside the model of the longest batch-1 service (one client each; with
  three models or more), then all models together with one client each and with ``calibrate`` each (a lone
  model: with ``2 * calibrate`` clients instead, so its law is not fitted to one throughput, and with dynamic
  batching with :data:`LOADED_CLIENTS` ``* calibrate``, so it is fitted where batches hold several requests too) —
  ``rounds`` times, the median answered requests per second and p99; then two open loops of all models together at
  Poisson times, the longest at a rate that keeps :data:`LONG_SHARE` of a core busy (a batch now and then, as
  production traffic has it), every other at each rate of :data:`QUIET_RATES_RPS` (a quiet host, then a busier
  one), their p99s. The device's sharing law (``law``, default ``pool_eff+wait`` on a CPU host, ``serial`` —
  nothing to fit — on a GPU) is fitted to them through the simulator (:mod:`serving_bench.sim.interference`: the
  throughputs of the closed loops); its wait for a core behind
  a long execution is measured in the open loops (the requests sent while a batch of the longest ran, by how quiet
  the host was: :func:`~serving_bench.calibrate.estimators.quiet_wait`) — those two also on the one-instance server
  of the first phase, so that the wait's chance follows the host's instances in all (the law's
  ``wait_instances``) — or, without them, fitted on the p99s of the light closed loops. The runs are kept in the
  profile (``calibration``).
* **Co-location curves** (optional overrides, ``colocation``) ``S(k)`` at batch sizes ``colocation_batches``: a
  server with ``max(colocation)`` instances of every model; per round, one run at concurrency 1 (one instance busy:
  ``t_1``) then one at concurrency k (``t_k``), both Triton's mean compute time of executed batches of exactly that
  size (``batch_stats``: with a queue delay the batcher merges concurrent requests, and a merged batch's longer time
  is not a co-location slowdown); ``S(k) = k t_1 / t_k`` per round, median over ``rounds`` rounds (interleaving
  rounds makes the ratio immune to slow drift of a shared machine), kept as measured — a slowdown within the noise
  is not rounded up to none.
* **Pair curves** (optional overrides): for every two models on the same device, in the one-instance server, per
  round each alone at concurrency 1, then both together (concurrency 1 each): ``S_pair(2) = t_a1 / t_a2 + t_b1 /
  t_b2``, median over rounds; at batch 1 and at the largest batch size both allow.

The estimators (pure functions over the runs, the executed batches and the statistics) are in
:mod:`serving_bench.calibrate.estimators`; this module runs the servers and the load.

**Recovery.** Each phase is a list of steps (one per measured point). A server that dies during a step (a crash, a
kill) is started again and the phase resumes at that step, at most :data:`MAX_RESTARTS` times per phase; each restart
is logged and noted in the profile. An external server (``url``) is not restarted.

Threads per instance (``threads``) are what the served configuration gets by default (cores // all configured
instances of the measured models) and recorded in the profile. Given, every server of the measurement has them. By
default, on the host's cores, the co-located servers' instances share the cores as a served configuration of as
many instances would (cores // its instances): the law is fitted, and the curves measured, where the tuner's
configurations run, not on more runtime threads than cores. Each calibration run records its count, the curves
theirs (``colocation_threads``).
"""

from __future__ import annotations

import dataclasses
import platform
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, ContextManager, Mapping, Sequence

import numpy as np

from serving_bench.errors import InputError, require_count
from serving_bench.export.repository import CONFIG_NAME, ensemble_deps, ensemble_members, entry_dir, read_config
from serving_bench.profiles.distributions import Curve, Dist, EnsembleExtra, IdleEffect
from serving_bench.calibrate.estimators import (WAITED_S, LoopRun, batch_gap, colocation_speedup, cold_starts, demands,
                                              ensemble_extra, gpu_demand, handoff_point, handoff_split, lone_wait_s,
                                              per_request_cost, per_request_cpu, phase_drift, pickup_s, quiet_wait,
                                              service_and_overhead, thin)
from serving_bench.profiles.schema import DeviceInfo, ModelOnDevice, ModelProfile, PairCurve, Profile, ThreadTable
from serving_bench.calibrate.session import MAX_RESTARTS, Session, Step, open_session, run_steps
from serving_bench.serve.runners import cpu_cores, default_threads
from serving_bench.serve.runners.cuda_graphs import parse_batch_sizes
from serving_bench.serving_config import ModelServing, ServingConfig, model_serving_from_config
from serving_bench.sim.device import GPU_LAW
from serving_bench.sim.interference import (WAIT_S_RANGE, Observation, alone_latency, open_schedule, pinned, tail_error,
                                           with_law)
from serving_bench.sim.interference import fit as fit_law
from serving_bench.telemetry.gpu import GpuBusy

DEFAULT_SECONDS = 2.0
FIT_WARNING = 0.25  # a law fit whose mean throughput error exceeds this is flagged in the log and the profile's notes
UNCERTAIN_NOTE = "the sharing law misses its own calibration runs"  # how that note starts (:func:`uncertain`)
DEFAULT_CALIBRATION = 2  # instances per model in the co-located runs the law is fitted to
LOADED_CLIENTS = 8  # a lone model's loaded calibration run: this many clients per calibration instance
LONG_SHARE = 0.1  # the quiet-wait runs (open loop): the longest model's rate keeps this share of a core busy ...
QUIET_RATES_RPS = (15.0, 150.0)  # ... every other model's rate in each run (a quiet host, then a busier one) ...
QUIET_SECONDS = 15.0  # ... each this long
DEFAULT_LAW = "pool_eff+wait"  # on a CPU host, chosen by held-out error: benchmarks/colocation_fidelity.py
DEFAULT_ROUNDS = 3
PER_REQUEST_CONCURRENCY = 8
SPLIT_CONCURRENCY = (2, 4, 8, 16, 32)  # the loads the host CPU outside the runner is split over (up to max batch)
GAP_CONCURRENCY = 3
COLD_QUIET_S = (0.0005, 0.002, 0.008, 0.032, 0.128)  # mean random quiet times after an answer, block by block
COLD_BLOCK = 24  # requests per block of the cold-start runs (one block per mean quiet time, rising)
IDLE_ROUNDS = 2  # rounds of the cold-start runs, minutes apart: a busy host only ever inflates a round's extras
HOST_DEVICE = "cpu"  # the host's cores: where CPU instances run and every request is handled


def quiet_rates(models: Sequence[str], longest: str, longest_service_s: float, rate: float) -> dict[str, float]:
    """The rates (req/s) of a quiet-wait run (open loop): ``longest`` at :data:`LONG_SHARE` of a core (a batch of
    ``longest_service_s`` seconds now and then), every other model at ``rate``."""
    return {m: LONG_SHARE / longest_service_s if m == longest else rate for m in models}


def sender_of(runs) -> dict[str, str]:
    """``{"sender": name}`` for the profile's ``host``: the load driver's sender its runs went through (``native``
    or ``python``; both, comma-separated, if they differed), or nothing where no run said. A request's ways in and
    out include its sender's own time, so a profile holds for replays through the same sender (docs/sim.md)."""
    names = sorted({r.sender for r in runs if isinstance(r, LoopRun) and r.sender})
    return {"sender": ", ".join(names)} if names else {}


def _us(seconds: Sequence[float]) -> str:
    """Seconds as whole microseconds joined by slashes (a log line's figures)."""
    return "/".join(f"{v * 1e6:.0f}" for v in seconds)


def default_batch_sizes(max_batch_size: int, padded: Sequence[int] = ()) -> list[int]:
    """1, 2, 4, ... up to and including ``max_batch_size`` (just 1 without batching); with ``padded`` sizes (the
    sizes a runtime pads batches to), those sizes and the powers of two above the largest (run unpadded)."""
    if max_batch_size <= 1:
        return [1]
    sizes = [1]
    while sizes[-1] * 2 < max_batch_size:
        sizes.append(sizes[-1] * 2)
    sizes.append(max_batch_size)
    if padded:
        return sorted(set(padded) | {b for b in sizes if b > max(padded)})
    return sizes


def padded_sizes(config, cuda_graphs: str | None = None) -> list[int]:
    """The batch sizes the served runtime pads to: the CUDA graphs captured for a TorchScript entry on GPU
    instances (``cuda_graphs``, as ``serve --cuda-graphs``), or a tuned TVM entry's static buckets (parameter
    ``buckets``); [] when batches run at their own size."""
    params = {k: v.string_value for k, v in config.parameters.items()}
    if params.get("buckets"):
        return sorted({int(b) for b in params["buckets"].split(",") if b.strip()})
    if cuda_graphs and _cuda_graph_entry(config):
        try:
            return parse_batch_sizes(cuda_graphs, config.max_batch_size)
        except ValueError as err:
            raise InputError("--cuda-graphs", cuda_graphs, str(err)) from None
    return []


def calibration_serving(config, device: str, instances: int, largest: int) -> ModelServing:
    """How a calibration run serves a model, for the simulator to replay it: the entry's own settings with
    ``instances`` instances, its batches capped at the largest measured size (one-row requests from at most
    ``instances`` clients never batch more)."""
    serving = model_serving_from_config(config)
    largest = min(serving.max_batch_size, largest) if serving.max_batch_size > 0 else 0
    return serving.replace(instances=((device, instances),), max_batch_size=largest,
                           preferred_batch_sizes=tuple(b for b in serving.preferred_batch_sizes if b <= largest))


def _cuda_graph_entry(config) -> bool:
    """A TorchScript entry on GPU instances: what the runner can replay CUDA graphs for."""
    return (config.platform == "pytorch_libtorch" or config.backend == "pytorch") and \
        any(g.kind == g.KIND_GPU for g in config.instance_group)


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
    demand: dict[int, float] = field(default_factory=dict)
    request_demand: float | None = None
    hop_s: float = 0.0
    handoff_cpu_s: float = 0.0
    pickup_s: float = 0.0
    drift: dict | None = None
    other_threads: dict[int, ThreadTable] = field(default_factory=dict)


def _device_of(config) -> str:
    return model_serving_from_config(config).instances[0][0]


def measure_profile(repo: str | Path, models: Sequence[str], out_path: str | Path | None = None, *,
                    batch_sizes: Sequence[int] | None = None, colocation: Sequence[int] = (),
                    colocation_batches: Sequence[int] | None = None, pairs: bool = True,
                    seconds: float = DEFAULT_SECONDS, rounds: int = DEFAULT_ROUNDS, threads: int | None = None,
                    url: str | None = None, trace: bool = False, cuda_graphs: str | None = None,
                    calibrate: int = DEFAULT_CALIBRATION, law: str | None = None, idle_rounds: int = IDLE_ROUNDS,
                    log: Callable[[str], None] | None = None) -> Profile:
    """Measure ``models`` of ``repo`` on the embedded server (or the external one at ``url``); save to
    ``out_path``. ``calibrate``: instances per model in the co-located calibration runs the device's sharing law
    ``law`` is fitted to (0: none, processor sharing over the cores; ``law`` None: :data:`DEFAULT_LAW` on a CPU
    host, :data:`GPU_LAW` on a GPU); ``colocation``: instance counts for measured
    override curves S(k) (k > 1 measured; none by default); ``colocation_batches``: batch sizes of the curves
    (default 1 and the largest measured); ``pairs``: measure pair curves; ``rounds``: interleaved rounds per
    co-located point; ``idle_rounds``: rounds of the cold-start runs; ``threads``:
    threads per instance (embedded server; None: as served, module docstring); ``trace``: server-side times from
    Triton's request trace instead of the runners' execution logs; ``cuda_graphs``: serve TorchScript entries on GPU
    instances with CUDA graphs (``all`` or sizes, as ``serve --cuda-graphs``). Entries whose runtime pads batches
    (CUDA graphs, TVM's tuned buckets) are measured at their padded sizes by default, and the profile records them
    (``padded_sizes``)."""
    log = log or (lambda _msg: None)
    repo = Path(repo)
    require_count("--rounds", rounds)
    named = {m: read_config(entry_dir(repo, m) / CONFIG_NAME) for m in models}
    # an ensemble is simulated from its members (measured too, named or not) and measured alone for its own time
    ensembles = {m: ensemble_members(c) for m, c in named.items() if c.platform == "ensemble"}
    models = list(dict.fromkeys([m for m in models if m not in ensembles] + [m for e in ensembles.values() for m in e]))
    configs = {m: named[m] if m in named else read_config(entry_dir(repo, m) / CONFIG_NAME) for m in models}
    cores = cpu_cores()
    given = threads is not None
    if threads is None:
        threads = default_threads(sum(max(sum(g.count or 1 for g in c.instance_group), 1) for c in configs.values()))
    results = {m: _ModelResult(_device_of(c), c) for m, c in configs.items()}
    # the co-located servers' instances share the host's cores as served (else `threads` everywhere)
    spread = not given and not url and all(r.device == HOST_DEVICE for r in results.values())
    if law == GPU_LAW and any(r.device == HOST_DEVICE for r in results.values()):
        raise InputError("--law", law, "the serial law is for models on a GPU; these run on the host's cores")
    sizes, padded = {}, {}
    for m, config in configs.items():
        padded[m] = padded_sizes(config, cuda_graphs)
        wanted = list(batch_sizes) if batch_sizes else default_batch_sizes(config.max_batch_size, padded[m])
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

    def sessions(instances: int, per_instance: int = threads,
                 only: Sequence[str] | None = None) -> Callable[[], ContextManager[Session]]:
        """New sessions with ``instances`` of every model (of ``only`` where given, and then no ensemble)."""
        return lambda: open_session(repo, models if only is None else only, instances, per_instance, trace,
                                    cuda_graphs, notes, log, url, ensembles if only is None else ())

    # -- phase 1: one instance per model ---------------------------------------------------------------------------
    runs: dict = {}

    gpu_busy: dict[tuple[str, int], float | None] = {}  # (model, batch) -> NVML's busy share of its solo run

    def solo(m: str, b: int, phase: str = "solo") -> Step:
        def measure(session: Session) -> LoopRun:
            device = results[m].device
            if device == HOST_DEVICE:
                run = session.run({m: (b, 1)}, seconds)
            else:
                with GpuBusy(int(device[3:] or 0)) as busy:
                    run = session.run({m: (b, 1)}, seconds)
                gpu_busy[(m, b)] = None if busy.share is None else gpu_demand(busy.share, run, m, seconds)
            log(f"{m}: batch {b}: {len(run.latency[m])} requests, server compute {run.compute_s(m) * 1e3:.3f} ms")
            return run
        return (m, phase, b), measure

    def cold(name: str, r: int) -> Step:
        """Round ``r`` of the cold-start runs of a model or an ensemble: one-row requests, each a random quiet time
        after the previous one's back-to-back latency (an ensemble's: its members' summed, no less than its own)."""
        def measure(session: Session) -> LoopRun:
            index = models.index(name) if name in configs else len(models) + list(ensembles).index(name)
            rng = np.random.default_rng([r, index])  # seeded: the same quiet times in every profile
            quiet = rng.exponential(np.repeat(COLD_QUIET_S, COLD_BLOCK))
            spacing = sum(float(np.mean(runs[(m, "solo", 1)].latency[m])) for m in ensembles.get(name, [name]))
            return session.open_loop(name, 1, np.cumsum(spacing + quiet))
        return (name, "cold", r), measure

    def per_request(m: str) -> Step:
        def measure(session: Session) -> tuple:
            before = session.batch_stats([m])[m]
            with session.untraced():  # statistics only; see Session.untraced
                run = session.run({m: (1, min(configs[m].max_batch_size, PER_REQUEST_CONCURRENCY))}, seconds)
            return before, session.batch_stats([m])[m], run
        return (m, "per_request"), measure

    def split_run(m: str, c: int) -> Step:
        def measure(session: Session) -> LoopRun:
            with session.untraced():  # merged batch-1 requests: see Session.untraced (a trace has no CPU to split)
                return session.run({m: (1, c)}, seconds)
        return (m, "split", c), measure

    def split_levels(m: str) -> list[int]:
        """The concurrencies of the split runs beside the per-request one (``min(max_batch_size, 8)``)."""
        largest = configs[m].max_batch_size
        return [c for c in SPLIT_CONCURRENCY if c <= largest and c != min(largest, PER_REQUEST_CONCURRENCY)]

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

    def longest() -> tuple[str, float]:
        """The model of the longest service at its smallest batch size one at a time (phase 1's solo runs, Triton's
        compute time) and that service (s): the one whose executions the others wait behind."""
        service = {m: runs[(m, "solo", sizes[m][0])].compute_s(m) for m in models}
        slowest = max(models, key=lambda m: service[m])
        return slowest, service[slowest]

    def quiet_run(session: Session, rate: float) -> tuple[dict[str, float], LoopRun]:
        """An open loop of every model together, the longest at :data:`LONG_SHARE` of a core, the others at ``rate``:
        its rates (:func:`quiet_rates`) and the run."""
        rates = quiet_rates(models, *longest(), rate)
        return rates, session.replay(open_schedule(rates, QUIET_SECONDS, 0))

    calibrated = calibrate > 1 and not url and len({r.device for r in results.values()}) == 1
    quiet_waits = calibrated and len(models) > 1  # the wait for a core, on one instance and on `calibrate` each

    steps: list[Step] = []
    for m in models:
        config = configs[m]
        steps += [solo(m, b) for b in sizes[m]] + [cold(m, 0)]
        if not url:
            steps.append(((m, "gap"), lambda s, m=m: s.run({m: (sizes[m][-1], GAP_CONCURRENCY)},
                                                           max(seconds / 2, 0.5))))
        if config.HasField("dynamic_batching") and config.max_batch_size > 1:
            steps.append(per_request(m))
            steps += [split_run(m, c) for c in split_levels(m)]
    steps += [cold(m, r) for r in range(1, idle_rounds) for m in models]  # later rounds
    steps += [cold(e, r) for r in range(idle_rounds) for e in ensembles]
    for a, b in pair_list:
        steps += [pair(a, b, pb) for pb in sorted({1, min(sizes[a][-1], sizes[b][-1])})]
    if quiet_waits:  # after every solo run: longest() reads them
        steps += [(("quiet", 1, rate), lambda session, rate=rate: quiet_run(session, rate)[1])
                  for rate in QUIET_RATES_RPS]
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
            batch_demand, hop, request_demand = demands(runs[(m, "solo", b)], m)
            if r.device != HOST_DEVICE:  # the runner's CPU is the host's: on a GPU, the device's share (or none)
                batch_demand = gpu_busy.get((m, b))
            if batch_demand is not None:
                r.demand[b] = batch_demand
            if b == sizes[m][0]:
                r.request_demand, r.hop_s = request_demand, hop
            if b == 1:
                r.drift = phase_drift(runs[(m, "solo", b)], m, lone_wait_s(config, b))
            log(f"{m}: batch {b}: service mean {r.batches[b].mean * 1e3:.3f} ms, p99 "
                f"{r.batches[b].quantile(0.99) * 1e3:.3f} ms" +
                (f", {batch_demand:.2f} {'cores' if r.device == HOST_DEVICE else 'of the GPU'}"
                 if batch_demand is not None else "") + (
                    f"; overhead mean {r.overhead.mean * 1e3:.3f} ms, dispatch mean "
                    f"{r.dispatch.mean * 1e3:.3f} ms" if b == sizes[m][0] and r.dispatch is not None else "") +
                (f", {request_demand:.2f} cores on the way in and out (hop {hop * 1e6:.0f} us)"
                 if b == sizes[m][0] and request_demand is not None else ""))
        if r.drift is not None:
            lags = ", ".join(f"{v:+.2f} {k} ms apart" for k, v in r.drift["service_by_lag_ms"].items())
            log(f"{m}: one request's phases correlate (normal scores): in-service {r.drift['in_service']:+.2f}, "
                f"in-out {r.drift['in_out']:+.2f}, service-out {r.drift['service_out']:+.2f}; two services {lags}")
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

            before, after, batched = runs[(m, "per_request")]
            loaded = [batched] + [runs[(m, "split", c)] for c in split_levels(m)]
            r.per_request_s, used = per_request_cost(before, after, service_mean)
            by_cpu = (per_request_cpu([runs[(m, "solo", b)] for b in sizes[m]], loaded, m)
                      if r.device == HOST_DEVICE else None)
            log(f"{m}: per-request cost inside a batch {r.per_request_s * 1e6:.0f} us of Triton's compute time (from "
                f"{used} batches of 2+ requests)" + (f", {by_cpu[0] * 1e6:.0f} us of the runner's CPU (from "
                                                     f"{by_cpu[1]} batches): taken" if by_cpu is not None else ""))
            if by_cpu is not None:  # on the host's cores the time's slope holds the waits for a core
                r.per_request_s = by_cpu[0]
            alone = runs[(m, "solo", sizes[m][0])]
            points = [handoff_point(run, m) for run in (loaded if len(loaded) > 1 else [alone, batched])]
            split = handoff_split(points) if sizes[m][0] == 1 and r.dispatch is not None else None
            if split is not None:  # the ways in and out cost per request, the hand-offs per batch
                r.pickup_s = pickup_s(alone, m, lone_wait_s(config, 1), r.dispatch.mean)
                outside = r.dispatch.mean - r.pickup_s + r.overhead.mean
                # at most one core: a request's ways are a chain of hand-offs, one thread at a time (more is the
                # server's background CPU, its idle stubs' pollers, counted in the run)
                r.request_demand = min(split[0] / outside, 1.0) if outside > 0 else r.request_demand
                r.handoff_cpu_s = split[1]
                log(f"{m}: host CPU outside the runtime per request, by requests per batch: " +
                    ", ".join(f"{n:.1f}: {o * 1e6:.0f} us" for n, o in sorted(points)))
                log(f"{m}: host CPU outside the runtime {split[0] * 1e6:.0f} us per request "
                    f"({r.request_demand:.2f} cores on the way in and out) + {split[1] * 1e6:.0f} us per batch; "
                    f"an idle instance takes up a payload in {r.pickup_s * 1e6:.0f} us")

        r.idle = cold_starts(runs, m, lone_wait_s(config, 1))
        if r.idle is not None:
            e = r.idle
            log(f"{m}: cold start (us): service +{_us(e.service_extra_s)} after {_us(e.service_idle_s)} idle; way in "
                f"+{_us(e.dispatch_extra_s)} (p90 +{_us(e.dispatch_extra_p90_s)}), way out "
                f"+{_us(e.overhead_extra_s)} (p90 +{_us(e.overhead_extra_p90_s)}) after {_us(e.overhead_gap_s)} since "
                "the previous request")

    # -- phase 1b: the solo batches at one runtime thread per instance ---------------------------------------------
    single = [m for m in models if results[m].device == HOST_DEVICE] if threads > 1 and not url else []
    if single:
        run_steps([solo(m, b, "solo at 1 thread") for m in single for b in sizes[m]], runs, sessions(1, 1, single),
                  log, notes, "one thread per instance")
    for m in single:
        r, batches, demand = results[m], {}, {}
        for b in sizes[m]:
            run = runs[(m, "solo at 1 thread", b)]
            batches[b] = thin(service_and_overhead(run, m, lone_wait_s(configs[m], b), None)[0])
            batch_demand = demands(run, m)[0]
            if batch_demand is not None:
                demand[b] = batch_demand
            log(f"{m}: batch {b} at 1 thread: service mean {batches[b].mean * 1e3:.3f} ms ("
                f"{batches[b].mean / r.batches[b].mean:.2f} x at {threads})" +
                (f", {batch_demand:.2f} cores" if batch_demand is not None else ""))
        r.other_threads[1] = ThreadTable(batches, demand)

    # -- phase 2: co-location curves -------------------------------------------------------------------------------
    kmax = max(ks, default=1)
    curve_threads = default_threads(kmax * len(models)) if spread and ks else threads
    if ks:
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
                        s, why = colocation_speedup(float(k), values, solo_times)
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
        run_steps(curve_steps, curves, sessions(kmax, curve_threads), log, notes, "co-location", restarts)
        for (m, _), measured in curves.items():
            if measured is not None:
                results[m].curves.append(measured)

    # -- phase 3: co-located calibration runs, the device's sharing law fitted to them ----------------------------
    observations: list[Observation] = []
    waits = None  # the wait for a core behind a long execution, measured
    if calibrated:
        device = results[models[0]].device
        serving = {m: calibration_serving(configs[m], device, calibrate, sizes[m][-1]) for m in models}
        per_instance = default_threads(calibrate * len(models)) if spread else threads

        def observe(clients: dict[str, int]) -> Step:
            def measure(session: Session) -> Observation:
                rates: dict[str, list[float]] = {m: [] for m in clients}
                tails: dict[str, list[float]] = {m: [] for m in clients}
                for _ in range(rounds):
                    run = session.run({m: (1, c) for m, c in clients.items()}, seconds)
                    for m in clients:
                        rates[m].append(len(run.latency[m]) / seconds)
                        tails[m].append(float(np.percentile(run.latency[m], 99)))
                obs = Observation(device, {m: serving[m] for m in clients}, clients,
                                  {m: float(np.median(v)) for m, v in rates.items()},
                                  measured_p99={m: float(np.median(v)) for m, v in tails.items()},
                                  threads=per_instance)
                log(f"co-located: {obs.label()}: " + ", ".join(f"{m} {r:.1f} req/s"
                                                               for m, r in obs.measured_rps.items()))
                return obs
            return tuple(sorted(clients.items())), measure

        slowest = longest()[0]
        quiet_runs: dict[float, LoopRun] = {}

        def observe_quiet(rate: float) -> Step:
            def measure(session: Session) -> Observation:
                rates, run = quiet_run(session, rate)
                quiet_runs[rate] = run
                obs = Observation(device, serving, {}, {m: len(run.latency[m]) / QUIET_SECONDS for m in models},
                                  measured_p99={m: float(np.percentile(run.latency[m], 99)) for m in models},
                                  rates=rates, seconds=QUIET_SECONDS, threads=per_instance)
                log(f"open loop: {obs.label()}: p99 " + ", ".join(f"{m} {v * 1e3:.2f} ms"
                                                                  for m, v in obs.measured_p99.items()))
                return obs
            return ("open", rate), measure

        steps = [observe({m: calibrate}) for m in models]
        if len(models) > 2:  # each model beside the longest, one client each: the waits behind a long execution
            steps += [observe({slowest: 1, m: 1}) for m in models if m != slowest]
        if len(models) > 1:
            steps += [observe({m: 1 for m in models}), observe({m: calibrate for m in models})]
        else:  # one model: more throughputs, with twice the clients (queued for its instances, the cores busy) and
            # with LOADED_CLIENTS times (batches of several requests: where perf_analyzer's sweeps and the tuner go)
            steps += [observe({models[0]: 2 * calibrate})]
            if configs[models[0]].max_batch_size > 1 and configs[models[0]].HasField("dynamic_batching"):
                steps += [observe({models[0]: LOADED_CLIENTS * calibrate})]
        if quiet_waits:  # and beside its occasional batches, as on the one-instance server
            steps += [observe_quiet(rate) for rate in QUIET_RATES_RPS]
        done: dict = {}
        run_steps(steps, done, sessions(calibrate, per_instance), log, notes, "calibration", restarts)
        observations = list(done.values())
        if quiet_waits:
            one = [runs[("quiet", 1, rate)] for rate in QUIET_RATES_RPS]
            waits = quiet_wait(list(quiet_runs.values()), slowest, WAIT_S_RANGE, calibrate * len(models),
                               (len(models), one))
        if waits is not None:
            fewer = (f"; on one instance per model ({waits.instances_fewer} in all) {waits.waited_fewer} of "
                     f"{waits.beside_fewer}: wait_p {waits.p_fewer:.2f}" if waits.p_fewer is not None else "")
            log(f"{device}: beside {slowest}'s occasional batches, on {calibrate} instances per model "
                f"({waits.instances} in all) {waits.waited} of {waits.beside} requests waited > "
                f"{WAITED_S * 1e3:g} ms on their way in: wait_p {waits.p:.2f}, a wait up to {waits.slice_s * 1e3:.1f} "
                f"ms, after {waits.quiet_s * 1e3:.1f} ms of quiet{fewer} (the chance follows the host's instances in "
                "all: docs/sim.md)")

    pair_curves = []
    for a, b in pair_list:
        for pb in sorted({1, min(sizes[a][-1], sizes[b][-1])}):
            values, solo_a, solo_b = runs[(a, b, pb)]
            if not values:
                continue
            s, why = colocation_speedup(2.0, values, solo_a + solo_b)
            log(f"{a} + {b}: batch {pb}: one batch of each at once: S_pair(2) = {s:.2f} "
                f"(rounds {', '.join(f'{x:.2f}' for x in values)}; {why})")
            pair_curves.append(PairCurve(results[a].device, (a, b), Curve(pb, (1.0, 2.0), (1.0, s))))

    profiles = {}
    for m in models:
        r = results[m]
        md = ModelOnDevice(_mode_of(r.config, padded[m]), r.batches,
                           tuple(sorted(r.curves, key=lambda c: c.batch)), threads, r.per_request_s, None, r.gap_s,
                           r.idle, tuple(padded[m]), r.demand, r.hop_s, r.handoff_cpu_s, r.pickup_s, r.other_threads,
                           curve_threads if r.curves else 0)
        profiles[m] = ModelProfile(m, r.config.platform or r.config.backend, "fp32", {r.device: md}, r.overhead,
                                   r.dispatch, r.request_demand, r.drift)
    hosted = any(r.request_demand is not None for r in results.values())
    devices = {}
    for d in sorted({r.device for r in results.values()} | ({HOST_DEVICE} if hosted else set())):
        if d == HOST_DEVICE:
            devices[d] = DeviceInfo(d, "cpu", platform.processor() or platform.machine(), cores=cores)
        else:
            devices[d] = DeviceInfo(d, "gpu", _gpu_name(int(d[3:]) if d[3:].isdigit() else 0))
    overall = Dist.constant(float(np.mean([profiles[m].overhead.mean for m in models])))
    where = url or "embedded tritonserver"
    server_side = any(run.executions is not None for run in runs.values() if isinstance(run, LoopRun))
    source = ("Triton's request trace" if trace else "the runners' execution logs, plus Triton's hop to the runner")
    profile = Profile(devices, profiles, overall, tuple(pair_curves),
                      host={"hostname": socket.gethostname(), "cpu": platform.processor() or platform.machine(),
                            "cores": cores, "os": platform.platform(), "server": where, **sender_of(runs.values())},
                      source=f"measured on {where} from {repo}",
                      created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      notes=tuple(notes + [f"service = Triton's compute time per batch ({source})" if server_side
                                           else "service = client latency - mean overhead"]),
                      request_device=HOST_DEVICE if hosted else None)
    if observations:
        law = law or (GPU_LAW if profile.devices[observations[0].device].kind == "gpu" else DEFAULT_LAW)
        fitted, err = fit_law(profile, observations[0].device, observations, law,
                              measured=waits.law() if waits is not None else None)
        profile = dataclasses.replace(with_law(profile, observations[0].device, fitted),
                                      calibration=tuple(o.to_json() for o in observations))
        text = ", ".join(f"{k} {v:.3g}" for k, v in fitted.items() if k != "name")
        tails = (f" and p99 error of {tail_error(profile, observations) * 100:.1f} %" if "wait_p" in fitted else "")
        log(f"{observations[0].device}: sharing law {law}" + (f" ({text})" if text else "") +
            f" fits the {len(observations)} co-located runs with a mean throughput error of {err * 100:.1f} %{tails}")
        warning = fit_warning(fitted, err)
        if warning is not None:
            log(f"warning: {warning}")
            profile = dataclasses.replace(profile, notes=profile.notes + (warning,))
    if ensembles:
        graphs = {e: (members, ensemble_deps(named[e])) for e, members in ensembles.items()}
        profile = dataclasses.replace(profile, ensembles=ensembles_alone(profile, graphs, runs, log, {
            m: calibration_serving(configs[m], results[m].device, 1, sizes[m][-1]) for m in models}, threads))
    if out_path is not None:
        profile.save(out_path)
    return profile


def ensembles_alone(profile: Profile, graphs: Mapping[str, tuple[list[str], tuple]], runs: Mapping,
                    log: Callable[[str], None], serving: Mapping[str, ModelServing],
                    threads: int) -> dict[str, EnsembleExtra]:
    """Each ensemble's time beyond its members' path (:func:`~serving_bench.calibrate.estimators.ensemble_extra`):
    its runs alone at random quiet times (``runs[(e, "cold", round)]``) against the same requests simulated with
    ``profile`` on one instance per member (``serving`` and ``threads`` per instance: how phase 1 served them);
    ``graphs``: per ensemble its members in step order and each step's needs (``export.repository.ensemble_deps``)."""
    out = {}
    for e, (members, deps) in graphs.items():
        config = ServingConfig(tuple(serving[m] for m in members), ((e, tuple(members)),), ((e, deps),), threads)
        since, measured, simulated = [], [], []
        for key in sorted((k for k in runs if k[:2] == (e, "cold")), key=lambda k: k[2]):
            run = runs[key]
            send = run.sent[e] - run.sent[e][0]
            since.append(np.diff(send, prepend=-np.inf))
            measured.append(run.done[e] - run.sent[e])
            simulated.append(alone_latency(profile, config, e, send))
        extra = ensemble_extra(np.concatenate(since), np.concatenate(measured), np.concatenate(simulated, axis=1))
        if extra is not None:
            out[e] = extra
            log(f"{e}: its own time beyond its members' path alone (us): +{_us(extra.extra_s)} (p90 "
                f"+{_us(extra.extra_p90_s)}) after {_us(extra.gap_s)} since the previous request")
    return out


def fit_warning(law: dict, err: float) -> str | None:
    """The profile's note (starting :data:`UNCERTAIN_NOTE`) when its law, fitted with mean throughput error ``err``
    on its calibration runs, misses them by more than :data:`FIT_WARNING` or sits on a bound of a parameter's range
    (:func:`~serving_bench.sim.interference.pinned`); None when the fit is trustworthy."""
    bounds = pinned(law)
    if err <= FIT_WARNING and not bounds:
        return None
    why = (f"by {err * 100:.0f} % on average (over {FIT_WARNING * 100:.0f} %)" if err > FIT_WARNING else
           "with " + ", ".join(f"{k} {law[k]:.3g} on a bound of its range {lo:g}..{hi:g}"
                               for k, (lo, hi) in bounds.items()) +
           f" (mean error {err * 100:.0f} %)")
    return (f"{UNCERTAIN_NOTE} {why}: predictions from this profile are uncertain; measure it again on a quiet "
            "machine (nothing else running)")


def uncertain(profile: Profile) -> bool:
    """Does the profile's sharing law miss its own calibration runs (:func:`fit_warning`: its notes say so)?"""
    return any(note.startswith(UNCERTAIN_NOTE) for note in profile.notes)


def _gpu_name(index: int) -> str:
    try:
        import pynvml  # optional: only where a GPU is

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no NVML here: the name is only informative
        return ""


def _mode_of(config, padded: Sequence[int] = ()) -> str:
    if padded and _cuda_graph_entry(config):
        return "cuda_graphs"
    if config.platform == "tensorrt_plan":
        return "tensorrt"
    if config.platform in ("pytorch_libtorch",) or config.backend == "pytorch":
        return "eager"
    return "n/a"
