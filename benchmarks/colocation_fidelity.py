"""Co-location fidelity: the simulator's predictions of co-located models and an ensemble against the embedded Triton
(CPU), on measurements it was not fitted to, beside a baseline in the same run.

Entries: tiny_cnn on ONNX Runtime and TVM, tiny_mlp on TorchScript, the python sleep model (a model that uses no
core), resnet50 on ONNX Runtime, and the ensemble tiny_ensemble = tiny_cnn (ONNX Runtime) + tiny_cnn (TorchScript).
A solo profile is measured first (no co-located run: per batch size service times and demands, per request its way
in and out; the ensemble alone for its own time beyond its members', since 2026-12-04 evening); then, on the real
server:

(a) instances: tiny_cnn_onnxruntime with k = 1, 2, 4, 8 instances and k clients (closed loop): the sharing law is
    fitted on k <= 4 and k = 8 is predicted; each k's host CPU per request and requests per executed batch are
    printed and saved beside it (Triton batches more as k grows, which amortises the per-batch hand-offs);
(b) co-location: every entry alone, every pair, then all together (one instance and one client each): the law is
    fitted on the solo runs and pairs and "all together" is predicted;
(c) open-loop replays of all entries together at 0.3, 0.6 and 0.9 of their measured co-located capacity (the rates
    "all together" reached), simulated with the law fitted on that closed loop of the same set (a measured point
    of the set replayed stands over what the pairs imply; the pairs' law, held out against it in (b), gave the
    replays a larger p99 error in 7 of the 8 saved sessions measured undisturbed: docs/notes/sim-history.md#benchmarks); the one at 0.9 is
    replayed a second time, and the two measurements' differences (the measurement's own repeatability) are
    printed beside the model's errors; the host's CPU during "all together" and each replay (server, stubs and
    client, cores on average; since 2026-12-05) says how full each ran the host; with the wait for a core behind
    resnet50's occasional batches measured in
(d) two open loops of all entries, resnet50 at a tenth of a core and the others at 15 and 150 req/s, as ``profile``
    measures it (``calibrate.waits.quiet_wait``; older saved data have none: the wait is then fitted on "all
    together" as the rest of the law).

Per entry and scenario: the relative p50, p99 and throughput error of the full model (the law the profile fits by
default, ``serving_bench.calibrate.plan.DEFAULT_LAW``, or the form given by ``--law``) and of the baseline — the
same solo profile with no interference (law ``none``: every job runs at its solo speed). The held-out throughput and
p99 errors of every law are printed too (with ``--quick`` only those of ``pool``, ``pool_eff`` and the default, to
keep it under 5 minutes): the form is chosen by them, not by goodness of fit; and part (a)'s simulated requests per
executed batch beside the measured ones (the batching that amortises the per-batch hand-offs). Targets (quiet 2-core
machine): |p50| <= 5 %, |p99| <= 10 %, |throughput| <= 3 % at loads <= 0.9; leave-out predictions within 10 %
throughput. Each measured p50 and p99 keeps its distribution-free 95 % interval (``run.metrics.quantile_intervals``),
and the lines before the last count the rows whose prediction falls inside it and the p99s too few requests bound
above (a quick replay's tiny models: most), then give the repeated replay's worst differences — what the
measurement itself can resolve. The last line is the worst error of each metric over every entry and scenario.

    .venv/bin/python benchmarks/colocation_fidelity.py [--quick] [--out DIR] [--law FORM] [--laws FORM ...]
                                                       [--data SAVED.json.xz ...]

The measurements are saved first (``colocation_fidelity_data[_quick]_<date>_<host>.json.xz``: the solo profile, every
closed-loop run, the replays' figures); ``--data`` evaluates saved measurements again without a server. Given the
saved measurements of several sessions it evaluates each and prints the medians and ranges over the sessions of the
held-out errors of every law, of part (a)'s requests per batch and of the worst errors (sessions measured on a
disturbed machine left out): one session on this VM is too noisy to choose a form or judge a mechanism by.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving_bench.errors import InputError  # noqa: E402
from serving_bench.export.api import export_models, settle_after_export  # noqa: E402
from serving_bench.export.frameworks import ExportOptions  # noqa: E402
from serving_bench.export.repository import CONFIG_NAME, entry_dir, read_config  # noqa: E402
from serving_bench.files import read_json  # noqa: E402
from serving_bench.load.driver import TritonTarget  # noqa: E402
from serving_bench.load.native import choose_sender  # noqa: E402
from serving_bench.peers.report import Spread, write_result  # noqa: E402
from serving_bench.calibrate.waits import quiet_wait  # noqa: E402
from serving_bench.calibrate.measure import measure_profile  # noqa: E402
from serving_bench.calibrate.plan import (DEFAULT_LAW, IDLE_ROUNDS, QUIET_RATES_RPS, QUIET_SECONDS,  # noqa: E402
                                         MeasureConfig, calibration_serving, quiet_rates)
from serving_bench.profiles.law import Law  # noqa: E402
from serving_bench.profiles.schema import Profile  # noqa: E402
from serving_bench.calibrate.session import Session  # noqa: E402
from serving_bench.run.metrics import quantile_intervals, simulated_inside, summarize  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402
from serving_bench.telemetry.cpu import DISTURBED_SHARE  # noqa: E402
from serving_bench.serving_config import ServingConfig, cpu_cores  # noqa: E402
from serving_bench.sim.interference import (FORMS, WAIT_S_RANGE, Observation, answered, fit,  # noqa: E402
                                             open_schedule, percentiles, serving_from_json, simulate, tail_error,
                                             throughput, with_law)
from serving_bench.sim.target import SimTarget  # noqa: E402
from serving_bench.validate import server_mean_s  # noqa: E402

ENSEMBLE = ("tiny_ensemble", ("tiny_cnn_onnxruntime", "tiny_cnn_torchscript"))
ENSEMBLE_STEPS = ENSEMBLE[1] + ("tiny_ensemble_combiner",)
ENSEMBLE_DEPS = ((), (), (0, 1))  # both members read the request, the combiner their outputs (checked on the export)
STREAMS = ("tiny_cnn_onnxruntime", "tiny_cnn_tvm", "tiny_mlp_torchscript", "sleep_python", "resnet50_onnxruntime",
           ENSEMBLE[0])
SCALED = "tiny_cnn_onnxruntime"
LONGEST = "resnet50_onnxruntime"  # the entry whose occasional batches the others wait behind (d)
INSTANCES = (1, 2, 4, 8)
LOADS = (0.3, 0.6, 0.9)
REPEATED_LOAD = 0.9  # replayed twice: the measurement's own repeatability beside the model's errors
LAWS_COMPARED = FORMS
LAWS_QUICK = ("pool", "pool_eff", DEFAULT_LAW)  # --quick: the simplest forms beside the default
TARGETS = {"p50": 0.05, "p99": 0.10, "throughput": 0.03}


STARTED = time.perf_counter()


def stage(title: str) -> None:
    """Print a stage's title with the seconds since the benchmark started."""
    print(f"== {title} [{time.perf_counter() - STARTED:.0f} s]", flush=True)


