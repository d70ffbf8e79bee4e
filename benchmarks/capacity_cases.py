"""What ``capacity_fidelity.py`` measures and predicts: the configurations (:data:`CASES`), each one's load at scale 1
and SLO bounds from the frozen profile, and the probe of each target that ``bisect_capacity`` calls.

A configuration serves some entries of the exported repository (settings other than the export's where it says) and
sends Poisson load to some of them (an ensemble by its name). At scale 1 every entry it sends to gets
``1 / len(entries)`` of the rate one client would send it alone (one over its solo latency): one client's worth of
load, shared. The grid's configurations all carry the same load (tiny_cnn's), so their capacities order the choice
a user makes. Each entry's SLO is a p99 bound of :data:`SLO_FACTOR` times its solo latency, measured on Triton once
the profile is frozen (:func:`solo_latency`: the median of one client's closed loop; a user's statement of what the
model costs, not the simulator's), and at least :data:`SLO_FLOOR_S` (the demo's bound for its tiny models): every
configuration meets it at low load, also through the 2-core host's stalls of tens of milliseconds (a tenth of the
tiny models' 1 ms alone is not), and well below saturation none does, so the capacity is where the queues build.

Every instance runs one runtime thread (:data:`THREADS`; ``serve``/``tune --threads-per-instance 1``), and the
profile is measured at one: what ``serving-bench profile`` does for these entries on a 2-core host (the cores over
the instances it measures). A lone instance at the server's default (two threads here) would ask the simulator for
a table the profile does not have, and the calibration measured at two threads per instance oversubscribes the
cores twelvefold (TorchScript's threads then wait on each other: 50 req/s for tiny_cnn).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np
import psutil
import yaml

from serving_bench.calibrate.session import Session
from serving_bench.errors import ServerError
from serving_bench.load.uncancelled import replay_or_cut
from serving_bench.profiles.schema import Profile
from serving_bench.run.metrics import summarize
from serving_bench.serve.control import Control
from serving_bench.serve.server import TritonServer
from serving_bench.serving_config import ServingConfig
from serving_bench.sim.interference import Observation
from serving_bench.sim.target import SimTarget
from serving_bench.tune.capacity import Probe
from serving_bench.tune.load import Load, load_from_file
from serving_bench.tune.objective import ObjectiveConfig, check_slos
from serving_bench.tune.verify import copy_repo

GRID_ENTRY = "tiny_cnn_onnxruntime"
ENSEMBLE = "tiny_ensemble"  # tiny_cnn on ONNX Runtime and TorchScript, their outputs combined
SLO_FACTOR = 10.0  # each entry's p99 bound: this many times its solo latency ...
SLO_FLOOR_S = 0.05  # ... and at least this (the demo's SLO of its tiny models; over the host's stalls)
SEED = 44
WARMUP_S = 0.5  # each replay's first half second is not judged (the load profile's warmup)
WARM_S = 1.5  # a new server first gets this much of the load at scale 1, not judged
MAX_FAILED = ObjectiveConfig().max_failed_fraction  # tune's: a model whose failed share exceeds it misses its SLO
MAX_RESTARTS = 2  # a server that dies during a case is started again at most this often
LATE_S = 1e-3  # a request that left more than this after its intended time was sent late
LATE_SHARE = 0.01  # a replay with more of its requests sent late measured the sender, not only the server
THREADS = 1  # every instance's runtime threads, in the profile and every configuration (module doc)


@dataclass(frozen=True)
class Case:
    """One configuration: ``entries`` the load sends to (an ensemble by its name); ``serving``: ``(entry, instances,
    max_batch_size, queue_delay_ms)`` where it is not served as exported (one instance each, as exported);
    ``held_out``: why no run of the profile is this configuration ("" where one is); ``quick``: in ``--quick`` too;
    ``smoke``: in ``--smoke``."""

    name: str
    group: str
    entries: tuple[str, ...]
    serving: tuple[tuple[str, int, int, float], ...] = ()
    held_out: str = ""
    quick: bool = False
    smoke: bool = False


def grid(instances: int, max_batch: int, delay_ms: float, held_out: str = "", quick: bool = False,
         smoke: bool = False) -> Case:
    """A configuration of the single-entry grid: tiny_cnn on ONNX Runtime."""
    return Case(f"tiny_cnn {instances}x mb{max_batch} d{delay_ms:g}", "grid", (GRID_ENTRY,),
                ((GRID_ENTRY, instances, max_batch, delay_ms),), held_out, quick, smoke)


NO_DELAY = "no run of the profile had a queue delay"
FOUR = "no run of the profile had 4 instances"
SMALL = ("tiny_cnn_onnxruntime", "tiny_cnn_torchscript", "tiny_mlp_torchscript", "sleep_python")
CASES = (
    grid(1, 1, 0, quick=True, smoke=True),
    grid(1, 32, 0),
    grid(2, 1, 0),
    grid(2, 8, 2, NO_DELAY, smoke=True),
    grid(4, 1, 0, FOUR, quick=True),
    grid(4, 32, 2, f"{FOUR} nor a queue delay"),
    grid(1, 32, 2, NO_DELAY, quick=True),
    Case("small four", "mix", SMALL, quick=True),
    Case("all five", "mix", (*SMALL, "resnet50_onnxruntime")),
    Case("ort+ts+python", "mix", ("tiny_cnn_onnxruntime", "tiny_mlp_torchscript", "sleep_python"),
         held_out="no run of the profile sent to these three together", quick=True),
    Case("ts+python", "mix", ("tiny_cnn_torchscript", "sleep_python"),
         held_out="no run of the profile sent to this pair"),
    Case("ensemble", "ensemble", (ENSEMBLE,)),
    Case("resnet50", "resnet50", ("resnet50_onnxruntime",)),
)


def profile_runs(profile: Profile) -> set[frozenset[str]]:
    """The sets of entries the profile's calibration runs sent requests to together."""
    return {frozenset(Observation.from_json(o).streams) for o in profile.calibration}


