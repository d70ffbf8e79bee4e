"""Every GPU check in one go (run by ``scripts/gpu_check.sh``): the co-location effect of N instances of one model on
one device, and one heterogeneous pair, measured on the real tritonserver with closed-loop load at batch 1, open-loop
replays, a profile, and the simulator's prediction of the same runs from that profile.

GPU plan (default where torch sees a CUDA device): resnet50 and bert_base exported to TorchScript in fp16, served by
the torch CUDA runner on KIND_GPU instances. Runs, most wanted first (a step that fails is recorded with its error and
the server log's tail, and the next one runs):

1. one server with both models, one instance each: resnet50 alone, bert_base alone, then both at once (the pair),
   then open-loop replays of both at ``loads`` of the pair's measured rates (Poisson, :func:`open_schedule`);
2. the profile ``serving-bench profile`` measures of both models (one instance each, then the sharing law fitted to
   ``calibrate`` instances per model; short runs; before the sweep since 2026-12-04: the first H200 session's sweep
   ran three times and its profile not once);
3. one server per instance count N in 2, 4, 8 (N = 1 is run 1): resnet50 alone;
4. CUDA graphs (batch size 1 captured) at N = 1 and 8: resnet50 alone;
5. resnet50 exported to TensorRT (fp16) and served alone, where ``import tensorrt`` works (else skipped, saying why).

The simulator's prediction of runs 1 and 3 from the profile of 2 (:func:`predict`, beside the baseline without
interference and, for the sweep, the law fitted on N <= 4 predicting N = 8) is computed on the CPU plan at the end, and
for a GPU result afterwards on any machine: ``scripts/gpu_check.py --predict RESULT.json`` (the GPU host's Python has
no compiled engine, and its minutes are the scarce ones).

Each run keeps ``2 N`` requests in flight per model (every instance busy with one more queued), for ``duration_s``
after a warm-up. Dynamic batching is switched off so every executed batch is the request's batch 1: the figures are
the instances' co-location, not batching. Telemetry (NVML utilisation, memory, power; CPU) is sampled during each run.

CPU plan (``--cpu``, or no GPU): the same steps with tiny_cnn and tiny_mlp in fp32 on KIND_CPU instances, instance
counts 1 and 2, no CUDA graphs: it checks the script end to end on a machine without a GPU; its figures say nothing
about a GPU.

Writes ``gpu_check_<date>_<machine>.json`` and ``.md`` into ``--out`` (default ``benchmarks/results``). Steps that
would not fit in ``--budget-s`` are listed as skipped with that reason rather than run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Plan:
    """What to measure. Times in seconds."""

    mode: str
    pair: tuple[str, str]  # (swept model, partner)
    precision: str
    sweep: tuple[int, ...]
    graphs_at: tuple[int, ...]
    duration_s: float
    warmup_s: float
    max_batch_size: int = 8
    seq_len: int = 128
    senders: int = 1  # client processes driving the closed loop (one Python process tops out at a few 1000 req/s)
    step_estimate_s: float = 30.0  # server start + run, to decide what still fits the budget
    loads: tuple[float, ...] = (0.5, 0.85)  # open-loop replays of the pair, as shares of its closed-loop rates
    replay_s: float = 8.0  # each replay's length
    calibrate: int = 2  # the profile's calibration runs: instances per model (0: none, no sharing law fitted)
    profile_seconds: float = 1.0  # the profile's seconds per measured point
    profile_estimate_s: float = 150.0  # the profile's time, to decide whether it still fits the budget


PLANS = {
    "gpu": Plan("gpu", ("resnet50", "bert_base"), "fp16", (1, 2, 4, 8), (1, 8), duration_s=8.0, warmup_s=2.0,
                step_estimate_s=45.0, senders=4),
    "cpu": Plan("cpu", ("tiny_cnn", "tiny_mlp"), "fp32", (1, 2), (), duration_s=3.0, warmup_s=1.0,
                step_estimate_s=15.0, replay_s=4.0, profile_estimate_s=90.0),
}
QUICK = {"duration_s": 1.0, "warmup_s": 0.3, "replay_s": 2.0, "calibrate": 0, "profile_seconds": 0.5,
         "profile_estimate_s": 30.0}
MAX_RATE_RPS = 20_000  # upper bound on one model's closed-loop rate, to size the request list


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "unknown"


def machine_facts(gpu: bool) -> dict:
    """Host, Python, torch, and the GPU (name, driver, memory) or CPU model."""
    import torch

    facts = {"python": platform.python_version(), "torch": torch.__version__, "cores": os.cpu_count(),
             "platform": platform.platform(), "load_average_1m": round(os.getloadavg()[0], 2)}
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or "cpu"
    facts["cpu"] = cpu
    if gpu:
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                     gpu_memory_bytes=int(props.total_memory), sms=int(props.multi_processor_count),
                     cuda=torch.version.cuda)
        try:
            import pynvml

            pynvml.nvmlInit()
            facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
        except Exception as err:  # noqa: BLE001 - a fact we can do without
            facts["driver"] = f"unknown ({type(err).__name__})"
        facts["machine"] = slug(facts["gpu"])
    else:
        facts["machine"] = f"cpu{os.cpu_count()}-{slug(cpu)}"
    return facts


def export_repo(plan: Plan, repo: Path) -> dict[str, dict]:
    """Export the plan's two models to TorchScript (exporter API, parity checked) and switch dynamic batching off;
    returns how each entry is served (``ModelServing`` as a dict, one instance), for :func:`predict`."""
    from serving_bench.export.api import export_models
    from serving_bench.export.frameworks import ExportOptions

    records = export_models(list(plan.pair), ["torchscript"], repo,
                            options=ExportOptions(max_batch_size=plan.max_batch_size, precision=plan.precision,
                                                  seq_len=plan.seq_len if "bert_base" in plan.pair else None),
                            log=lambda line: print(f"  {line}", flush=True))
    failed = [f"{r['name']}: {r.get('reason')}" for r in records if r["status"] != "exported"]
    if failed:
        raise SystemExit(f"export failed: {'; '.join(failed)}")
    return {m.name: dataclasses.asdict(m) for m in serve_unbatched(repo, plan.mode).models}


def serve_unbatched(repo: Path, mode: str):
    """Switch dynamic batching off in every entry of ``repo`` (and, in the ``cpu`` mode, put its instances on the
    CPU: the exporter writes KIND_GPU where a GPU exists); returns the ``ServingConfig`` the repository now holds."""
    from serving_bench.serving_config import ServingConfig

    config = ServingConfig.from_repo(repo)
    for model in config.models:
        changes = {"dynamic_batching": False}
        if mode == "cpu":
            changes["instances"] = (("cpu", model.instance_count),)
        config = config.with_model(model.replace(**changes))
    config.apply_to_repo(repo)
    return ServingConfig.from_repo(repo)


def closed_schedule(models: list[str], duration_s: float, seed: int = 0):
    """Enough batch-1 requests per model for ``duration_s`` of closed-loop load (arrival times unused)."""
    from serving_bench.run.schedule import Schedule

    per_model = int(MAX_RATE_RPS * duration_s)
    n = per_model * len(models)
    rng = np.random.default_rng(seed)
    return Schedule(arrival_s=np.zeros(n), model=np.repeat(np.arange(len(models)), per_model), models=tuple(models),
                    sample=rng.integers(0, 16, size=n), batch=np.ones(n),
                    meta={"duration_s": duration_s, "seed": seed, "mode": "closed"})


def measure(server, models: list[str], concurrency: dict[str, int], plan: Plan, label: str, **facts) -> dict:
    """One closed-loop run against ``server``: per model throughput, p50/p99 (ms) and counts, plus telemetry."""
    from serving_bench.load.driver import SendOptions, TritonTarget
    from serving_bench.run.target import ClosedLoop
    from serving_bench.run.metrics import summarize
    from serving_bench.telemetry import Telemetry

    total_s = plan.warmup_s + plan.duration_s
    target = TritonTarget(server, mode=ClosedLoop(concurrency=concurrency, duration_s=total_s),
                          send=SendOptions(senders=min(plan.senders, max(1, sum(concurrency.values())))))
    start = time.perf_counter()
    with Telemetry(server.endpoints.metrics_url, interval_s=0.5, pid=server.pid) as telemetry:
        records = target.run(closed_schedule(models, total_s))
    summary = summarize(records, warmup_s=plan.warmup_s, duration_s=total_s)
    tel = telemetry.summary(start_s=plan.warmup_s)
    run = {"label": label, **facts, "models": {}, "concurrency": concurrency, "duration_s": plan.duration_s,
           "warmup_s": plan.warmup_s, "partial": summary["partial"], "stop_reason": records.info.stop_reason,
           "gpu": {k: tel.get("gpu", {}).get(k) for k in ("available", "reason", "util_mean_pct", "util_peak_pct",
                                                          "mem_used_peak_bytes", "power_peak_w")},
           "cpu": tel.get("cpu", {}), "wall_s": round(time.perf_counter() - start, 2)}
    for name in models:
        server_side = tel["models"].get(name, {})
        run["models"][name] = model_figures(summary["models"][name], server_side.get("queue_s_mean"),
                                            server_side.get("compute_s_mean"))
    say(run)
    return run


def model_figures(s: dict, queue_s: float | None = None, compute_s: float | None = None) -> dict:
    """One model's row of a run from its ``run.metrics.summarize`` entry (and Triton's mean queue and compute time
    per request, s, where sampled): throughput, p50/p99 and server times in ms, and the counts."""
    return {"throughput_rps": round(s["throughput_rps"], 2), "p50_ms": _ms(s["p50_s"]), "p99_ms": _ms(s["p99_s"]),
            "ok": s["counts"]["ok"], "failed": s["counts"]["failed"], "timeout": s["counts"]["timeout"],
            "server_queue_ms": _ms(queue_s), "server_compute_ms": _ms(compute_s)}


def say(run: dict) -> None:
    """Print a run's line: per model req/s, p50 and p99."""
    print(f"  {run['label']}: " + "; ".join(f"{n}: {m['throughput_rps']:.1f} req/s, p50 {m['p50_ms']} ms, p99 "
                                            f"{m['p99_ms']} ms" for n, m in run["models"].items()), flush=True)