def export(repo: Path) -> list[str]:
    """The entries (members of the ensemble included) exported into ``repo``; returns the served model names."""
    export_models(["tiny_cnn"], ["onnxruntime", "torchscript", "tvm"], repo, options=ExportOptions(max_batch_size=8),
                  ensembles=[f"{ENSEMBLE[0]}={','.join(ENSEMBLE[1])}"])
    export_models(["tiny_mlp"], ["torchscript"], repo, options=ExportOptions(max_batch_size=8))
    export_models(["sleep"], ["onnxruntime"], repo,
                  options=ExportOptions(max_batch_size=8, sleep_base_ms=2.0, sleep_per_item_ms=0.5))
    export_models(["resnet50"], ["onnxruntime"], repo, options=ExportOptions(max_batch_size=2))
    exported = ServingConfig.from_repo(repo, [ENSEMBLE[0]])
    assert exported.ensembles == ((ENSEMBLE[0], ENSEMBLE_STEPS),) and \
        exported.ensemble_deps == ((ENSEMBLE[0], ENSEMBLE_DEPS),), exported
    settle_after_export(time.perf_counter(), print)
    return ["tiny_cnn_onnxruntime", "tiny_cnn_torchscript", "tiny_cnn_tvm", "tiny_mlp_torchscript", "sleep_python",
            "resnet50_onnxruntime", "tiny_ensemble_combiner"]


def figures(latency: np.ndarray, rps: float) -> dict:
    """p50, p99 (s) and throughput (req/s), with the percentiles' measured 95 % intervals (``intervals``)."""
    return {"p50": float(np.percentile(latency, 50)), "p99": float(np.percentile(latency, 99)), "throughput": rps,
            "intervals": {f"p{q}": list(i) for q, i in zip((50, 99), quantile_intervals(latency, (0.5, 0.99)))}}


