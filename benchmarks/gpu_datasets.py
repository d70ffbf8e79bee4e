"""The GPU datasets as ``benchmarks/gpu_fidelity.py`` reads them: per dataset the solo profiles (what one model alone
shows) and the cases to predict from them (co-located runs, more instances, open loops), in three formats:

* ``gpu_check`` (``benchmarks/results/gpu_check_<date>_<machine>.json``, ``scripts/gpu_check.py``): the solo profile
  of each mode is its x1 runs (:func:`gpu_check.x1_profile`: mean Triton compute time as a constant service, NVML's
  busy share as the GPU demand); the x1 runs are that profile (kept as cases marked ``in_profile``: their tails are
  the one-instance diagnostic, nothing else of them is held out);
* ``campaign`` (``benchmarks/results/gpu/<date>_<machine>/dataset.json`` + ``raw.npz``, ``scripts/gpu_campaign.py``):
  the Triton profile of each mode from the one-at-a-time solo runs through the profile's own estimators
  (:func:`serving_bench.calibrate.estimators.service_and_overhead`: per request its service — the runner's batch plus
  the hop —, way in and way out, as empirical distributions; the GPU demand is the run's busy share over the share of
  it the instance was executing), the threads profile of each mode from the one-thread runs per batch size (the
  latency distribution as service, the busy share as demand); every other run is a case;
* ``quoted`` (``benchmarks/results/gpu/quoted_*.json``): figures quoted where their raw data are not kept (issue 46's
  k threads of resnet50 with CUDA graphs on an H200): throughputs only, with the demand the file states as assumed.

A case is a :class:`Case`: its configuration as an :class:`~serving_bench.sim.interference.Observation` and the
measured throughput, p50 and p99 per entry.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_check import x1_profile  # noqa: E402
from serving_bench.calibrate.cold import cold_starts  # noqa: E402
from serving_bench.calibrate.estimators import demands, gpu_demand, service_and_overhead  # noqa: E402
from serving_bench.calibrate.runs import LoopRun, thin  # noqa: E402
from serving_bench.profiles.distributions import Dist  # noqa: E402
from serving_bench.profiles.entries import ModelOnDevice, ModelProfile  # noqa: E402
from serving_bench.profiles.schema import DeviceInfo, Profile  # noqa: E402
from serving_bench.serve.execution_log import Executions  # noqa: E402
from serving_bench.serving_config import ModelServing  # noqa: E402
from serving_bench.sim.interference import Observation, serving_from_json  # noqa: E402

CAMPAIGN_FORMAT = "serving-bench gpu campaign 1"
QUOTED_FORMAT = "serving-bench gpu quoted 1"
MODES = {"eager": "eager", "graphs": "cuda_graphs", "compiled": "compiled"}  # campaign mode -> profile's mode


@dataclass(frozen=True)
class Case:
    """One measured configuration to predict: ``kind`` ``triton`` (python-backend instances, a process each) or
    ``threads`` (one process, a stream per thread); ``group`` x1 / k / pair / together / ensemble / open; ``k`` the
    instances (threads) per entry; ``measured`` entry -> throughput_rps, p50_ms, p99_ms (None: not measured);
    ``in_profile``: the run the solo profile was made of (only its tail is a diagnostic)."""

    dataset: str
    kind: str
    mode: str
    label: str
    group: str
    k: int
    obs: Observation
    measured: dict
    in_profile: bool = False


@dataclass
class Dataset:
    """A dataset's name, machine and device, solo ``profiles`` by (kind, mode), ``cases`` and notes."""

    name: str
    machine: str
    device: str
    profiles: dict = field(default_factory=dict)
    cases: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def gpu(self) -> bool:
        return self.device != "cpu"


def load(path: Path) -> Dataset:
    """The dataset at ``path`` (a ``gpu_check`` JSON, a campaign folder or its ``dataset.json``, a quoted JSON)."""
    path = Path(path)
    if path.is_dir():
        path = path / "dataset.json"
    data = json.loads(path.read_text())
    if data.get("format") == CAMPAIGN_FORMAT:
        return campaign(path, data)
    if data.get("format") == QUOTED_FORMAT:
        return quoted(path, data)
    return gpu_check(path, data)


def _measured(figures: dict) -> dict:
    return {k: figures.get(k) for k in ("throughput_rps", "p50_ms", "p99_ms")}


def _group(run: dict) -> str:
    if "rates" in run:
        return "open"
    if len(run["models"]) == 2:
        return "pair"
    if len(run["models"]) > 2:
        return "together"
    k = max(run.get("instances", {}).values()) if isinstance(run.get("instances"), dict) else run["instances"]
    return "k" if k > 1 else "x1"