class ServedParity:
    """Served outputs against the fp32 torch module (the exporter's parity measure and tolerance), through the whole
    served path (runner on the instance's device, CUDA graphs when on). Reference outputs are computed once."""

    def __init__(self, plan: Plan, seed: int = 0):
        self.plan, self.seed = plan, seed
        self.cache: dict[str, tuple] = {}

    def reference(self, model: str):
        if model not in self.cache:
            from serving_bench.export.parity import torch_outputs
            from serving_bench.models import get_model

            spec = get_model(model, **({"seq_len": self.plan.seq_len} if model == "bert_base" else {}))
            inputs = spec.make_inputs(2, self.seed)
            self.cache[model] = (spec.with_precision(self.plan.precision), inputs,
                                 torch_outputs(spec.create(self.seed), spec, inputs))
        return self.cache[model]

    def check(self, server, entries: list[str]) -> dict[str, float]:
        """Relative error per entry (one batch of 2 through the server); above ``tolerance`` the run is marked failed
        at the end, but the check goes on."""
        import tritonclient.grpc as grpcclient

        from serving_bench.export.parity import relative_error
        from serving_bench.export.repository import NUMPY_TO_TRITON
        from tritonclient.grpc import model_config_pb2 as mc

        errors = {}
        client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
        try:
            for entry in entries:
                spec, inputs32, reference = self.reference(entry.rsplit("_", 1)[0])
                tensors = []
                for t in spec.inputs:
                    data = inputs32[t.name].astype(t.dtype)
                    tensor = grpcclient.InferInput(t.name, list(data.shape),
                                                   mc.DataType.Name(NUMPY_TO_TRITON[t.dtype])[len("TYPE_"):])
                    tensor.set_data_from_numpy(data)
                    tensors.append(tensor)
                with server.guard():
                    result = client.infer(entry, tensors)
                errors[entry] = max(relative_error(result.as_numpy(n), reference[n]) for n in spec.output_names)
        finally:
            client.close()
        return errors