def check_held_out(cases: tuple[Case, ...], profile: Profile) -> None:
    """Raise if a mix said held out is the set of entries one of the profile's runs sent to (its law was fitted to
    that run): the cases, not the measurement, would be wrong."""
    runs = profile_runs(profile)
    for case in cases:
        if case.held_out and case.group == "mix" and frozenset(case.entries) in runs:
            raise RuntimeError(f"{case.name} is said held out, but the profile's calibration ran its entries together")


def chosen(mode: str) -> tuple[Case, ...]:
    """The cases of ``mode`` (``full``, ``quick`` or ``smoke``)."""
    return tuple(c for c in CASES if mode == "full" or getattr(c, mode))


def profiled_entries(cases: tuple[Case, ...]) -> list[str]:
    """Every entry the cases send to (an ensemble by its name: the profile measures its members and it alone)."""
    return list(dict.fromkeys(e for c in cases for e in c.entries))


def serving_config(case: Case, exported: ServingConfig) -> ServingConfig:
    """``exported`` (the repository's settings of everything the cases serve) cut to what ``case`` serves, with its
    own settings applied."""
    wanted = set(case.entries) | {m for e, members in exported.ensembles if e in case.entries for m in members}
    models = []
    for model in exported.models:
        if model.name not in wanted:
            continue
        for name, instances, max_batch, delay_ms in case.serving:
            if name == model.name:
                model = model.replace(instances=(("cpu", instances),), max_batch_size=max_batch,
                                      dynamic_batching=True, max_queue_delay_us=int(round(delay_ms * 1e3)),
                                      preferred_batch_sizes=())
        models.append(model)
    ensembles = tuple((e, m) for e, m in exported.ensembles if e in case.entries)
    deps = tuple((e, d) for e, d in exported.ensemble_deps if e in case.entries)
    return ServingConfig(tuple(models), ensembles, deps, threads_per_instance=THREADS)


def solo_latency(repo: Path, entries: list[str], seconds: float) -> dict[str, float]:
    """Each entry's median latency (s) alone on Triton: one client in a closed loop for ``seconds``, the entries as
    exported (one instance each, :data:`THREADS` threads), one after the other on one server."""
    with TritonServer(repo, models=entries, threads_per_instance=THREADS) as server:
        session = Session(server.endpoints, server)
        return {e: float(np.median(session.run({e: (1, 1)}, seconds).latency[e])) for e in entries}