def gpu_check(path: Path, result: dict) -> Dataset:
    """A ``scripts/gpu_check.py`` result (module docstring)."""
    serving = {m: serving_from_json(s) for m, s in result["serving"].items()}
    device = next(iter(serving.values())).instances[0][0]
    ds = Dataset(path.stem, result["machine"]["machine"], device)
    for mode, graphs in (("eager", False), ("graphs", True)):
        profile = x1_profile(result, device, cuda_graphs=graphs)
        if profile.models:
            ds.profiles[("triton", mode)] = profile
    for run in result["runs"]:
        mode = "graphs" if run.get("cuda_graphs") else "eager"
        profile = ds.profiles.get(("triton", mode))
        if profile is None or any(m not in profile.models for m in run["models"]) or \
                not all(v["ok"] for v in run["models"].values()):
            ds.notes.append(f"{run['label']}: not predicted (no solo profile of its entries, or nothing answered)")
            continue
        largest = {m: max(profile.models[m].devices[device].batch_sizes) for m in run["models"]}
        served = {m: serving[m].replace(instances=((device, run["instances"]),),
                                        max_batch_size=min(serving[m].max_batch_size, largest[m]))
                  for m in run["models"]}
        rates = {m: v["throughput_rps"] for m, v in run["models"].items()}
        obs = Observation(device, served, {}, rates, rates=run["rates"], seconds=run["replay_s"], seed=run["seed"]) \
            if "rates" in run else Observation(device, served, run["concurrency"], rates)
        group = _group(run)
        ds.cases.append(Case(ds.name, "triton", mode, run["label"], group, run["instances"], obs,
                             {m: _measured(v) for m, v in run["models"].items()}, in_profile=group == "x1"))
    return ds


def quoted(path: Path, data: dict) -> Dataset:
    """Quoted figures (module docstring): one entry's closed loop at k threads, throughput only, solo profile its
    k = 1 rate as a constant service at the demand the file states."""
    device, entry = "gpu0", data["entry"]
    ds = Dataset(path.stem, data["machine"], device, notes=[data["source"], data["assumption"]])
    rates = {int(k): float(v) for k, v in data["throughput_rps"].items()}
    mod = ModelOnDevice(MODES[data["mode"]], {1: Dist.constant(1.0 / rates[1])}, demand={1: data["demand"]})
    ds.profiles[(data["kind"], data["mode"])] = Profile(
        {device: DeviceInfo(device, "gpu")}, {entry: ModelProfile(entry, "pytorch_libtorch", "fp16", {device: mod})},
        source=f"{path.name}: the k = 1 rate as a constant service")
    for k, rate in sorted(rates.items()):
        served = {entry: ModelServing(entry, 1, instances=((device, k),))}
        ds.cases.append(Case(ds.name, data["kind"], data["mode"], f"{entry} x{k} threads ({data['mode']})",
                             "k" if k > 1 else "x1", k, Observation(device, served, {entry: k}, {entry: rate}),
                             {entry: {"throughput_rps": rate, "p50_ms": None, "p99_ms": None}}, in_profile=k == 1))
    return ds


class Raw:
    """A campaign's ``raw.npz``: run ``index``'s arrays by entry and name (absent: empty)."""

    def __init__(self, path: Path):
        self.data = np.load(path, allow_pickle=False) if path.is_file() else {}

    def get(self, index: int, entry: str, name: str) -> np.ndarray:
        """One array, floats as float64 (saved as float32 seconds from the run's start)."""
        key = f"r{index}/{entry}/{name}"
        if name == "intended_s" and key not in self.data:  # a closed loop's intended time is its send
            key = f"r{index}/{entry}/sent_s"
        values = self.data[key] if key in self.data else np.zeros(0)
        return values.astype(np.float64) if values.dtype.kind == "f" else values.astype(np.int32)

    def executions(self, index: int, t0: float) -> dict[str, Executions]:
        out = {}
        for key in self.data:
            parts = key.split("/")
            if parts[0] == f"r{index}" and parts[-1] == "x_start_s":
                m, get = parts[1], (lambda name, m=parts[1]: self.get(index, m, name))
                out[m] = Executions(get("x_start_s") + t0, get("x_end_s") + t0, get("x_cpu_s"), get("x_rows"),
                                    get("x_requests"), get("x_instance"))
        return out

    def loop_run(self, run: dict) -> LoopRun:
        """A Triton run as the profile's estimators see it (send and answer times on the runners' clock)."""
        t0, index = run["t0_s"], run["index"]
        latency, sent, done = {}, {}, {}
        for m in run["rows"]:
            intended, s, d = (self.get(index, m, n) for n in ("intended_s", "sent_s", "done_s"))
            latency[m], sent[m], done[m] = d - intended, s + t0, d + t0
        window = (t0, t0 + run["warmup_s"] + run["window_s"])
        return LoopRun(latency, run.get("server_stats") or {}, window, sent, done, self.executions(index, t0))