def measure_open(server, rates: dict[str, float], plan: Plan, load: float, seed: int) -> dict:
    """One open-loop replay against ``server``: one-row requests at Poisson times of ``rates`` (req/s) for
    ``plan.replay_s`` (the schedule the simulator replays too), per model throughput, p50/p99 (ms, from the intended
    time) and counts."""
    from serving_bench.load.driver import TritonTarget
    from serving_bench.run.metrics import summarize
    from serving_bench.sim.interference import open_schedule

    rates = {m: round(r, 3) for m, r in rates.items()}  # as saved: predict() draws the same schedule from them
    start = time.perf_counter()
    records = TritonTarget(server).run(open_schedule(rates, plan.replay_s, seed))
    summary = summarize(records)
    run = {"label": f"open loop at {load:g} of the pair's rates", "instances": 1, "cuda_graphs": False,
           "rates": rates, "replay_s": plan.replay_s, "seed": seed,
           "partial": summary["partial"], "stop_reason": records.info.stop_reason, "models": {},
           "gpu": {}, "wall_s": round(time.perf_counter() - start, 2)}
    for name in rates:
        run["models"][name] = model_figures(summary["models"][name])
    say(run)
    return run


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def server_log_tail(err: BaseException, lines: int = 30) -> list[str]:
    """The last lines of the server log a :class:`ServerError` names (kept after a failure), else []."""
    log = getattr(err, "log_path", None)
    if log is None or not Path(log).is_file():
        return []
    return Path(log).read_text(errors="replace").splitlines()[-lines:]