def load_spec(case: Case, solo_s: Mapping[str, float], seconds: tuple[float, float, int]) -> dict:
    """The case's load profile (a mapping, as its YAML): each entry's Poisson rate at scale 1 and its p99 bound
    (module doc). ``seconds``: (shortest, longest replay, requests the sparsest entry should get at scale 1)."""
    shortest, longest, requests = seconds
    rates = {e: 1.0 / (len(case.entries) * solo_s[e]) for e in case.entries}
    duration = min(max(shortest, requests / min(rates.values()) + WARMUP_S), longest)
    return {"name": case.name.replace(" ", "_"), "duration": float(duration), "seed": SEED, "warmup": WARMUP_S,
            "models": {e: {"rate": float(r), "slo": {"p99": float(max(SLO_FACTOR * solo_s[e], SLO_FLOOR_S))}}
                       for e, r in rates.items()}}


def case_load(spec: dict, folder: Path) -> Load:
    """The case's :class:`Load` from its load profile written to ``folder``, grown by tune's default rule
    (superpose: more independent users; for Poisson load the same as the other rule)."""
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_from_file(path, growth="superpose")


def slos_of(spec: dict) -> dict[str, dict[str, float]]:
    """The case's SLOs (seconds), as ``summarize`` and ``check_slos`` take them."""
    return {e: dict(m["slo"]) for e, m in spec["models"].items()}


def judged(summary: dict, slos: Mapping) -> Probe:
    """One scale's verdict (tune's: ``check_slos``) with the figures kept: per entry p99 (s), throughput (req/s) and
    failed requests."""
    met, violation = check_slos(summary, slos, MAX_FAILED)
    detail = {m: {"p99_s": s["p99_s"], "throughput_rps": s["throughput_rps"],
                  "failed": s["counts"]["failed"] + s["counts"]["timeout"]}
              for m, s in summary["models"].items() if m in slos}
    return Probe(0.0, met, violation, {"models": detail})


def sim_probe(profile: Profile, config: ServingConfig, load: Load, slos: Mapping):
    """The simulator's probe: ``load.at(scale)`` simulated with seed ``attempt`` (a repeat is another draw)."""
    def probe(scale: float, attempt: int) -> Probe:
        records = SimTarget(profile, config, seed=attempt).run(load.at(scale))
        return dataclasses.replace(judged(summarize(records, slos=slos), slos), scale=scale)
    return probe


def saved_probe(probes: list[dict]):
    """A probe that answers from a measurement's saved probes (``scale``, ``attempt``, ``ok``, ``violation``,
    ``detail``): the bisection of saved data runs again exactly as it ran on the server."""
    table = {(round(p["scale"], 9), p["attempt"]): p for p in probes}

    def probe(scale: float, attempt: int) -> Probe:
        p = table[(round(scale, 9), attempt)]
        return Probe(scale, p["ok"], math.inf if p["violation"] is None else p["violation"], p["detail"])
    return probe


def idle(url: str, models: list[str], interval_s: float, limit_s: float = 60.0) -> float:
    """Wait until Triton has executed nothing more for ``interval_s`` (what a replay left queued is done: its
    timed-out requests too); returns the seconds waited."""
    start = time.perf_counter()
    with Control(url) as control:
        last = None
        while time.perf_counter() - start < limit_s:
            now = {m: s["execution_count"] for m, s in control.statistics(models).items()}
            if now == last:
                break
            last = now
            time.sleep(interval_s)
    return time.perf_counter() - start