def campaign(path: Path, data: dict) -> Dataset:
    """A campaign folder (module docstring)."""
    device = "gpu0" if data["plan"]["mode"] == "gpu" else "cpu"
    ds = Dataset(path.parent.name, data["machine"]["machine"], device)
    raw = Raw(path.parent / "raw.npz")
    attach_thread_latencies(data, raw)
    runs = data["runs"]
    for mode in sorted({r["mode"] for r in runs}):
        solo = [r for r in runs if r["mode"] == mode and r["kind"] == "triton" and r.get("role") == "profile"]
        cold = {next(iter(r["rows"])): r for r in runs if r["mode"] == mode and r.get("role") == "cold"}
        triton = triton_profile(data, solo, cold, raw, mode, device)
        if triton.models:
            ds.profiles[("triton", mode)] = triton
        threads = threads_profile(data, [r for r in runs if r["mode"] == mode and r["kind"] == "threads" and
                                         len(r["threads"]) == 1 and sum(r["threads"].values()) == 1], mode, device)
        if threads.models:
            ds.profiles[("threads", mode)] = threads
    serving = {m: serving_from_json(s) for m, s in data["serving"]["models"].items()}
    ensembles = {e: tuple(m) for e, m in data["serving"]["ensembles"].items()}
    deps = {e: tuple(tuple(d) for d in steps) for e, steps in data["serving"]["ensemble_deps"].items()}
    for run in runs:
        if run["kind"] == "triton" and run.get("role") == "case":
            case = triton_case(ds, run, serving, ensembles, deps)
        elif run["kind"] == "threads" and not (len(run["threads"]) == 1 and sum(run["threads"].values()) == 1):
            case = threads_case(ds, run)
        else:
            continue
        if case is not None:
            ds.cases.append(case)
    return ds


def triton_profile(data: dict, solo: list[dict], cold: dict, raw: Raw, mode: str, device: str) -> Profile:
    """The Triton solo profile of one mode: per entry and batch size the estimators' service, way in and way out
    (module docstring); the GPU demand from the run's busy share; the cold starts from the entry's ``cold`` run
    against its back-to-back one (``calibrate.cold.cold_starts``)."""
    kind = "cpu" if device == "cpu" else "gpu"
    per_entry: dict[str, dict] = {}
    combiners: dict[str, ModelOnDevice] = {}
    for run in solo:
        (m, rows), = run["rows"].items()
        loop = raw.loop_run(run)
        for name, batches in (loop.executions or {}).items():  # an ensemble's combiner: a python model on the host
            if name.endswith("_combiner") and len(batches):
                combiners[name] = ModelOnDevice("n/a", {1: thin(batches.duration_s)},
                                                demand={1: float(np.mean(batches.demand))})
        if m not in (loop.executions or {}):
            continue
        service, back, dispatch = service_and_overhead(loop, m, 0.0)  # as calibrate.figures takes them
        figures = per_entry.setdefault(m, {"batches": {}, "demand": {}, "hop_s": 0.0})
        figures["batches"][rows] = thin(service)
        runner, hop, _ = demands(loop, m)
        busy = (run.get("gpu") or {}).get("busy_pct")
        demand = runner if kind == "cpu" else None if busy is None else \
            gpu_demand(busy / 100.0, loop, m, loop.window[1] - loop.window[0])
        if demand is not None:
            figures["demand"][rows] = demand
        if rows == 1 and back is not None and dispatch is not None:
            figures["overhead"], figures["dispatch"] = thin(np.clip(back, 0.0, None)), thin(dispatch)
            figures["hop_s"] = hop
            if m in cold:
                figures["idle"] = cold_starts({(m, "solo", 1): loop, (m, "cold", 0): raw.loop_run(cold[m])}, m, 0.0)
    padded = tuple(sorted(data["plan"]["triton_sizes"])) if mode == "graphs" else ()
    models = {m: ModelProfile(m, "pytorch_libtorch", data["plan"]["precision"], {device: ModelOnDevice(
        MODES[mode], f["batches"], demand=f["demand"], idle=f.get("idle"), hop_s=f["hop_s"] if kind == "cpu" else 0.0,
        padded_sizes=padded if set(padded) <= set(f["batches"]) else ())}, f.get("overhead"), f.get("dispatch"))
        for m, f in per_entry.items()}
    models.update({name: ModelProfile(name, "python", "fp32", {"cpu": mod}) for name, mod in combiners.items()})
    cores = data["machine"]["cores"]
    devices = {device: DeviceInfo(device, kind, cores=cores if kind == "cpu" else None)}
    if combiners:
        devices["cpu"] = DeviceInfo("cpu", "cpu", cores=cores)
    return Profile(devices, models, source=f"the campaign's one-at-a-time runs ({mode})")