def run_checks(plan: Plan, repo: Path, budget_s: float, started: float, url: str | None,
               saved: Callable[[dict], None] = lambda state: None) -> dict:
    """Run the plan's steps into ``state`` (``runs``, ``skipped``, ``failed``, ``profile``); ``saved(state)`` is
    called after each run, so a check cut short keeps its figures. A step that raises is recorded in ``failed``
    (its error and the server log's tail) and the next step runs."""
    from serving_bench.serve.server import connect

    swept, partner = [f"{m}_torchscript" for m in plan.pair]
    state: dict = {"runs": [], "skipped": [], "failed": [], "profile": None}
    parity = ServedParity(plan)

    def record(run: dict) -> None:
        state["runs"].append(run)
        saved(state)

    def step(name: str, body: Callable[[], None], estimate_s: float | None = None) -> None:
        left = budget_s - (time.perf_counter() - started)
        if left < (plan.step_estimate_s if estimate_s is None else estimate_s):
            state["skipped"].append({"step": name, "reason": f"time budget: {left:.0f} s left of {budget_s:.0f} s"})
            print(f"  skipped {name}: time budget", flush=True)
            return
        try:
            body()
        except Exception as err:  # noqa: BLE001 - recorded, and the check goes on with the next step
            state["failed"].append({"step": name, "error": f"{type(err).__name__}: {err}",
                                    "server_log_tail": server_log_tail(err)})
            print(f"  FAILED {name}: {type(err).__name__}: {err}", flush=True)
        saved(state)

    def server(models, instances, cuda_graphs=None, entries=None):
        return connect(entries or repo, url=url, models=models, instances=instances, cuda_graphs=cuda_graphs)

    def pair() -> None:  # both models, one instance each: each alone, the pair, then open-loop replays of the pair
        with server([swept, partner], {swept: 1, partner: 1}) as srv:
            errors = parity.check(srv, [swept, partner])
            print(f"  served outputs vs torch: {errors}", flush=True)
            record(measure(srv, [swept], {swept: 2}, plan, f"{swept} x1", instances=1, cuda_graphs=False,
                           parity_error=errors[swept]))
            record(measure(srv, [partner], {partner: 2}, plan, f"{partner} x1", instances=1, cuda_graphs=False,
                           parity_error=errors[partner]))
            both = measure(srv, [swept, partner], {swept: 2, partner: 2}, plan, f"pair {swept} + {partner}",
                           instances=1, cuda_graphs=False)
            record(both)
            for i, load in enumerate(plan.loads):
                rates = {m: load * both["models"][m]["throughput_rps"] for m in (swept, partner)}
                record(measure_open(srv, rates, plan, load, seed=i))

    def profile() -> None:
        from serving_bench.calibrate.measure import measure_profile
        from serving_bench.calibrate.plan import MeasureConfig

        measured = measure_profile(repo, [swept, partner], config=MeasureConfig(
            seconds=plan.profile_seconds, rounds=1, calibrate=plan.calibrate, pairs=False, idle_rounds=1),
                                   log=lambda line: print(f"  profile: {line}", flush=True))
        state["profile"] = measured.to_json()

    def sweep(n: int) -> None:
        with server([swept], {swept: n}) as srv:
            record(measure(srv, [swept], {swept: 2 * n}, plan, f"{swept} x{n}", instances=n, cuda_graphs=False,
                           parity_error=parity.check(srv, [swept])[swept]))

    def graphs(n: int) -> None:
        with server([swept], {swept: n}, cuda_graphs="1") as srv:
            record(measure(srv, [swept], {swept: 2 * n}, plan, f"{swept} x{n} cuda graphs", instances=n,
                           cuda_graphs=True, parity_error=parity.check(srv, [swept])[swept]))

    def tensorrt() -> None:
        from serving_bench.export.api import export_models
        from serving_bench.export.frameworks import ExportOptions

        trt_repo = repo.parent / "tensorrt"
        [exported] = export_models([plan.pair[0]], ["tensorrt"], trt_repo,
                                   options=ExportOptions(max_batch_size=plan.max_batch_size, precision=plan.precision),
                                   log=lambda line: print(f"  {line}", flush=True))
        if exported["status"] != "exported":
            state["skipped"].append({"step": "tensorrt", "reason": exported.get("reason", exported["status"])})
            print(f"  skipped tensorrt: {exported.get('reason')}", flush=True)
            return
        entry = exported["name"]
        with server([entry], {entry: 1}, entries=trt_repo) as srv:
            record(measure(srv, [entry], {entry: 2}, plan, f"{entry} x1", instances=1, cuda_graphs=False,
                           parity_error=parity.check(srv, [entry])[entry]))

    step("pair", pair, plan.step_estimate_s * 1.5)
    if url:  # an external server's instance counts are its own: nothing more to vary
        return state
    step("profile", profile, plan.profile_estimate_s)
    for n in plan.sweep[1:]:
        step(f"{swept} x{n}", lambda n=n: sweep(n))
    for n in plan.graphs_at:
        step(f"{swept} x{n} cuda graphs", lambda n=n: graphs(n))
    if plan.mode == "gpu":
        from serving_bench.export.tensorrt import unavailable_reason

        why_not = unavailable_reason()
        if why_not is None:
            step("tensorrt", tensorrt)
        else:
            state["skipped"].append({"step": "tensorrt", "reason": why_not})
            print(f"  skipped tensorrt: {why_not}", flush=True)
    return state


