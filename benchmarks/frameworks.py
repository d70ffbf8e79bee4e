"""Which framework for which model: the tuner's per-model variants against one framework for every model, measured
on Triton in one run.

    .venv/bin/python benchmarks/frameworks.py --quick   # TorchScript and ONNX Runtime, batch 1/4, short replays
    .venv/bin/python benchmarks/frameworks.py           # + ONNX Runtime at graph level basic, batch 1/4/8, longer

The mix: resnet50, bert_base (the zoo's transformer; ``--seq-len`` tokens, 32 with ``--quick``), mobilenet_v3_large
and tiny_cnn, each exported (parity-checked) as every variant asked (``--variants``), all variants profiled on the
embedded tritonserver at one thread per instance (what the threads rule gives each of four or more instances on a
2-core host) with their memory per instance and CPU-seconds (or energy) per request. The load: Poisson streams of the
four models, each costing the host the same share of ``--load`` cores at 1x on its cheapest variant at batch 1 (the
profile's CPU-seconds per request), with a p99 SLO of ``--slo-factor`` times its fastest variant's p99 batch-1
service time as profiled (at least ``--slo-floor-ms``).

Three kinds of configuration, each chosen on the simulator by ``tune`` (same space, budget and SLOs) and then
measured on Triton:

- **variants**: ``tune --variants auto``: each model's variant chosen among all measured ones, with its instances,
  batch size and queue delay;
- **single framework F**, for every framework: ``tune --variants <F's variants>``: F for every model, tuned the same
  way; the best of them by *measured* capacity is "the best single framework";
- **F at defaults**: F's default variant for every model at the export's serving settings (one instance,
  ``max_batch_size`` as exported, dynamic batching without delay): a one-point ``tune``.

Measured capacity at the SLO: the load grown (superposed) to a scale, replayed on a server holding the configuration,
judged by tune's own SLO check (``tune.objective.check_slos``); the scale bisected with tune's ladder and repeat rule
(``tune.capacity.bisect_capacity``, ``Ladder``, ``Repeats``) on rungs around the configuration's predicted capacity,
from a sixteenth of it (no lower than every model having 12 requests) to four times it (``2 ** (1 / steps)`` apart:
the figure's resolution). Every configuration is served at once, each by a server of its own, warmed (every batch size
up to its ``max_batch_size``), and their probes take turns, one at a time, each server drained (idle for 0.3 s) before
the next probe: the host's drift over the run falls on all of them alike. No request is cancelled on a live server
(``load.uncancelled.replay_or_cut``: a probe still answered ``cut_after_s`` after its last arrival is cut by
ending its server, its unanswered requests failed, and the configuration's next probe runs on a new server, warmed
again). Memory: the union of the instances' resident page frames after the probes
(``telemetry.instances.footprint_bytes``) against the profile's prediction (``tune.variants.config_memory``).

TVM is left out unless ``--tvm-trials N`` (tuned with N MetaSchedule trials; untuned TVM takes seconds per resnet50
image on 2 cores, a profile of it minutes per point). Writes ``benchmarks/results/frameworks[_quick]_<date>_<host>``
``.json`` and ``.md`` (the decision table and each variant's speed, memory and CPU-seconds per batch size from the
profile). The last line: ``variants: measured capacity A× the best single framework (NAME), B× defaults; memory
predicted within C %``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import capacity_cases as cc  # noqa: E402  (the Triton replay's helpers capacity_fidelity.py uses)

from serving_bench.calibrate.measure import measure_profile  # noqa: E402
from serving_bench.calibrate.plan import MeasureConfig  # noqa: E402
from serving_bench.export.api import export_models, settle_after_export  # noqa: E402
from serving_bench.export.frameworks import ExportOptions  # noqa: E402
from serving_bench.export.variants import parse_variants  # noqa: E402
from serving_bench.load.driver import TritonTarget  # noqa: E402
from serving_bench.load.uncancelled import cut_after_s, replay_or_cut  # noqa: E402
from serving_bench.peers.report import write_result  # noqa: E402
from serving_bench.profiles.schema import Profile  # noqa: E402
from serving_bench.run.results import run_summary  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.run.target import ClosedLoop  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402
from serving_bench.serving_config import ServingConfig  # noqa: E402
from serving_bench.telemetry.instances import footprint_bytes, instance_memory, instance_processes  # noqa: E402
from serving_bench.tune.capacity import Ladder, Probe, Repeats, bisect_capacity  # noqa: E402
from serving_bench.tune.load import load_from_file  # noqa: E402
from serving_bench.tune.objective import ObjectiveConfig, check_slos  # noqa: E402
from serving_bench.tune.run import TuneOptions, run_tune  # noqa: E402
from serving_bench.tune.slo import resolve_slos  # noqa: E402
from serving_bench.tune.variants import config_memory, renamed_schedule, summary_for_slots  # noqa: E402

MIX = ("resnet50", "bert_base", "mobilenet_v3_large", "tiny_cnn")
WARMUP_REQUESTS = 3  # per instance and batch size, before a configuration's first probe
IDLE_S = 0.3  # a server that executed nothing for this long has drained (as capacity_fidelity.py judges it)
MIN_PROBE_REQUESTS = 12  # the least requests of any model in a judged probe (the ladder's lowest rung)
MAX_FAILED = ObjectiveConfig().max_failed_fraction  # tune's own bound on failed requests in a judged run


@dataclass(frozen=True)
class Settings:
    """One run's settings (``--quick`` or full; every figure in seconds unless named)."""

    variants: str
    batch_sizes: tuple[int, ...]
    seq_len: int
    profile_s: float  # closed-loop seconds per profiled point
    load_s: float  # the load's duration (each capacity probe replays it)
    tune_minutes: float  # each tune's search budget
    instances: tuple[int, ...]
    queue_delays_us: tuple[int, ...]
    steps_per_doubling: int  # the measuring ladder's rungs per doubling (its resolution)
    repeats: int  # probes of each decisive step (majority)
    load_cores: float  # host cores the load costs at 1x on the cheapest variants at batch 1
    slo_factor: float
    slo_floor_s: float
    seed: int = 0