def closed_run(session: Session, clients: dict[str, int], seconds: float) -> dict[str, dict]:
    """Measured p50, p99 (send to answer) and answered requests per second per stream of one closed loop; where
    the session's server logs its executions, also the host's CPU per request (ms: server, stubs and client) and
    requests per executed batch (``cpu_ms``, ``per_batch``; one stream only)."""
    run = session.run({m: (1, c) for m, c in clients.items()}, seconds)
    out = {m: figures(run.latency[m], len(run.latency[m]) / seconds) for m in clients}
    if len(clients) == 1 and run.cpu_s is not None and run.executions:
        (m,) = clients
        n_answered = len(run.latency[m])
        out[m]["cpu_ms"] = run.cpu_s / n_answered * 1e3
        out[m]["per_batch"] = n_answered / max(len(run.executions[m]), 1)
    return out


def simulated(profile: Profile, obs: Observation, seconds: float) -> dict[str, dict]:
    """Simulated p50, p99 (send to answer, s) and throughput (req/s) per stream of a closed loop over ``seconds``."""
    records = simulate(profile, obs, seconds)
    rps, latency = throughput(records, seconds), percentiles(records, seconds, (50, 99))
    return {m: {"p50": latency[m][50], "p99": latency[m][99], "throughput": rps[m]} if m in latency else
            {"p50": math.nan, "p99": math.nan, "throughput": 0.0} for m in obs.clients}


def errors(sim: dict[str, dict], real: dict[str, dict]) -> dict[str, dict]:
    return {m: {k: (sim[m][k] - real[m][k]) / real[m][k] if real[m][k] else math.nan for k in TARGETS}
            for m in real}


def observation(serving: dict, clients: dict[str, int], real: dict[str, dict]) -> Observation:
    members = {m: serving[m] for m in serving if m in clients or (ENSEMBLE[0] in clients and m in ENSEMBLE_STEPS)}
    called = ENSEMBLE[0] in clients
    return Observation("cpu", members, clients, {m: real[m]["throughput"] for m in clients},
                       ensembles={ENSEMBLE[0]: ENSEMBLE_STEPS} if called else {},
                       measured_p99={m: real[m]["p99"] for m in clients},
                       ensemble_deps={ENSEMBLE[0]: ENSEMBLE_DEPS} if called else {})


def saved_observation(saved: dict) -> Observation:
    """A saved run's observation, with its measured p99s and its ensemble's step graph (data saved before
    observations carried them; until 2026-12-02 the simulator then ran the ensemble's steps as a chain)."""
    obs = Observation.from_json(saved["obs"])
    if not obs.measured_p99:
        obs = dataclasses.replace(obs, measured_p99={m: saved["real"][m]["p99"] for m in obs.clients})
    if obs.ensembles and not obs.ensemble_deps:
        obs = dataclasses.replace(obs, ensemble_deps={ENSEMBLE[0]: ENSEMBLE_DEPS})
    return obs


def tput_error(profile: Profile, obs: Observation, seconds: float) -> float:
    """Mean |log error| of the simulated throughput of the observation's streams."""
    pred = throughput(simulate(profile, obs, seconds), seconds)
    return float(np.mean([abs(math.log(max(pred[m], 1e-9) / r)) for m, r in obs.measured_rps.items() if r > 0]))


def poisson_schedule(capacity: dict[str, float], load: float, seconds: float, seed: int) -> Schedule:
    """Poisson arrivals of every stream at ``load`` times its co-located capacity, for ``seconds``."""
    rng = np.random.default_rng(seed)
    names = tuple(capacity)
    times, which = [], []
    for i, m in enumerate(names):
        t = np.cumsum(rng.exponential(1 / (load * capacity[m]), int(load * capacity[m] * seconds * 1.3) + 10))
        t = t[t < seconds]
        times.append(t)
        which.append(np.full(len(t), i))
    t, w = np.concatenate(times), np.concatenate(which)
    order = np.argsort(t, kind="stable")
    n = len(t)
    return Schedule(t[order], w[order], names, np.zeros(n), np.ones(n),
                    {"duration_s": seconds, "warmup_s": 1.0, "seed": seed})


def serving_config(serving: dict, streams) -> ServingConfig:
    members = [m for m in serving if m in streams or m in ENSEMBLE_STEPS]
    called = ENSEMBLE[0] in streams
    return ServingConfig(tuple(serving[m] for m in members), ((ENSEMBLE[0], ENSEMBLE_STEPS),) if called else (),
                         ((ENSEMBLE[0], ENSEMBLE_DEPS),) if called else ())