FITTED_ON = 4  # the sweep's law is fitted on N <= this and predicts the larger N (held out)
FITTED_FORM = "pool_eff"
METRICS = ("throughput_rps", "p50_ms", "p99_ms")


def solo_runs(result: dict, cuda_graphs: bool = False) -> dict[str, dict]:
    """Per model its run alone on one instance (closed loop; served with CUDA graphs or not)."""
    return {next(iter(r["models"])): r for r in result["runs"] if r["instances"] == 1 and len(r["models"]) == 1
            and bool(r.get("cuda_graphs")) == cuda_graphs and "rates" not in r
            and next(iter(r["models"])) in result["serving"]}


def x1_profile(result: dict, device: str, cuda_graphs: bool = False):
    """Where the check's profile step did not run (and for the runs with CUDA graphs, which it does not measure):
    each model's batch-1 service alone as its x1 run's mean Triton compute time (a constant), and on a GPU its demand
    as that run's mean GPU utilisation (NVML's share of time a kernel ran: its instance is never idle with two
    requests in flight), on the check's device; no host CPU, no ways in and out modelled. ``cuda_graphs``: from the
    x1 runs with CUDA graphs."""
    from serving_bench.profiles.distributions import Dist
    from serving_bench.profiles.entries import ModelOnDevice, ModelProfile
    from serving_bench.profiles.schema import DeviceInfo, Profile

    def on_device(run: dict, m: str) -> ModelOnDevice:
        util = (run.get("gpu") or {}).get("util_mean_pct")
        return ModelOnDevice("eager", {1: Dist.constant(run["models"][m]["server_compute_ms"] / 1e3)},
                             demand={1: util / 100} if util and device != "cpu" else {})

    models = {m: ModelProfile(m, "pytorch_libtorch", result["plan"]["precision"], {device: on_device(r, m)})
              for m, r in solo_runs(result, cuda_graphs).items()}
    kind = "cpu" if device == "cpu" else "gpu"
    return Profile({device: DeviceInfo(device, kind, cores=result["machine"]["cores"] if kind == "cpu" else None)},
                   models, source="the x1 runs' mean Triton compute time" + (
                       " with CUDA graphs" if cuda_graphs else " (the check's profile step did not run)"))