def settings_from(args) -> Settings:
    quick = args.quick
    variants = args.variants or ("torchscript,onnxruntime" if quick else
                                 "torchscript,onnxruntime,onnxruntime:opt=basic")
    if args.tvm_trials:
        variants += f",tvm:trials={args.tvm_trials}"
    return Settings(variants=variants, batch_sizes=(1, 4) if quick else (1, 4, 8),
                    seq_len=args.seq_len or (32 if quick else 128), profile_s=2.0 if quick else 4.0,
                    load_s=12.0 if quick else 30.0, tune_minutes=0.5 if quick else 2.0, instances=(1, 2),
                    queue_delays_us=(0,) if quick else (0, 2000), steps_per_doubling=4 if quick else 8,
                    repeats=1 if quick else 3, load_cores=args.load, slo_factor=args.slo_factor,
                    slo_floor_s=args.slo_floor_ms / 1e3, seed=args.seed)


def log(text: str) -> None:
    print(text, flush=True)


def export_mix(repo: Path, s: Settings) -> list[str]:
    """Every model of the mix as every variant (parity-checked at export); returns the entries."""
    entries = []
    for model in MIX:
        records = export_models(model, repo=repo, variants=s.variants, overwrite=True,
                                options=ExportOptions(max_batch_size=max(s.batch_sizes), seq_len=s.seq_len,
                                                      tvm_buckets=s.batch_sizes if "tvm" in s.variants else ()),
                                log=lambda line: log("  " + line))
        failed = [r for r in records if r["status"] not in ("exported", "skipped")]
        if failed:
            raise SystemExit(f"export failed: {failed[0]['name']}: {failed[0].get('reason')}")
        entries += [r["name"] for r in records if r["status"] == "exported"]
    return entries


def per_model_least(profile: Profile, figure) -> dict[str, float]:
    """Per zoo model, the least ``figure(ModelOnDevice)`` over its variants."""
    out: dict[str, float] = {}
    for mp in profile.models.values():
        value = figure(mp.devices["cpu"])
        out[mp.model] = min(out.get(mp.model, value), value)
    return out