def line(label: str, case: str, entry: str, full: dict, base: dict) -> str:
    """One row of errors in %; a replay's row ends with the full model's error in the mean time inside the server
    (Triton's queue + compute per request) where it was measured: the part of the latency the ways in and out
    do not set."""
    return (f"  {label:<4} {case:<14} {entry:<22} " +
            " ".join(f"{full[k] * 100:+7.1f}{'*' if abs(full[k]) > TARGETS[k] else ' '}" for k in TARGETS) +
            "  | " + " ".join(f"{base[k] * 100:+7.1f}" for k in TARGETS) +
            (f"  | server mean {full['server_mean'] * 100:+.1f}" if "server_mean" in full else ""))


def held_out_case(label: str, case: str, profile: Profile, law: Law, obs: Observation, real: dict,
                  seconds: float, rows: list) -> None:
    """Simulate a held-out closed-loop case with the fitted law and the baseline; print and collect the errors."""
    full = errors(simulated(with_law(profile, "cpu", law), obs, seconds), real)
    base = errors(simulated(with_law(profile, "cpu", Law("none")), obs, seconds), real)
    for m in real:
        rows.append({"scenario": label, "case": case, "entry": m, "full": full[m], "baseline": base[m],
                     "measured": real[m]})
        print(line(label, case, m, full[m], base[m]))


def measure(quick: bool) -> dict:
    """Every measurement of the benchmark on the real server, as plain data (see :func:`evaluate`)."""
    seconds = 1.2 if quick else 5.0  # --quick: under 5 minutes with the export's settling and the fits
    replay_s = 6.0 if quick else 30.0
    quiet_s = 8.0 if quick else QUIET_SECONDS
    sender_note = choose_sender(None)[1]
    print(sender_note, flush=True)
    with tempfile.TemporaryDirectory(prefix="colocation-fidelity-") as tmp:
        repo = Path(tmp) / "repo"
        served = export(repo)
        stage("solo profile (no co-located run)")
        profile = measure_profile(repo, [*served, ENSEMBLE[0]], Path(tmp) / "solo.json",  # the ensemble alone too
                                  MeasureConfig(seconds=1.0 if quick else 2.0, rounds=1, calibrate=0, pairs=False,
                                                idle_rounds=1 if quick else IDLE_ROUNDS))
        configs = {m: read_config(entry_dir(repo, m) / CONFIG_NAME) for m in served}
        largest = {m: max(profile.models[m].devices["cpu"].batch_sizes) for m in served}

        stage(f"(a) {SCALED} with k instances and k clients")
        scaled = {}
        with TritonServer(repo, models=[SCALED], instances={SCALED: max(INSTANCES)}, execution_log=True) as server:
            session = Session(server.endpoints, server)
            for k in INSTANCES:
                real = closed_run(session, {SCALED: k}, seconds)
                serving_k = {SCALED: calibration_serving(configs[SCALED], "cpu", k, largest[SCALED])}
                scaled[k] = {"obs": observation(serving_k, {SCALED: k}, real).to_json(), "real": real}
                r = real[SCALED]
                cost = (f", {r['cpu_ms']:.3f} ms of CPU per request, {r['per_batch']:.2f} requests per batch"
                        if "cpu_ms" in r else "")
                print(f"  k = {k}: {r['throughput']:.0f} req/s, p99 {r['p99'] * 1e3:.2f} ms{cost}")

        stage("(b) every entry alone, every pair, all together (one instance, one client each)")
        serving = {m: calibration_serving(configs[m], "cpu", 1, largest[m]) for m in served}
        cases = {}
        with TritonServer(repo, models=list(STREAMS)) as server:
            session = Session(server.endpoints, server)
            groups = [(s,) for s in STREAMS] + [(a, b) for i, a in enumerate(STREAMS) for b in STREAMS[i + 1:]]
            for group in groups + [STREAMS]:
                clients = {m: 1 for m in group}
                real = closed_run(session, clients, seconds)
                cases["all together" if group == STREAMS else " + ".join(group)] = \
                    {"obs": observation(serving, clients, real).to_json(), "real": real,
                     "host_cores": cores(session.runs[-1].cpu_s, session.runs[-1].window)}
            capacity = {m: cases["all together"]["real"][m]["throughput"] for m in STREAMS}
            print("  co-located capacity: " + ", ".join(f"{m} {r:.0f} req/s" for m, r in capacity.items()) +
                  host_cpu_note(cases["all together"]))

            stage("(c) open-loop replays of all entries together")
            replays = {}
            for load in LOADS:
                replays[str(load)] = replay_measured(session, server, capacity, load, replay_s)
                print(f"  load {load}" + host_cpu_note(replays[str(load)]))
            print(f"  load {REPEATED_LOAD} once more: the measurement's own repeatability")
            repeat = {"load": str(REPEATED_LOAD), **replay_measured(session, server, capacity, REPEATED_LOAD, replay_s)}

        stage(f"(d) the wait behind {LONGEST}'s occasional batches (open loops, the others at "
              f"{' and '.join(f'{r:g}' for r in QUIET_RATES_RPS)} req/s)")
        with TritonServer(repo, models=list(STREAMS), execution_log=True) as server:
            session = Session(server.endpoints, server)
            longest_s = profile.models[LONGEST].devices["cpu"].batches[1].mean
            runs = [session.replay(open_schedule(quiet_rates(STREAMS, LONGEST, longest_s, rate), quiet_s, 0))
                    for rate in QUIET_RATES_RPS]
        waits = quiet_wait(runs, LONGEST, WAIT_S_RANGE)
        if waits is not None:
            lengths = (f" on a busier host, {waits.slice_quiet_s * 1e3:.1f} ms on a quieter (one length: "
                       f"{waits.slice_one_s * 1e3:.1f} ms)" if waits.slice_quiet_s is not None else "")
            print(f"  {waits.waited} of {waits.beside} requests sent during a batch waited > 1 ms: wait_p "
                  f"{waits.p:.2f}, up to {waits.slice_s * 1e3:.1f} ms{lengths}, after {waits.quiet_s * 1e3:.1f} ms "
                  "of quiet")
    return {"profile": profile.to_json(), "serving": {m: dataclasses.asdict(s) for m, s in serving.items()},
            "scaled": {str(k): v for k, v in scaled.items()}, "cases": cases, "capacity": capacity,
            "replays": replays, "repeat": repeat, "seconds": seconds, "replay_s": replay_s, "sender": sender_note,
            "quiet_wait": waits.law() if waits is not None else None,
            "quiet_wait_one_length_s": waits.slice_one_s if waits is not None else None}


