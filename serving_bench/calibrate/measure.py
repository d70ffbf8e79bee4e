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
  2.51 aborted in most demo profiles
  (docs/serve.md#request-tracing-in-the-bundled-tritonserver-251); ``trace=True`` reads the batches from the trace instead.
  Against an external server (``url``) neither exists: each figure then comes from Triton's statistics extension
  (the counters around every run, per executed batch size; the service time's spread from paced runs,
  :mod:`~serving_bench.calibrate.paced`), from the host CPU of a server on this machine (its instances' processes
  in place of the runners' logged CPU), and, where the server allows model control, from each phase's instance
  counts loaded through it (docs/profiles.md#against-any-triton-profile---url).
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
  (:func:`~serving_bench.calibrate.estimators.phase_drift`; docs/sim.md#the-hosts-speed-drifts).
* **Cold starts** (``idle``): requests of one row sent one at a time, each after the previous answer plus a random quiet
  time (exponential, seeded; open loop; :data:`~serving_bench.calibrate.alone.COLD_BLOCK` requests at each mean of
  :data:`~serving_bench.calibrate.alone.COLD_QUIET_S`, rising); binned by the time since the previous request (by the
  instance's recent idle time for the service: the weighted mean of its last idle times), the median service time,
  dispatch and overhead of each bin minus those of the back-to-back run give how much a start after idle time costs
  (runtime threads parked, caches cold: on 2 cores an ONNX Runtime model computes twice as long after 16 ms idle as back
  to back). A batch's warmth follows the model's recent rate, not only its last gap
  (:func:`~serving_bench.calibrate.cold.cold_starts`). The simulator adds it per batch from the instance's recent idle
  time and per request from the time since the previous request. The ways in and out also keep their extra at the 90th
  percentile: a cold way's tail grows more than its middle (docs/sim.md#the-hosts-speed-drifts); a draw takes the
  median extra up to probability 0.5 and the p90 one from 0.9.
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
  cost of each extra request (clamped at 0). Where the runners log their CPU, the runner's own CPU slope
  (:func:`~serving_bench.calibrate.estimators.per_request_cpu`) is logged beside it: it misses the per-request work
  Triton and the stub do around the runner (each request's inputs and outputs), half of the slope or more on this
  2-core VM (docs/profiles.md#big-batches).
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
* **Calibration** (``calibrate`` instances per model, one server): closed loops of one-row requests — each model alone
  with ``calibrate`` clients, each beside the model of the longest batch-1 service (one client each; with three models
  or more), then all models together with one client each and with ``calibrate`` each (a lone model: with
  ``2 * calibrate`` clients instead, so its law is not fitted to one throughput, and with dynamic batching with
  :data:`~serving_bench.calibrate.calibration.LOADED_CLIENTS` ``* calibrate``, so it is fitted where batches hold
  several requests too) — ``rounds`` times, the median answered requests per second and p99; then two open loops of all
  models together at Poisson times, the longest at a rate that keeps :data:`~serving_bench.calibrate.plan.LONG_SHARE` of
  a core busy (a batch now and then, as production traffic has it), every other at each rate of
  :data:`~serving_bench.calibrate.plan.QUIET_RATES_RPS` (a quiet host, then a busier one), their p99s. The device's
  sharing law (``law``, default ``pool_eff+wait`` on a CPU host, ``serial`` — nothing to fit — on a GPU) is fitted to
  them through the simulator (:mod:`serving_bench.sim.interference`: the throughputs of the closed loops); its wait for
  a core behind a long execution is measured in the open loops (the requests sent while a batch of the longest ran, by
  how quiet the host was: :func:`~serving_bench.calibrate.waits.quiet_wait`) — those two also on the one-instance server
  of the first phase, so that the wait's chance follows the host's instances in all (the law's ``wait_instances``) — or,
  without them, fitted on the p99s of the light closed loops. The runs are kept in the profile (``calibration``).
  How much the rounds of each closed loop differ beyond what their finite samples explain is the host's run-to-run
  spread (``host_spread``: :func:`~serving_bench.calibrate.estimators.host_spread`), which the simulator's intervals
  draw a host speed from (:mod:`serving_bench.sim.intervals`).
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

The pipeline (:func:`measure_profile`), each step a module: :mod:`~serving_bench.calibrate.plan` (the options
resolved against the repository), :mod:`~serving_bench.calibrate.alone` (the runs with one instance per model, and
at one thread), :mod:`~serving_bench.calibrate.figures` (each model's figures from them),
:mod:`~serving_bench.calibrate.colocation` (the curves), :mod:`~serving_bench.calibrate.calibration` (the
calibration runs and the law's fit); the estimators (pure functions over the runs, the executed batches and the
statistics) are :mod:`~serving_bench.calibrate.estimators`, :mod:`~serving_bench.calibrate.cold` and
:mod:`~serving_bench.calibrate.waits`.

**Recovery.** Each phase is a list of steps (one per measured point). A server that dies during a step (a crash, a kill)
is started again and the phase resumes at that step, at most :data:`~serving_bench.calibrate.session.MAX_RESTARTS` times
per phase; each restart is logged and noted in the profile. An external server (``url``) is not restarted.

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
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from serving_bench.calibrate.alone import measure_alone, measure_one_thread
from serving_bench.calibrate.calibration import calibration_runs, fit_sharing_law
from serving_bench.calibrate.cold import ensemble_extra
from serving_bench.calibrate.colocation import measure_curves, pair_curves
from serving_bench.calibrate.figures import estimate_model, estimate_one_thread, us
from serving_bench.calibrate.lab import Lab
from serving_bench.calibrate.plan import HOST_DEVICE, MeasureConfig, calibration_serving, cuda_graph_entry, \
    plan_measurement
from serving_bench.calibrate.resources import measure_resources, with_resources
from serving_bench.calibrate.runs import LoopRun
from serving_bench.export.repository import ensemble_deps
from serving_bench.profiles.distributions import Dist, EnsembleExtra
from serving_bench.profiles.entries import ModelOnDevice, ModelProfile
from serving_bench.profiles.schema import DeviceInfo, PairCurve, Profile
from serving_bench.serving_config import ModelServing, ServingConfig
from serving_bench.sim.interference import alone_latency


def measure_profile(repo: str | Path, models: Sequence[str], out_path: str | Path | None = None,
                    config: MeasureConfig = MeasureConfig(), log: Callable[[str], None] | None = None) -> Profile:
    """Measure ``models`` of ``repo`` as ``config`` says (on the embedded server, or the external one at its
    ``url``); save to ``out_path``. Entries whose runtime pads batches (CUDA graphs, TVM's tuned buckets) are
    measured at their padded sizes by default, and the profile records them (``padded_sizes``)."""
    lab = Lab(plan_measurement(repo, models, config), log or _silent)
    measure_alone(lab)
    resources = measure_resources(lab)
    for m in lab.plan.models:
        estimate_model(lab, m)
    measure_one_thread(lab)
    estimate_one_thread(lab)
    curve_threads = measure_curves(lab)
    observations, waits, spread = calibration_runs(lab)
    profile = with_resources(dataclasses.replace(assemble(lab, curve_threads, pair_curves(lab)), host_spread=spread),
                             resources)
    if observations:
        profile = fit_sharing_law(lab, profile, observations, waits)
    if lab.plan.ensembles:
        profile = dataclasses.replace(profile, ensembles=ensembles_of(lab, profile))
    if out_path is not None:
        profile.save(out_path)
    return profile


def _silent(_line: str) -> None:
    """A log that says nothing."""


def assemble(lab: Lab, curve_threads: int, pairs: list[PairCurve]) -> Profile:
    """The profile of the models' figures so far (the law not yet fitted, no ensembles): where each was measured,
    the host and how (the notes)."""
    plan, results = lab.plan, lab.results
    profiles = {}
    for m in plan.models:
        r, variant, fixed = results[m], plan.variant(m), plan.fixed_threads(m)
        md = ModelOnDevice(mode_of(r.config, plan.padded[m]), r.batches,
                           tuple(sorted(r.curves, key=lambda c: c.batch)), fixed or plan.threads, r.per_request_s,
                           None, r.gap_s, r.idle, tuple(plan.padded[m]), r.demand, r.hop_s, r.handoff_cpu_s,
                           r.pickup_s, {} if fixed else r.other_threads, curve_threads if r.curves else 0)
        profiles[m] = ModelProfile(m, r.config.platform or r.config.backend,
                                   variant.precision if variant is not None else "fp32", {r.device: md}, r.overhead,
                                   r.dispatch, r.request_demand, r.drift, plan.zoo_model(m),
                                   variant.id if variant is not None else "")
    hosted = any(r.request_demand is not None for r in results.values())
    devices = {}
    for d in sorted({r.device for r in results.values()} | ({HOST_DEVICE} if hosted else set())):
        if d == HOST_DEVICE:
            devices[d] = DeviceInfo(d, "cpu", platform.processor() or platform.machine(), cores=plan.cores)
        else:
            devices[d] = DeviceInfo(d, "gpu", gpu_name(int(d[3:]) if d[3:].isdigit() else 0))
    overall = Dist.constant(float(np.mean([profiles[m].overhead.mean for m in plan.models])))
    where = plan.config.url or "embedded tritonserver"
    server_side = any(run.executions is not None for run in lab.runs.values() if isinstance(run, LoopRun))
    source = ("Triton's request trace" if plan.config.trace
              else "the runners' execution logs, plus Triton's hop to the runner")
    return Profile(devices, profiles, overall, tuple(pairs),
                   host={"hostname": socket.gethostname(), "cpu": platform.processor() or platform.machine(),
                         "cores": plan.cores, "os": platform.platform(), "server": where,
                         **sender_of(lab.runs.values())},
                   source=f"measured on {where} from {plan.repo}",
                   created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   notes=tuple(lab.notes + [f"service = Triton's compute time per batch ({source})" if server_side
                                            else "service = Triton's mean compute time per batch size (statistics "
                                            "extension), spread as the client latencies"]),
                   request_device=HOST_DEVICE if hosted else None)


def ensembles_of(lab: Lab, profile: Profile) -> dict[str, EnsembleExtra]:
    """Each named ensemble's own time (:func:`ensembles_alone`) against ``profile``, its members served as in the
    runs with one instance per model."""
    plan = lab.plan
    graphs = {e: (members, ensemble_deps(plan.named[e])) for e, members in plan.ensembles.items()}
    serving = {m: calibration_serving(plan.configs[m], plan.devices[m], 1, plan.sizes[m][-1]) for m in plan.models}
    return ensembles_alone(profile, graphs, lab.runs, lab.log, serving, plan.threads)


def ensembles_alone(profile: Profile, graphs: Mapping[str, tuple[list[str], tuple]], runs: Mapping,
                    log: Callable[[str], None], serving: Mapping[str, ModelServing],
                    threads: int) -> dict[str, EnsembleExtra]:
    """Each ensemble's time beyond its members' path (:func:`~serving_bench.calibrate.cold.ensemble_extra`):
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
            log(f"{e}: its own time beyond its members' path alone (us): +{us(extra.extra_s)} (p90 "
                f"+{us(extra.extra_p90_s)}) after {us(extra.gap_s)} since the previous request")
    return out


def gpu_name(index: int) -> str:
    """GPU ``index``'s name as NVML gives it ("" where NVML is not here: the name is only informative)."""
    try:
        import pynvml  # optional: only where a GPU is

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no NVML here: the name is only informative
        return ""


def mode_of(config, padded: Sequence[int] = ()) -> str:
    """The execution mode a profile records for an entry served by ``config`` (padded to ``padded`` sizes)."""
    if padded and cuda_graph_entry(config):
        return "cuda_graphs"
    if config.platform == "tensorrt_plan":
        return "tensorrt"
    if config.platform in ("pytorch_libtorch",) or config.backend == "pytorch":
        return "eager"
    return "n/a"


def sender_of(runs) -> dict[str, str]:
    """``{"sender": name}`` for the profile's ``host``: the load driver's sender its runs went through (``native``
    or ``python``; both, comma-separated, if they differed), or nothing where no run said. A request's ways in and
    out include its sender's own time, so a profile holds for replays through the same sender
    (docs/profiles.md#measurement-profile---repo)."""
    names = sorted({r.sender for r in runs if isinstance(r, LoopRun) and r.sender})
    return {"sender": ", ".join(names)} if names else {}