def write_load(path: Path, profile: Profile, slots: dict[str, str], s: Settings) -> dict:
    """The mix's load profile: each model's Poisson rate such that it costs the host ``load_cores / 4`` cores at 1x
    on its cheapest variant at batch 1 (the profile's CPU-seconds per request, else its service time), its p99 SLO
    ``slo_factor`` times its fastest variant's p99 service at batch 1 as profiled (so the host's noise then is in
    it; at least ``slo_floor_s``). Returns the rates (req/s at 1x) and bounds (s) per slot."""
    fastest = per_model_least(profile, lambda md: md.service(1).quantile(0.99))
    cheapest = per_model_least(profile, lambda md: md.energy.cpu_s.get(1, md.service(1).mean)
                               if md.energy is not None else md.service(1).mean)
    rows = {slot: {"rate": s.load_cores / len(slots) / cheapest[model],
                   "p99_s": max(s.slo_factor * fastest[model], s.slo_floor_s)} for model, slot in slots.items()}
    lines = [f"name: {path.stem}", f"duration: {s.load_s}s", f"seed: {s.seed + 11}", "warmup: 1s", "models:"]
    lines += [f"  {slot}: {{rate: {r['rate']:.4f}, slo: {{p99: {r['p99_s'] * 1e3:.1f}ms}}}}"
              for slot, r in rows.items()]
    path.write_text("\n".join(lines) + "\n")
    return rows


@dataclass(frozen=True)
class Candidate:
    """A configuration chosen by ``tune``: ``chosen`` slot -> entry, its tuned repository, what tune predicted."""

    label: str
    kind: str  # variants | single | defaults
    chosen: dict
    tuned_repo: str
    predicted_scale: float
    predicted_capped: bool
    predicted_memory_bytes: int
    settings: dict
    tune_wall_s: float


def choose(label: str, kind: str, variants: str, paths: dict, s: Settings, defaults: bool = False) -> Candidate:
    """Run ``tune`` for one configuration (``defaults``: the one point of the export's serving settings)."""
    space = dict(instances=(1,), max_batch_sizes=(max(s.batch_sizes),), queue_delays_us=(0,)) if defaults else \
        dict(instances=s.instances, max_batch_sizes=s.batch_sizes, queue_delays_us=s.queue_delays_us)
    out = paths["work"] / "tune" / label.replace(" ", "_").replace(":", "-")
    doc = run_tune(TuneOptions(load=str(paths["load"]), profile=str(paths["profile"]), out=str(out),
                               repo=str(paths["repo"]), variants=variants, verify_top=0, report=False, quiet=True,
                               replications=0, max_scale=64.0, budget_minutes=s.tune_minutes, restart=True, **space))
    best = doc["best"]
    chosen = {slot: block["pick"] for slot, block in doc["variants"].items()}
    config = ServingConfig.from_repo(doc["tuned_repo"], list(chosen.values()))
    memory, _ = config_memory(Profile.load(paths["profile"]), config)
    settings = {entry: {"instances": best["config"][slot]["instances"],
                        "max_batch_size": best["config"][slot]["max_batch_size"],
                        "max_queue_delay_us": best["config"][slot]["max_queue_delay_us"]}
                for slot, entry in chosen.items()}
    result = best["result"]
    log(f"  {label}: predicted {result['capacity_scale']:.2f}x{' (capped)' if result['capacity_capped'] else ''}, "
        f"memory {memory['cpu'] / 1e6:,.0f} MB; {', '.join(f'{e} {v}' for e, v in settings.items())} "
        f"(tune {doc['wall_s']:.1f} s, {doc['search']['evaluated']} evaluated)")
    return Candidate(label, kind, chosen, doc["tuned_repo"], result["capacity_scale"], result["capacity_capped"],
                     memory["cpu"], settings, doc["wall_s"])