def cores(cpu_s: float | None, window: tuple[float, float]) -> float | None:
    """Host CPU seconds over the ``perf_counter`` window they were read in: cores busy on average (None where not
    read)."""
    return None if cpu_s is None else cpu_s / (window[1] - window[0])


def host_cpu_note(measured: dict) -> str:
    """``"; the host's CPU 1.91 cores"`` for a run that read it (saved since 2026-12-05), else ``""``."""
    host = measured.get("host_cores")
    return "" if host is None else f"; the host's CPU {host:.2f} cores"


def replay_measured(session: Session, server: TritonServer, capacity: dict[str, float], load: float,
                    seconds: float) -> dict:
    """The Poisson replay at ``load`` of ``capacity`` (its seed ``load x 10``) on the real server: its figures
    (:func:`replay_figures`) and the host CPU it cost (``host_cores``: server, stubs and client, cores on average
    over the replay)."""
    seed = int(load * 10)
    schedule = poisson_schedule(capacity, load, seconds, seed)
    before, start = session.cpu_seconds(), time.perf_counter()
    real = replay_figures(server, schedule)
    after, end = session.cpu_seconds(), time.perf_counter()
    return {"seed": seed, "real": real,
            "host_cores": cores(None if before is None or after is None else after - before, (start, end))}


def replay_figures(server: TritonServer, schedule: Schedule) -> dict[str, dict]:
    """Per stream of one open-loop replay on the real server: p50, p99 (s, from the intended time) with their 95 %
    intervals, throughput (req/s) and Triton's mean time inside the server per request (s; for an ensemble Triton's
    own figure, which the simulator has no counterpart for)."""
    records = TritonTarget(server).run(schedule)
    summary, stats = summarize(records, intervals=True), records.info.server_stats or {}
    return {m: {"p50": summary["models"][m]["p50_s"], "p99": summary["models"][m]["p99_s"],
                "throughput": summary["models"][m]["throughput_rps"],
                "intervals": {k: summary["models"][m]["intervals_s"][k] for k in ("p50", "p99")},
                "server_mean": server_mean_s(stats.get(m) or {})} for m in STREAMS}


def repeatability(data: dict) -> dict[str, float] | None:
    """The largest |difference| per metric (p50, p99, throughput; relative to the first) between the replay at
    ``REPEATED_LOAD`` and the same schedule replayed again on the same server, printed per stream: the floor the
    measurement itself sets under any model's error. None for data saved before 2026-12-03 (no repeat)."""
    repeat = data.get("repeat")
    if not repeat:
        return None
    replay = data["replays"][repeat["load"]]
    first, again = replay["real"], repeat["real"]
    print(f"\n== (c) load {repeat['load']} replayed again, the same schedule: its p50 p99 throughput in % of the "
          "first's")
    diffs = {m: {k: (again[m][k] - first[m][k]) / first[m][k] for k in TARGETS} for m in STREAMS}
    for m, d in diffs.items():
        print(f"  {m:<22} " + " ".join(f"{d[k] * 100:+7.1f}" for k in TARGETS))
    return {k: max(abs(d[k]) for d in diffs.values()) for k in TARGETS}