def threads_profile(data: dict, solo: list[dict], mode: str, device: str) -> Profile:
    """The threads solo profile of one mode: the one-thread runs' latency as service per batch size, their busy share
    as demand (a thread is always in its call)."""
    kind = "cpu" if device == "cpu" else "gpu"
    batches: dict[str, dict] = {}
    demand: dict[str, dict] = {}
    for run in solo:
        (m, _), = run["threads"].items()
        samples = run.get("_latency_ms")
        if samples is None or not len(samples):
            continue
        batches.setdefault(m, {})[run["batch"]] = thin(np.asarray(samples, float) / 1e3)
        busy = (run.get("gpu") or {}).get("busy_pct")
        if kind == "gpu" and busy is not None:
            demand.setdefault(m, {})[run["batch"]] = min(busy / 100.0, 1.0)
    models = {m: ModelProfile(m, "pytorch_libtorch", data["plan"]["precision"], {device: ModelOnDevice(
        MODES[mode], b, demand=demand.get(m, {}))}) for m, b in batches.items()}
    cores = data["machine"]["cores"]
    return Profile({device: DeviceInfo(device, kind, cores=cores if kind == "cpu" else None)}, models,
                   source=f"the campaign's one-thread runs ({mode})")


def triton_case(ds: Dataset, run: dict, serving: dict, ensembles: dict, deps: dict) -> Case | None:
    profile = ds.profiles.get(("triton", run["mode"]))
    members = [m for e in run["models"] for m in ensembles.get(e, (e,))]
    if profile is None or any(m not in profile.models for m in members if not m.endswith("_combiner")):
        ds.notes.append(f"{run['label']}: not predicted (no solo profile of an entry)")
        return None
    if any(m.endswith("_combiner") and m not in profile.models for m in members):
        ds.notes.append(f"{run['label']}: not predicted (the ensemble's combiner has no solo profile)")
        return None
    k = max(run["instances"].values())
    used = {m for e in run["models"] for m in ensembles.get(e, (e,))} - set(ensembles)
    served = {m: _served(serving[m], profile, k if m in run["models"] else 1) for m in used}
    rates = {m: v["throughput_rps"] for m, v in run["models"].items()}
    used_ens = {e: ensembles[e] for e in run["models"] if e in ensembles}
    used_deps = {e: deps[e] for e in used_ens if e in deps}
    obs = Observation(ds.device, served, {}, rates, rates=run["rates"], seconds=run["seconds"], seed=run["seed"],
                      ensembles=used_ens, ensemble_deps=used_deps) if "rates" in run else \
        Observation(ds.device, served, run["clients"], rates, ensembles=used_ens, ensemble_deps=used_deps)
    group = "ensemble" if used_ens else _group(run)
    return Case(ds.name, "triton", run["mode"], run["label"], group, k, obs,
                {m: _measured(v) for m, v in run["models"].items()})


def _served(serving: ModelServing, profile: Profile, k: int) -> ModelServing:
    """An entry served at ``k`` instances on its own device, its batches capped at the largest profiled size."""
    device = serving.instances[0][0]
    largest = max(profile.models[serving.name].devices[device].batch_sizes)
    return serving.replace(instances=((device, k),), max_batch_size=min(serving.max_batch_size, largest))


def threads_case(ds: Dataset, run: dict) -> Case | None:
    profile = ds.profiles.get(("threads", run["mode"]))
    if profile is None or any(m not in profile.models for m in run["threads"]) or run["batch"] != 1:
        ds.notes.append(f"{run['label']}: not predicted (no one-thread run of an entry at its batch size)")
        return None
    k = max(run["threads"].values())
    served = {m: ModelServing(m, 1, instances=((ds.device, n),)) for m, n in run["threads"].items()}
    obs = Observation(ds.device, served, dict(run["threads"]),
                      {m: v["throughput_rps"] for m, v in run["models"].items()})
    group = "pair" if len(run["threads"]) == 2 else ("k" if k > 1 else "x1")
    return Case(ds.name, "threads", run["mode"], run["label"], group, k, obs,
                {m: _measured(v) for m, v in run["models"].items()})


def attach_thread_latencies(data: dict, raw: Raw) -> None:
    """Give each thread run its raw latencies (``_latency_ms``, the one entry's) for :func:`threads_profile`."""
    for run in data["runs"]:
        if run["kind"] == "threads" and len(run["threads"]) == 1:
            (m, _), = run["threads"].items()
            key = f"r{run['index']}/{m}"
            run["_latency_ms"] = raw.data[key] if key in raw.data else None