def candidates_of(paths: dict, s: Settings) -> list[Candidate]:
    """The variants pick, each framework tuned and each framework at defaults."""
    by_framework: dict[str, list[str]] = {}
    for v in parse_variants(s.variants):
        by_framework.setdefault(v.framework, []).append(v.id)
    out = [choose("variants", "variants", "auto", paths, s)]
    out += [choose(f"{f} tuned", "single", ",".join(ids), paths, s) for f, ids in by_framework.items()]
    out += [choose(f"{f} defaults", "defaults", f, paths, s, defaults=True) for f in by_framework]
    return out


class Turns:
    """Probes of several bisections run one at a time, in turn (round robin over those still running), so that the
    host's drift over the run falls on every configuration alike (the host is shared: other work comes and goes)."""

    def __init__(self, names: list[str]):
        self.waiting = list(names)
        self.current = 0
        self.cond = threading.Condition()

    @contextlib.contextmanager
    def turn(self, name: str):
        with self.cond:
            self.cond.wait_for(lambda: self.waiting[self.current] == name)
        try:
            yield
        finally:
            with self.cond:
                self.current = (self.waiting.index(name) + 1) % len(self.waiting)
                self.cond.notify_all()

    def leave(self, name: str) -> None:
        with self.cond:
            i = self.waiting.index(name)
            self.waiting.remove(name)
            if self.waiting:
                self.current = (self.current - (i < self.current)) % len(self.waiting)
            self.cond.notify_all()


@dataclass(frozen=True)
class Bench:
    """What every probe shares: the load, its SLOs (per slot), how long a replay may run past its last arrival (s,
    ``load.uncancelled.replay_or_cut``) and the turns."""

    load: object
    slos: dict
    cut_s: float
    turns: Turns


class Served:
    """A configuration's server, warmed (:func:`warm_up`); started again, and warmed again, after a probe that was
    cut (``replay_or_cut``). ``restarts``: how many times."""

    def __init__(self, candidate: Candidate):
        self.candidate, self.server, self.restarts = candidate, None, 0

    def start(self) -> "Served":
        c = self.candidate
        self.server = TritonServer(c.tuned_repo, models=list(c.chosen.values())).start()
        warm_up(self.server, c)
        return self

    def restart(self) -> None:
        self.close()
        self.start()
        self.restarts += 1

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def probe_fn(served: Served, candidate: Candidate, bench: Bench):
    """``probe(scale, attempt)`` for :func:`bisect_capacity`: the load at ``prediction x scale`` replayed on
    ``served``'s server in the candidate's turn, judged by tune's SLO check (a cut replay as it is, its server then
    started again)."""
    base = candidate.predicted_scale if candidate.predicted_scale > 0 else 1.0

    def probe(scale: float, attempt: int) -> Probe:
        with bench.turns.turn(candidate.label):  # the work around the replay too: nothing else runs beside it
            schedule = renamed_schedule(bench.load.at(base * scale), candidate.chosen)
            t0 = time.perf_counter()
            records, cut = replay_or_cut(served.server, schedule, bench.cut_s)
            if records.info.partial and not cut:
                raise SystemExit(f"{candidate.label}: a replay stopped early ({records.info.stop_reason})")
            wall = time.perf_counter() - t0
            if cut:  # in the turn: the new server's warm-up runs beside no other probe
                served.restart()
            # what a replay near capacity left queued: not into the next one's time
            entries = list(candidate.chosen.values())
            drained = 0.0 if cut else cc.idle(served.server.endpoints.grpc_url, entries, IDLE_S)
            summary = summary_for_slots(run_summary(records), candidate.chosen)
        met, worst = check_slos(summary, bench.slos, MAX_FAILED)
        p99 = {m: summary["models"][m]["p99_s"] for m in bench.slos if m in summary["models"]}
        log(f"    {candidate.label} at {base * scale:.2f}x ({len(schedule):,} requests, {wall:.1f} s, "
            + ("cut: a new server" if cut else f"drained in {drained:.1f} s")
            + f"): {'met' if met else 'missed'} (worst {worst:.2f} of a bound); p99 "
            + ", ".join(f"{m.split('_')[0]} {v * 1e3:.0f} ms" for m, v in p99.items() if v is not None))
        return Probe(scale, met, worst, {"scale": base * scale, "p99_s": p99, "attempt": attempt, "wall_s": wall,
                                         "drain_s": drained, "cut": cut, **cc.sender_lateness(records.table)})
    return probe