def repeatability_line(worst: dict[str, float]) -> str:
    return ("the measurement's own repeatability (one replay twice): worst p50 "
            f"{worst['p50'] * 100:.1f} %, p99 {worst['p99'] * 100:.1f} %, throughput {worst['throughput'] * 100:.1f} %")


def fit_all(profile: Profile, train: dict[str, list[Observation]],
            laws: tuple[str, ...]) -> dict[str, dict[str, Law]]:
    """Every law of ``laws`` fitted on every training set (case -> law -> parameters). Each fit is a series of
    deterministic simulations; those of one step are spread over the machine's cores (one fit, the wait's on the
    pairs, is most of the work: spread over the fits, it ran on one core while the other idled)."""
    return {case: {law: fit(profile, "cpu", runs, law, workers=cpu_cores())[0] for law in laws}
            for case, runs in train.items()}


def evaluate(data: dict, laws: tuple[str, ...] = LAWS_COMPARED,
             law: str = DEFAULT_LAW) -> tuple[list[dict], dict, dict, dict]:
    """Fit the laws on the training runs and ``law`` on "all together", predict the held-out runs (and with the
    latter the replays) with ``law`` (the full model);
    (rows, held-out throughput and p99 error of each law, fitted laws, part (a)'s simulated throughput and requests
    per batch per k)."""
    laws = laws if law in laws else (*laws, law)
    profile = Profile.from_json(data["profile"], "solo profile")
    seconds = data["seconds"]
    scaled = {int(k): (saved_observation(v), v["real"]) for k, v in data["scaled"].items()}
    cases = {name: (saved_observation(v), v["real"]) for name, v in data["cases"].items()}
    serving = {m: serving_from_json(s) for m, s in data["serving"].items()}
    k_max = max(scaled)
    train = {"a": [obs for k, (obs, _) in scaled.items() if k != k_max],
             "b": [obs for name, (obs, _) in cases.items() if name != "all together"]}
    stage(f"fitting {len(laws)} laws on {len(train)} training sets, {law} on the replayed set's closed loop")
    fitted = fit_all(profile, train, laws)
    fitted["c"] = {law: fit(profile, "cpu", [cases["all together"][0]], law, workers=cpu_cores(),
                            measured=data.get("quiet_wait"))[0]}  # the wait measured where it was (since 2026-12-03)
    held = {f"(a) k = {k_max}": ("a", scaled[k_max][0]), "(b) all together": ("b", cases["all together"][0])}
    held_out = {case: {each: tput_error(with_law(profile, "cpu", fitted[train_set][each]), obs, seconds)
                       for each in laws} for case, (train_set, obs) in held.items()}
    held_out_p99 = {case: {each: tail_error(with_law(profile, "cpu", fitted[train_set][each]), [obs])
                           for each in laws} for case, (train_set, obs) in held.items()}
    batching = {}
    print(f"\n== (a) simulated with {law} fitted on k < {k_max}: throughput and requests per executed batch "
          "(measured in brackets)")
    for k, (obs, real) in sorted(scaled.items()):
        records = simulate(with_law(profile, "cpu", fitted["a"][law]), obs, seconds)
        ok = answered(records, seconds)
        per_batch = len(ok) / float((1.0 / ok["exec_batch"].to_numpy(dtype=float)).sum()) if len(ok) else math.nan
        batching[k] = {"throughput": throughput(records, seconds)[SCALED], "per_batch": per_batch}
        measured = real[SCALED]
        print(f"  k = {k}: {batching[k]['throughput']:.0f} req/s ({measured['throughput']:.0f}), "
              f"{per_batch:.2f} requests per batch ({measured.get('per_batch', math.nan):.2f})")
    rows: list[dict] = []
    print(f"\n== relative errors in %: full model (law {law}) p50 p99 throughput | baseline (solo profile, "
          "no interference) p50 p99 throughput   (* outside the target)")
    held_out_case("(a)", f"k = {k_max}", profile, fitted["a"][law], *scaled[k_max], seconds, rows)
    held_out_case("(b)", "all together", profile, fitted["b"][law], *cases["all together"], seconds, rows)
    config = serving_config(serving, STREAMS)
    print(f"  (c)  simulated with {law} fitted on (b)'s all-together run" +
          (" and the wait measured in (d)" if data.get("quiet_wait") else "") + ": " +
          ", ".join(f"{k} {v:.4g}" for k, v in fitted["c"][law].params().items()))
    host = {"all together": data["cases"]["all together"].get("host_cores"),
            **{f"load {load}": replay.get("host_cores") for load, replay in data["replays"].items()}}
    if any(busy is not None for busy in host.values()):  # read since 2026-12-05
        print("  (c)  the host's CPU measured (cores): " +
              ", ".join(f"{run} {busy:.2f}" for run, busy in host.items() if busy is not None))
    for load, replay in data["replays"].items():
        schedule = poisson_schedule(data["capacity"], float(load), data["replay_s"], replay["seed"])
        runs = {side: SimTarget(with_law(profile, "cpu", params), config, seed=0).run(schedule)
                for side, params in (("full", fitted["c"][law]), ("baseline", Law("none")))}
        sims = {side: summarize(records)["models"] for side, records in runs.items()}
        for m in STREAMS:
            real = replay["real"][m]
            entry = {side: {k: (s[m][f"{k}_s" if k != "throughput" else "throughput_rps"] - real[k]) / real[k]
                            for k in TARGETS} for side, s in sims.items()}
            simulated_server = runs["full"].info.sim.server_mean_s.get(m)
            if real.get("server_mean") and simulated_server is not None:  # measured since 2026-12-03
                entry["full"]["server_mean"] = (simulated_server - real["server_mean"]) / real["server_mean"]
            rows.append({"scenario": "(c)", "case": f"load {load}", "entry": m, **entry, "measured": real})
            print(line("(c)", f"load {load}", m, entry["full"], entry["baseline"]))
    for what, table in (("throughput", held_out), ("p99", held_out_p99)):
        print(f"\n== held-out {what} error of each law (mean |log error|): the form is chosen by these")
        for case, by_law in table.items():
            print(f"  {case:<18} " + "  ".join(f"{each} {err * 100:.1f} %" for each, err in by_law.items()))
    return rows, {"throughput": held_out, "p99": held_out_p99}, fitted, batching