@dataclass
class RealTarget:
    """The case served by the embedded Triton (a copy of the repository with its settings), replayed open loop by
    the project's ``TritonTarget``; ``probes`` keeps every probe (JSON) in the order run, ``notes`` the restarts."""

    repo: Path
    config: ServingConfig
    load: Load
    slos: Mapping
    settle_s: float
    cut_s: float
    probes: list = dataclasses.field(default_factory=list, init=False)
    notes: list = dataclasses.field(default_factory=list, init=False)
    server: TritonServer | None = dataclasses.field(default=None, init=False)

    @property
    def served(self) -> list[str]:
        return [m.name for m in self.config.models] + [e for e, _ in self.config.ensembles]

    def start(self) -> None:
        """A new server, warmed by the first :data:`WARM_S` seconds of the load at scale 1 (not judged: first
        inferences run cold)."""
        self.server = TritonServer(self.repo, models=self.served,
                                   threads_per_instance=self.config.threads_per_instance or None).__enter__()
        whole = self.load.at(1.0)
        replay_or_cut(self.server, whole.select(whole.arrival_s < WARM_S), self.cut_s)
        idle(self.server.endpoints.grpc_url, self.served, self.settle_s)

    def stop(self) -> None:
        if self.server is not None:
            self.server.__exit__(None, None, None)
            self.server = None

    def probe(self, scale: float, attempt: int) -> Probe:
        """Replay ``load.at(scale)`` (``replay_or_cut``), judge it, wait for the server to go idle. A replay that was
        cut is judged as it is (its unanswered requests failed) and the next one runs on a new server; one cut short by
        the server's own death runs again on a new one (at most :data:`MAX_RESTARTS` times a case)."""
        schedule = self.load.at(scale)
        while True:
            ours, machine, begun = self.cpu_seconds(), busy_s(), time.perf_counter()
            records, cut = replay_or_cut(self.server, schedule, self.cut_s)
            if not records.info.partial or cut:
                break
            if len(self.notes) >= MAX_RESTARTS:
                raise ServerError(f"the server stopped a replay at {scale:.3f}x: {records.info.stop_reason}")
            self.notes.append(f"{scale:.3f}x attempt {attempt}: {records.info.stop_reason}; a new server")
            self.stop()
            self.start()
        wall, theirs = time.perf_counter() - begun, self.cpu_seconds()
        cores = {"host_cores": round((theirs - ours) / wall, 2) if None not in (ours, theirs) else None,
                 "machine_cores": round((busy_s() - machine) / wall, 2)}
        cores.update(sender_lateness(records.table))
        drained = 0.0 if cut else idle(self.server.endpoints.grpc_url, self.served, self.settle_s)
        found = dataclasses.replace(judged(summarize(records, slos=self.slos), self.slos), scale=scale)
        self.probes.append({"scale": scale, "attempt": attempt, "ok": found.ok, "violation": finite(found.violation),
                            "detail": dict(found.detail), "requests": len(schedule), "wall_s": round(wall, 2),
                            "drain_s": round(drained, 2), "cut": cut, **cores})
        if cut:
            self.stop()
            self.start()
        return found

    def cpu_seconds(self) -> float | None:
        """CPU seconds of the server's processes and this one so far (None once the server is gone)."""
        return Session(self.server.endpoints, self.server).cpu_seconds()


@contextmanager
def real_target(repo: Path, config: ServingConfig, load: Load, slos: Mapping, folder: Path,
                timing: tuple[float, float]) -> Iterator[RealTarget]:
    """The case's :class:`RealTarget` on a copy of ``repo`` in ``folder`` (removed after); ``timing``: (seconds of
    quiet that mean idle, seconds a replay may run past its schedule's last arrival: ``replay_or_cut``)."""
    copy = copy_repo(repo, folder, [m.name for m in config.models] + [e for e, _ in config.ensembles])
    config.apply_to_repo(copy)
    target = RealTarget(copy, config, load, slos, *timing)
    try:
        target.start()
        yield target
    finally:
        target.stop()
        shutil.rmtree(copy, ignore_errors=True)


def busy_s() -> float:
    """CPU seconds the whole machine has been busy (every process, ours or not; steal included) since boot."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def sender_lateness(table) -> dict:
    """A replay's sender on time or not: ``late_share``, the share of its sent requests that left more than
    :data:`LATE_S` after their intended time, and ``late_p99_s``, the p99 of sent less intended (s); None where
    nothing was sent. Over :data:`LATE_SHARE` late, the replay's latencies hold the client's delay (docs/notes/
    capacity-fidelity.md: on the 2-core VM only past capacity, the machine full)."""
    late = (table["sent_s"] - table["intended_s"]).to_numpy(dtype=float)
    late = late[np.isfinite(late)]
    if not len(late):
        return {"late_share": None, "late_p99_s": None}
    return {"late_share": round(float(np.mean(late > LATE_S)), 4),
            "late_p99_s": round(float(np.percentile(late, 99)), 6)}


def finite(value: float) -> float | None:
    """``value`` for JSON (None for inf or NaN: a model with no answer in the window)."""
    return value if math.isfinite(value) else None