def lowest_scale(load) -> float:
    """The lowest load scale a probe judges: every model has :data:`MIN_PROBE_REQUESTS` requests in it (below, a
    slow model's few requests say nothing of its p99, and a model with none would count as not served)."""
    counts = np.bincount(load.base.model, minlength=len(load.base.models))
    return MIN_PROBE_REQUESTS / max(int(counts.min()), 1)


def warm_up(server, candidate: Candidate) -> None:
    """Each served entry alone, at every batch size up to its ``max_batch_size``, :data:`WARMUP_REQUESTS` requests
    per instance, as many in flight as it has instances: a fresh instance's first requests of each shape are not the
    load's (TorchScript's profiling executor optimises a graph per input shape, ONNX Runtime grows its arenas)."""
    for entry, knobs in candidate.settings.items():
        for rows in range(1, max(knobs["max_batch_size"], 1) + 1):
            pool = Schedule.closed_loop({entry: rows}, WARMUP_REQUESTS * knobs["instances"], {"duration_s": 600.0})
            TritonTarget(server, mode=ClosedLoop(concurrency={entry: knobs["instances"]})).run(pool)


def measure(served: Served, candidate: Candidate, bench: Bench, s: Settings) -> dict:
    """Measured capacity at the SLOs (bisection around the prediction, in turns) and memory of one configuration on
    its server (after its probes; after a warm-up only where the last probe was cut)."""
    base = candidate.predicted_scale if candidate.predicted_scale > 0 else 1.0
    ladder = Ladder(min_scale=max(1 / 16, lowest_scale(bench.load) / base), max_scale=4.0,
                    steps_per_doubling=s.steps_per_doubling)
    t0 = time.perf_counter()
    try:
        found = bisect_capacity(probe_fn(served, candidate, bench), ladder, Repeats(s.repeats, "majority"))
    finally:
        bench.turns.leave(candidate.label)
    pid = served.server.pid
    measured_memory, how = footprint_bytes([p.pid for p in instance_processes(pid)])
    by_entry = {entry: {k: v for k, v in m.items() if k in ("instances", "rss_bytes", "uss_bytes")}
                for entry, m in instance_memory(pid, gpu=False).by_model().items()}
    scale = base * found.capacity_scale
    error = None if measured_memory is None else \
        (candidate.predicted_memory_bytes - measured_memory) / measured_memory
    log(f"  {candidate.label}: measured {scale:.2f}x{' (at least: the top rung met)' if found.capped else ''} "
        f"(predicted {candidate.predicted_scale:.2f}x); memory {(measured_memory or 0) / 1e6:,.0f} MB measured, "
        f"{candidate.predicted_memory_bytes / 1e6:,.0f} predicted ({how})")
    return {"capacity_scale": scale, "capped": found.capped, "probes": [dict(p.detail, ok=p.ok, violation=p.violation)
                                                                      for p in found.probes],
            "memory_bytes": measured_memory, "memory_how": how, "memory_error": error, "memory_by_entry": by_entry,
            "capacity_rps": scale * bench.load.offered_rps, "wall_s": time.perf_counter() - t0,
            "server_restarts": served.restarts}


def measure_together(distinct: list[Candidate], load, slos: dict, s: Settings) -> dict[str, dict]:
    """Every configuration on a server of its own, all up at once and warmed, their bisections' probes in turns."""
    bench = Bench(load, slos, cut_after_s(slos), Turns([c.label for c in distinct]))
    with contextlib.ExitStack() as stack:
        served = {}
        for c in distinct:
            log(f"  {c.label}: serving {', '.join(c.chosen.values())}")
            served[c.label] = Served(c)
            stack.callback(served[c.label].close)
            served[c.label].start()
        with cf.ThreadPoolExecutor(len(distinct)) as pool:
            futures = {c.label: pool.submit(measure, served[c.label], c, bench, s) for c in distinct}
            return {label: f.result() for label, f in futures.items()}


def ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def verdict(rows: list[dict]) -> dict:
    """The figures of the last line: the variants' measured capacity against the best single framework's and the
    best default's, and the worst memory error."""
    pick = next(r for r in rows if r["kind"] == "variants")
    single = max((r for r in rows if r["kind"] == "single"), key=lambda r: r["measured"]["capacity_scale"])
    default = max((r for r in rows if r["kind"] == "defaults"), key=lambda r: r["measured"]["capacity_scale"])
    errors = [abs(r["measured"]["memory_error"]) for r in rows if r["measured"]["memory_error"] is not None]
    return {"vs_single": ratio(pick["measured"]["capacity_scale"], single["measured"]["capacity_scale"]),
            "single": single["label"].split()[0], "vs_defaults": ratio(pick["measured"]["capacity_scale"],
                                                                       default["measured"]["capacity_scale"]),
            "defaults": default["label"], "memory_within": max(errors) if errors else None}


def last_line(v: dict) -> str:
    def x(value):
        return "n/a" if value is None else f"{value:.2f}"
    memory = "n/a (page frames not readable)" if v["memory_within"] is None else f"{v['memory_within'] * 100:.1f}"
    return (f"variants: measured capacity {x(v['vs_single'])}× the best single framework ({v['single']}), "
            f"{x(v['vs_defaults'])}× defaults; memory predicted within {memory} %")