def inside_intervals(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Per percentile, how many rows' full-model prediction lies in the measured 95 % interval (``inside``) of how
    many rows have one (``rows``; data saved before 2026-12-03 have none), and how many of those intervals have no
    upper end (``open``: too few requests to bound it)."""
    out = {}
    for k in ("p50", "p99"):
        judged = [dict(zip(("measured_low", "measured_high"), r["measured"]["intervals"][k]),
                       simulated=r["measured"][k] * (1 + r["full"][k]))
                  for r in rows if "intervals" in r["measured"] and not math.isnan(r["full"][k])]
        out[k] = {"inside": sum(bool(simulated_inside(j)) for j in judged), "rows": len(judged),
                  "open": sum(j["measured_high"] is None for j in judged)}
    return out


def inside_line(inside: dict[str, dict[str, int]]) -> str:
    return "full model inside the measured 95 % interval: " + ", ".join(
        f"{k} {c['inside']} of {c['rows']} rows ({c['open']} with no upper end)" for k, c in inside.items())


def worst_errors(rows: list[dict]) -> dict[str, dict[str, float]]:
    """The largest |error| of each metric over the rows, of the full model and of the baseline."""
    return {side: {k: max(abs(r[side][k]) for r in rows if not math.isnan(r[side][k])) for k in TARGETS}
            for side in ("full", "baseline")}


def worst_line(worst: dict[str, dict[str, float]]) -> str:
    full, base = worst["full"], worst["baseline"]
    return (f"worst error: p50 {full['p50'] * 100:.1f} %, p99 {full['p99'] * 100:.1f} %, throughput "
            f"{full['throughput'] * 100:.1f} % (baseline: p50 {base['p50'] * 100:.1f} %, p99 {base['p99'] * 100:.1f} "
            f"%, throughput {base['throughput'] * 100:.1f} %)")


def spread(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """``median (min..max)`` of ``values`` times ``scale`` (:class:`Spread`'s text)."""
    return Spread.of([v * scale for v in values]).text(digits)


def sessions(paths: list[str], laws: tuple[str, ...], law: str = DEFAULT_LAW) -> dict:
    """Evaluate the measurements of several sessions (saved ``_data`` files) one by one and print, over those
    measured on an undisturbed machine (hypervisor steal, where recorded, within ``DISTURBED_SHARE``), the median
    and range of each law's held-out errors, of the measured and simulated requests per batch of part (a), and of
    the worst errors: whether a form or a mechanism wins across sessions or in one. Returns what it printed."""
    runs, skipped = {}, {}
    for path in paths:
        data = read_json(path, "saved measurements")
        if data.get("steal_share", 0.0) > DISTURBED_SHARE:
            skipped[path] = data["steal_share"]
            continue
        print(f"\n######## {Path(path).name}")
        rows, held_out, _, batching = evaluate(data, laws, law)
        runs[path] = {"worst": worst_errors(rows), "held_out": held_out, "a_simulated": batching,
                      "a_measured": {int(k): v["real"][SCALED].get("per_batch", math.nan)
                                     for k, v in data["scaled"].items()}}
    if not runs:
        raise SystemExit("colocation_fidelity: every --data file was measured on a disturbed machine")
    print(f"\n== over {len(runs)} sessions' measurements: median (min..max)"
          + "".join(f"; left out, {Path(p).name}: {s:.1%} steal" for p, s in skipped.items()))
    first = next(iter(runs.values()))
    for what in ("throughput", "p99"):
        print(f"  held-out {what} error (mean |log error|, %):")
        for case in first["held_out"][what]:
            print(f"    {case:<18} " + "  ".join(
                f"{law} {spread([r['held_out'][what][case][law] for r in runs.values()])}" for law in laws))
    print(f"  (a) requests per executed batch, measured | simulated with {law}:")
    for k in sorted(first["a_measured"]):
        print(f"    k = {k}: {spread([r['a_measured'][k] for r in runs.values()], 1.0, 2)} | "
              f"{spread([r['a_simulated'][k]['per_batch'] for r in runs.values()], 1.0, 2)}")
    for side in ("full", "baseline"):
        print(f"  worst |error| of the {side} model (%): " + ", ".join(
            f"{k} {spread([r['worst'][side][k] for r in runs.values()])}" for k in TARGETS))
    median = {side: {k: Spread.of([r["worst"][side][k] for r in runs.values()]).median for k in TARGETS}
              for side in ("full", "baseline")}
    return {"sessions": runs, "skipped": skipped, "worst": median}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (under 5 minutes); with --data: the "
                                                             "quick run's laws only")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    parser.add_argument("--data", nargs="+", help="evaluate the measurements saved by earlier runs (their _data "
                                                  "JSON) instead of measuring again; with several, also their "
                                                  "medians over the sessions")
    parser.add_argument("--law", choices=FORMS, default=DEFAULT_LAW,
                        help=f"the full model's law, fitted beside the compared ones (default {DEFAULT_LAW})")
    parser.add_argument("--laws", nargs="+", choices=FORMS, help="the forms whose held-out errors are compared "
                                                                 "(default: every form; with --quick a few)")
    args = parser.parse_args()
    laws = tuple(args.laws) if args.laws else LAWS_QUICK if args.quick else LAWS_COMPARED
    if args.data and len(args.data) > 1:
        summary = sessions(args.data, laws, args.law)
        path = write_result("colocation_fidelity_sessions", {**summary, "law": args.law, "data": args.data},
                            quick=args.quick, out_dir=args.out, timed=False)
        print(f"results: {path}")
        print("the last line: the median over the sessions of each one's worst errors")
        print(worst_line(summary["worst"]))
        return 0
    if args.data:
        data_path = args.data[0]
        data = read_json(data_path, "saved measurements")
    else:
        data = measure(args.quick)
        data_path = str(write_result("colocation_fidelity_data", data, quick=args.quick, out_dir=args.out,
                                     compressed=True))
        print(f"measurements: {data_path}")
    rows, held_out, fitted, batching = evaluate(data, laws, args.law)
    worst, inside, repeat = worst_errors(rows), inside_intervals(rows), repeatability(data)
    print(inside_line(inside))
    if repeat:
        print(repeatability_line(repeat))
    path = write_result("colocation_fidelity", {"rows": rows, "held_out_by_law": held_out, "law": args.law,
                                                "inside_interval": inside, "repeatability": repeat,
                                                "a_simulated": batching, "worst": worst,
                                                "fitted": {case: {each: law.to_json() for each, law in by_law.items()}
                                                           for case, by_law in fitted.items()},
                                                "data": data_path},
                        quick=args.quick, out_dir=args.out, timed=not args.data,
                        same_suffix_as=None if args.data else Path(data_path))
    print(f"results: {path}")
    print(worst_line(worst))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except InputError as err:  # a saved measurement that cannot be read: one line, exit 2
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