def predict(result: dict) -> dict:
    """The simulator's prediction of every run of ``result`` (not the TensorRT runs) from the check's own profile —
    or, where its profile step did not run, from :func:`x1_profile`; the CUDA-graph runs from the x1 run with CUDA
    graphs (:func:`x1_profile`: the profile step does not measure them) — per run and model the simulated
    throughput, p50 and p99 with each of these sharing laws of the device:

    * ``profile``: the profile's own, fitted to its calibration runs (the configurations with ``calibrate`` instances
      per model, and the pair, count as fitted); from the x1 runs, the device's default (on a GPU ``serial``, its
      kernels one at a time: :func:`serving_bench.sim.serial.serial_rates`), fitted to nothing: the solo demands
      alone;
    * ``pool``: processor sharing of the summed demand, fitted to nothing (where the profile's law is another);
    * ``pool_eff on N <= 4``: ``pool_eff`` fitted on the sweep's runs of 1, 2 and 4 instances (those count as fitted;
      the 8 instances, the pair and the replays are held out);
    * ``baseline``: no interference (law ``none``), fitted to nothing.

    Closed-loop latency is send to answer, open-loop latency from the intended time, as measured. Returns ``rows``
    (per row and law the simulated figures, and the laws fitted to the row), ``source`` (the profile's), ``laws``
    (in that order, each its name and parameters) and ``left_out`` (runs not simulated, with the reason)."""
    from serving_bench.profiles.law import Law
    from serving_bench.profiles.schema import Profile
    from serving_bench.sim.interference import Observation, fit, serving_from_json, simulated_figures, with_law

    serving = {m: serving_from_json(s) for m, s in result["serving"].items()}
    device = next(iter(serving.values())).instances[0][0]
    measured = result.get("profile")
    profile = Profile.from_json(measured, "the check's profile") if measured else x1_profile(result, device)
    graphs = x1_profile(result, device, cuda_graphs=True)

    def profile_of(run: dict):  # the profile its runs' serving has (CUDA graphs or not)
        return graphs if run.get("cuda_graphs") else profile
    calibrate = result["plan"]["calibrate"]
    swept = f"{result['plan']['pair'][0]}_torchscript"

    def observation(run: dict) -> Observation:  # batches capped at the largest profiled size (one-row requests)
        models = profile_of(run).models
        served = {m: serving[m].replace(instances=((device, run["instances"]),), max_batch_size=min(
            serving[m].max_batch_size, max(models[m].devices[device].batch_sizes))) for m in run["models"]}
        rates = {m: v["throughput_rps"] for m, v in run["models"].items()}
        if "rates" in run:
            return Observation(device, served, {}, rates, rates=run["rates"], seconds=run["replay_s"],
                               seed=run["seed"])
        return Observation(device, served, run["concurrency"], rates)

    def figures(law: Law, run: dict, obs: Observation) -> dict[str, dict]:
        return simulated_figures(with_law(profile_of(run), device, law), obs)

    usable, left_out = [], []
    for run in result["runs"]:
        if any(m not in serving or m not in profile_of(run).models for m in run["models"]):
            left_out.append({"run": run["label"], "reason": "no profile of this entry (or of its CUDA graphs)"})
        elif not all(v["ok"] for v in run["models"].values()):
            left_out.append({"run": run["label"], "reason": "no request answered"})
        else:
            usable.append(run)
    sweep = [r for r in usable if "rates" not in r and list(r["models"]) == [swept] and not r.get("cuda_graphs")]
    trained = [r for r in sweep if r["instances"] <= FITTED_ON]
    laws: dict[str, tuple[Law, Callable[[dict], bool]]] = {}  # name -> (law, whether it was fitted to a run)
    own = profile.devices[device].sharing
    laws["profile"] = (own, lambda run: bool(measured) and calibrate > 1 and "rates" not in run and
                       (run["instances"] == calibrate or len(run["models"]) > 1))
    if own.name != "pool":
        laws["pool"] = (Law("pool"), lambda run: False)
    if len(trained) >= 2 and any(r["instances"] > FITTED_ON for r in sweep):
        fitted, _ = fit(profile, device, [observation(r) for r in trained], FITTED_FORM)
        laws[f"{FITTED_FORM} on N <= {FITTED_ON}"] = (fitted, lambda run: run in trained)
    laws["baseline"] = (Law("none"), lambda run: False)
    rows = []
    for run in usable:
        obs = observation(run)
        sims = {name: figures(law, run, obs) for name, (law, _) in laws.items()}
        for m, real in run["models"].items():
            rows.append({"run": run["label"], "model": m, "measured": {k: real[k] for k in METRICS},
                         "simulated": {name: sim[m] for name, sim in sims.items()},
                         "fitted": [name for name, (_, fitted_to) in laws.items() if fitted_to(run)]})
    source = profile.source + ("; " + graphs.source if graphs.models else "")
    return {"rows": rows, "source": source,
            "laws": [{"name": name, "law": law.to_json()} for name, (law, _) in laws.items()], "left_out": left_out}