def decision_table(rows: list[dict]) -> str:
    head = ("| configuration | served as (entry: instances / max batch / queue delay µs) | predicted capacity | "
            "measured capacity | measured req/s | memory predicted MB | measured MB | error |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        m = r["measured"]
        served = "; ".join(f"{e}: {v['instances']} / {v['max_batch_size']} / {v['max_queue_delay_us']}"
                           for e, v in r["settings"].items())
        error = "–" if m["memory_error"] is None else f"{m['memory_error'] * 100:+.1f} %"
        same = f" (= {m['same_as']})" if m.get("same_as") else ""
        lines.append(f"| {r['label']}{same} | {served} | {r['predicted_scale']:.2f}× | {m['capacity_scale']:.2f}×"
                     f"{' (capped)' if m['capped'] else ''} | {m['capacity_rps']:.1f} | "
                     f"{r['predicted_memory_bytes'] / 1e6:,.0f} | {(m['memory_bytes'] or 0) / 1e6:,.0f} | {error} |")
    return "\n".join(lines)


def speed_table(profile: Profile) -> str:
    """Each variant per batch size as profiled (one instance alone, one thread): the study's comparison."""
    lines = ["| entry | variant | batch | mean ms | p99 ms | rows/s | RSS MB | USS MB | CPU-ms a request |",
             "|" + "---|" * 9]
    for name, mp in sorted(profile.models.items()):
        md = mp.devices["cpu"]
        for b in md.batch_sizes:
            service = md.service(b)
            cpu = md.energy.cpu_s.get(b) if md.energy is not None else None
            lines.append(f"| {name} | {mp.variant or mp.framework} | {b} | {service.mean * 1e3:.1f} | "
                         f"{service.quantile(0.99) * 1e3:.1f} | {b / service.mean:.1f} | "
                         f"{(md.memory_bytes or 0) / 1e6:,.0f} | {(md.memory_unique_bytes or 0) / 1e6:,.0f} | "
                         f"{'–' if cpu is None else f'{cpu * 1e3:.1f}'} |")
    return "\n".join(lines)


def prepare(paths: dict, s: Settings, reuse: bool) -> Profile:
    """Export the mix and profile every variant (or reuse both from an earlier run's work folder)."""
    if reuse and paths["profile"].is_file():
        log(f"reusing {paths['repo']} and {paths['profile']}")
        return Profile.load(paths["profile"])
    log(f"export: {', '.join(MIX)} as {s.variants} (max batch {max(s.batch_sizes)}, bert_base seq {s.seq_len})")
    t0 = time.perf_counter()
    entries = export_mix(paths["repo"], s)
    log(f"export: {len(entries)} entries, {time.perf_counter() - t0:.0f} s; profile at one thread per instance")
    settle_after_export(time.perf_counter(), log)
    t0 = time.perf_counter()
    profile = measure_profile(paths["repo"], entries, paths["profile"], MeasureConfig(
        batch_sizes=s.batch_sizes, calibrate=0, pairs=False, seconds=s.profile_s, idle_rounds=1, threads=1),
        lambda line: log("  " + line))
    log(f"profile: {time.perf_counter() - t0:.0f} s")
    return profile


def measure_all(candidates: list[Candidate], load, slos: dict, s: Settings) -> list[dict]:
    """Each distinct configuration measured once (:func:`measure_together`); one that another already is (the
    variants pick being one framework's tuned configuration, say) takes that measurement."""
    first: dict[str, Candidate] = {}
    for c in candidates:
        first.setdefault(json.dumps(c.settings, sort_keys=True), c)
    measured = measure_together(list(first.values()), load, slos, s)
    rows = []
    for c in candidates:
        same = first[json.dumps(c.settings, sort_keys=True)]
        rows.append(dict(dataclasses.asdict(c), measured=dict(measured[same.label],
                                                              same_as=None if same is c else same.label)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="two frameworks, batch 1/4, 12 s replays, one probe a step")
    parser.add_argument("--variants", help="the variants exported and searched (default: see the module doc)")
    parser.add_argument("--tvm-trials", type=int, default=0, help="add TVM tuned with N MetaSchedule trials")
    parser.add_argument("--seq-len", type=int, help="bert_base's tokens (default 128; 32 with --quick)")
    parser.add_argument("--load", type=float, default=0.3, help="host cores the load costs at 1x (default 0.3)")
    parser.add_argument("--slo-factor", type=float, default=4.0, help="p99 SLO: this times the fastest variant's "
                                                                      "profiled p99 at batch 1 (default 4)")
    parser.add_argument("--slo-floor-ms", type=float, default=50.0, help="the smallest p99 SLO (default 50 ms)")
    parser.add_argument("--work", help="keep the repository, profile and tune folders here (default: a temporary one)")
    parser.add_argument("--reuse", action="store_true", help="reuse --work's repository and profile")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    s = settings_from(args)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        paths = {"work": work, "repo": work / "repo", "profile": work / "profile.json", "load": work / "mix.yaml"}
        profile = prepare(paths, s, args.reuse)
        first = parse_variants(s.variants)[0]
        rates = write_load(paths["load"], profile, {m: first.entry_name(m) for m in MIX}, s)
        log("load at 1x: " + ", ".join(f"{slot} {r['rate']:.2f} req/s (p99 ≤ {r['p99_s'] * 1e3:.0f} ms)"
                                        for slot, r in rates.items()))
        log("tune (simulator):")
        candidates = candidates_of(paths, s)
        load = load_from_file(paths["load"])
        slos = resolve_slos(None, load.base)
        log(f"measure on Triton ({len(load.base)} requests at 1x over {load.duration_s:.0f} s; rungs "
            f"{2 ** (1 / s.steps_per_doubling) - 1:.0%} apart, {s.repeats} probe(s) a decisive step):")
        rows = measure_all(candidates, load, slos, s)
    v = verdict(rows)
    wall = time.perf_counter() - started
    header = (f"# Which framework for which model ({'quick' if args.quick else 'full'})\n\nVariants {s.variants}; "
              f"bert_base seq {s.seq_len}; batch sizes {', '.join(map(str, s.batch_sizes))}; one thread per instance; "
              f"{wall / 60:.1f} min in all. Command: `python benchmarks/frameworks.py "
              f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    markdown = (header + "\n## Measured capacity at the SLO (× the load at 1x)\n\n" + decision_table(rows) +
                "\n\n## Each variant as profiled (one instance alone, one thread)\n\n" + speed_table(profile) +
                "\n\n" + last_line(v) + "\n")
    path = write_result("frameworks", {"settings": dataclasses.asdict(s), "rates": rates, "rows": rows,
                                       "verdict": v, "wall_s": wall}, quick=args.quick, out_dir=args.out,
                        markdown=markdown)
    print("\n" + markdown)
    print(f"wrote {path} and .md; {wall:.0f} s in all")
    print(last_line(v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