def relative(simulated: float | None, measured: float | None) -> float | None:
    return None if simulated is None or not measured else (simulated - measured) / measured


def prediction_lines(prediction: dict) -> list[str]:
    """The prediction as a markdown table, then each law's worst error on the rows it was not fitted to, last."""
    rows = prediction["rows"]
    if not rows:
        return []
    names = [law["name"] for law in prediction["laws"]]

    def params(law: dict) -> str:
        return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in law.items())

    lines = ["", "## The simulator's prediction of these runs", "",
             f"Profile: {prediction['source']}. Laws: " + "; ".join(f"{law['name']} ({params(law['law'])})"
                                                                    for law in prediction["laws"]) + ".",
             "Errors in % of the measured figure, (simulated - measured) / measured: req/s, p50, p99; a law's cells "
             "are marked * on the runs it was fitted to.", "",
             "| run | model | measured req/s | p50 ms | p99 ms | " +
             " | ".join(f"{n}: req/s % | p50 % | p99 %" for n in names) + " |",
             "|---|---|---|---|---|" + "---|---|---|" * len(names)]

    def cells(r: dict, name: str) -> str:
        mark = "*" if name in r["fitted"] else ""
        return " | ".join("n/a" if e is None else f"{e * 100:+.1f}{mark}"
                          for e in (relative(r["simulated"][name][k], r["measured"][k]) for k in METRICS))

    for r in rows:
        m = r["measured"]
        lines.append(f"| {r['run']} | {r['model']} | {m['throughput_rps']:.1f} | {m['p50_ms']} | {m['p99_ms']} | " +
                     " | ".join(cells(r, n) for n in names) + " |")
    lines += [f"\nNot predicted: {left['run']} ({left['reason']})." for left in prediction["left_out"]]
    lines.append("")
    for name in names:
        errs = {k: [abs(e) for r in rows if name not in r["fitted"]
                    for e in [relative(r["simulated"][name][k], r["measured"][k])] if e is not None] for k in METRICS}
        if any(errs.values()):
            lines.append(f"worst error where not fitted, {name}: " + ", ".join(
                f"{k.split('_')[0]} {max(v) * 100:.1f} %" for k, v in errs.items() if v))
    return lines


def markdown(result: dict) -> str:
    facts = result["machine"]
    lines = [f"# GPU check, {result['date']}, {facts.get('gpu') or facts['cpu']} ({result['plan']['mode']} plan)", "",
             f"Command: `{result['command']}`. Closed loop at batch 1, {result['plan']['duration_s']} s per run after "
             f"{result['plan']['warmup_s']} s warm-up, 2 x instances requests in flight per model, dynamic batching "
             f"off. Latency from send to answer (client side). 'served vs torch': relative error of one served batch "
             f"against the fp32 torch module (the exporter's parity measure).", "",
             "| run | model | instances | CUDA graphs | req/s | p50 ms | p99 ms | server queue ms | server compute ms "
             "| GPU util mean % | GPU mem peak GB | served vs torch |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in result["runs"]:
        gpu = run.get("gpu") or {}
        util = "n/a" if gpu.get("util_mean_pct") is None else f"{gpu['util_mean_pct']:.0f}"
        mem = "n/a" if gpu.get("mem_used_peak_bytes") is None else f"{gpu['mem_used_peak_bytes'] / 1e9:.1f}"
        parity = "-" if run.get("parity_error") is None else f"{run['parity_error']:.1e}"
        for name, m in run["models"].items():
            lines.append(f"| {run['label']} | {name} | {run['instances']} | {'yes' if run['cuda_graphs'] else 'no'} "
                         f"| {m['throughput_rps']:.1f} | {m['p50_ms']} | {m['p99_ms']} | {m['server_queue_ms']} | "
                         f"{m['server_compute_ms']} | {util} | {mem} | {parity} |")
    if not result.get("complete", True):
        lines += ["", "INCOMPLETE: the check was cut short after the runs above."]
    if result["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{s['step']} ({s['reason']})" for s in result["skipped"])]
    for failed in result.get("failed", []):
        lines += ["", f"FAILED {failed['step']}: {failed['error']}"]
        if failed["server_log_tail"]:
            lines += ["", "```", *failed["server_log_tail"], "```"]
    if result.get("prediction"):
        lines += prediction_lines(result["prediction"])
    else:
        lines += ["", "Not yet predicted: `scripts/gpu_check.py --predict <this result's .json>` adds the "
                      "simulator's prediction of these runs."]
    if result["plan"]["mode"] == "cpu":
        lines += ["", "CPU plan: tiny models on KIND_CPU instances, a check that the script works end to end; these "
                      "figures say nothing about a GPU."]
    lines += ["", f"Machine: {json.dumps(facts, sort_keys=True)}", f"Total wall time: {result['elapsed_s']:.0f} s", ""]
    return "\n".join(lines)


def write_result(result: dict, out: Path, stem: str | None = None) -> list[Path]:
    """``<stem>.json`` and ``.md`` in ``out`` (default stem ``gpu_check_<date>_<machine>``), each replaced whole."""
    out.mkdir(parents=True, exist_ok=True)
    stem = stem or f"gpu_check_{result['date']}_{result['machine']['machine']}"
    paths = []
    for suffix, text in ((".json", json.dumps(result, indent=2, sort_keys=True) + "\n"), (".md", markdown(result))):
        path = out / f"{stem}{suffix}"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def add_prediction(path: Path) -> int:
    """``--predict``: add :func:`predict` to a saved result (``.json``) and write its ``.json`` and ``.md`` again."""
    result = json.loads(path.read_text())
    result["prediction"] = predict(result)
    for written in write_result(result, path.parent, path.stem):
        print(f"wrote {written}")
    print("\n".join(prediction_lines(result["prediction"])))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the reduced CPU plan (tiny models, KIND_CPU instances)")
    parser.add_argument("--quick", action="store_true", help="shorter runs (for tests)")
    parser.add_argument("--out", default="benchmarks/results", help="folder for the result files")
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop starting new steps after this (s)")
    parser.add_argument("--url", help="measure an external Triton (gRPC host:port) that serves the exported models")
    parser.add_argument("--repo", help="export into this folder (default: a temporary one)")
    parser.add_argument("--predict", metavar="RESULT.json", help="measure nothing: add the simulator's prediction to "
                                                                 "a saved result and write it again")
    args = parser.parse_args(argv)
    if args.predict:
        return add_prediction(Path(args.predict))
    started = time.perf_counter()

    import torch

    gpu = torch.cuda.is_available() and not args.cpu
    plan = PLANS["gpu" if gpu else "cpu"]
    if args.quick:
        plan = dataclasses.replace(plan, **QUICK)
    if not gpu and not args.cpu:
        print("no CUDA GPU visible to torch: running the reduced CPU plan (no GPU figures)", flush=True)
    facts = machine_facts(gpu)
    print(f"gpu_check: {plan.mode} plan on {facts.get('gpu') or facts['cpu']}", flush=True)
    command = " ".join(["scripts/gpu_check.sh", *(argv if argv is not None else sys.argv[1:])])
    serving: dict = {}

    def result_of(state: dict, complete: bool) -> dict:
        return {"date": datetime.date.today().isoformat(), "machine": facts, "plan": dataclasses.asdict(plan),
                "command": command, "url": args.url, "serving": serving, **state, "complete": complete,
                "elapsed_s": round(time.perf_counter() - started, 1)}

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        repo = Path(args.repo) if args.repo else Path(tmp) / "repo"
        print(f"export {', '.join(plan.pair)} ({plan.precision}, TorchScript) into {repo}", flush=True)
        serving.update(export_repo(plan, repo))
        state = run_checks(plan, repo, args.budget_s, started, args.url,
                           saved=lambda state: write_result(result_of(state, False), Path(args.out)))
    result = result_of(state, True)
    if not gpu:  # on a GPU host afterwards, elsewhere: see the module docstring
        result["prediction"] = predict(result)
        print("\n".join(prediction_lines(result["prediction"])))
    for path in write_result(result, Path(args.out)):
        print(f"wrote {path}")
    from serving_bench.export.parity import TOLERANCE

    runs = result["runs"]
    failed = [f"{r['label']}: {n}" for r in runs for n, m in r["models"].items() if m["failed"] or m["ok"] == 0]
    failed += [f"{r['label']}: served outputs differ from torch by {r['parity_error']:.3g} (tolerance "
               f"{TOLERANCE[plan.precision]:g})" for r in runs
               if r.get("parity_error") is not None and not r["parity_error"] <= TOLERANCE[plan.precision]]
    failed += [f"step {f['step']}: {f['error']}" for f in result["failed"]]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
