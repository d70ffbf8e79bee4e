"""Batching fidelity: the simulator's closed loops of one model with dynamic batching, from one instance to four and
from one client to 32, against the embedded Triton (CPU), beside a baseline in the same run.

The concurrency sweep is what perf_analyzer and Model Analyzer users read first, and the tuner's picks live where
it batches most. ``tiny_cnn_onnxruntime`` (max batch 32) is profiled as ``serving-bench profile`` does by default
(the sharing law fitted to its own calibration runs: 2 instances, 2, 4 and 16 clients); then each serving
configuration of :data:`CONFIGS` (instances, max batch size; threads per instance as the server gives them,
cores // instances) is measured in closed loops of one-row requests at every count of :data:`CLIENTS` — twice,
interleaved — and simulated from the profile. Every row but those of the calibration's instances and clients is held
out.

Per row: the relative p50, p99 and throughput error of the simulation (median of the two measurements as the
reference), of the baseline (the same profile with no interference, law ``none``), and the two measurements'
own difference in throughput (what the measurement can resolve). Measured requests per executed batch and host CPU
per request are printed beside the simulated batch. The last line: the worst and mean |error| of each metric.

    .venv/bin/python benchmarks/batching_fidelity.py [--quick] [--out DIR] [--data SAVED.json.xz]

The measurements (profile and runs) are saved first (``batching_fidelity_data[_quick]_<date>_<host>.json.xz``);
``--data`` evaluates saved measurements again without a server (the law refitted in another form: ``--law``; on
some of the calibration runs: ``--calibration-clients``). About 5 minutes, 3 with ``--quick``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving_bench.errors import InputError  # noqa: E402
from serving_bench.export.api import export_models, settle_after_export  # noqa: E402
from serving_bench.export.frameworks import ExportOptions  # noqa: E402
from serving_bench.files import read_json  # noqa: E402
from serving_bench.peers.report import write_result  # noqa: E402
from serving_bench.calibrate.measure import measure_profile  # noqa: E402
from serving_bench.calibrate.plan import DEFAULT_LAW, MeasureConfig  # noqa: E402
from serving_bench.calibrate.runs import LoopRun  # noqa: E402
from serving_bench.profiles.law import Law  # noqa: E402
from serving_bench.profiles.schema import Profile  # noqa: E402
from serving_bench.calibrate.session import Session  # noqa: E402
from serving_bench.run.metrics import summarize  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.run.target import ClosedLoop  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402
from serving_bench.serving_config import ServingConfig  # noqa: E402
from serving_bench.sim.interference import FORMS, Observation, fit, serving_from_json, with_law  # noqa: E402
from serving_bench.sim.target import SimTarget  # noqa: E402
from serving_bench.tune.verify import write_tuned_repo  # noqa: E402

MODEL = "tiny_cnn_onnxruntime"
MAX_BATCH = 32
CONFIGS = ((1, 32), (2, 16), (4, 8))  # (instances, max_batch_size): what a tuner weighs on 2 cores
CLIENTS = (1, 2, 4, 8, 16, 32)
REPEATS = 2
METRICS = ("p50", "p99", "throughput")
STARTED = time.perf_counter()


def stage(title: str) -> None:
    print(f"== {title} [{time.perf_counter() - STARTED:.0f} s]", flush=True)


def simulated(profile: Profile, config: ServingConfig, clients: int, seconds: float) -> dict:
    """p50, p99 (s, send to answer), throughput (req/s) and requests per executed batch of a simulated closed loop of
    ``clients`` one-row clients for ``seconds``, as :func:`measured` reads a real one."""
    schedule = Schedule.closed_loop({MODEL: 1}, 400_000, {"duration_s": seconds})
    out = summarize(SimTarget(profile, config, seed=1).run(schedule, ClosedLoop(clients, seconds)))
    return {"p50": out["overall"]["service_p50_s"], "p99": out["overall"]["service_p99_s"],
            "throughput": out["overall"]["throughput_ips"], "per_batch": out["models"][MODEL]["mean_exec_batch"]}


def measured(run: LoopRun, seconds: float) -> dict:
    """A real closed loop's p50, p99 (s), throughput (req/s), requests per executed batch and host CPU per request
    (us: server, runners and client)."""
    latency = run.latency[MODEL]
    executed = len(run.executions[MODEL]) if run.executions else 0
    return {"p50": float(np.percentile(latency, 50)), "p99": float(np.percentile(latency, 99)),
            "throughput": len(latency) / seconds, "per_batch": len(latency) / executed if executed else None,
            "cpu_us": run.cpu_s / len(latency) * 1e6 if run.cpu_s is not None else None}


def measure(quick: bool) -> dict:
    """The profile and every configuration's measured closed loops, as plain data (see :func:`evaluate`)."""
    seconds = 1.0 if quick else 2.0  # the profile's runs and each closed loop
    with tempfile.TemporaryDirectory(prefix="batching-fidelity-") as tmp:
        repo = Path(tmp) / "repo"
        stage("export")
        export_models(["tiny_cnn"], ["onnxruntime"], repo, options=ExportOptions(max_batch_size=MAX_BATCH))
        settle_after_export(time.perf_counter(), print)
        stage("profile (serving-bench profile's defaults)")
        profile = measure_profile(repo, [MODEL], config=MeasureConfig(seconds=seconds),
                                  log=lambda line: print("  " + line, flush=True))
        runs = []
        base = ServingConfig.from_repo(repo, [MODEL]).models[0]
        for instances, max_batch in CONFIGS:
            stage(f"measure: {instances} instance(s), max batch {max_batch}")
            serving = base.replace(instances=(("cpu", instances),), max_batch_size=max_batch)
            served = write_tuned_repo(repo, ServingConfig((serving,)), Path(tmp) / f"repo_{instances}_{max_batch}")
            with TritonServer(served, models=[MODEL], execution_log=True) as server:
                session = Session(server.endpoints, server)
                session.run({MODEL: (1, 1)}, seconds / 2)  # warm-up
                figures = {c: [] for c in CLIENTS}
                for _ in range(REPEATS):  # interleaved: a drift of the machine falls on every level alike
                    for c in CLIENTS:
                        figures[c].append(measured(session.run({MODEL: (1, c)}, seconds), seconds))
            for c in CLIENTS:
                runs.append({"instances": instances, "max_batch": max_batch, "clients": c,
                             "serving": dataclasses.asdict(serving), "measured": figures[c]})
                rps = [m["throughput"] for m in figures[c]]
                print(f"  {c:>2} clients: " + ", ".join(f"{r:,.0f}" for r in rps) + " req/s", flush=True)
    return {"model": MODEL, "quick": quick, "seconds": seconds, "profile": profile.to_json(), "runs": runs}


def evaluate(data: dict, law: str | None, clients: tuple[int, ...] = ()) -> dict:
    """Simulate every saved run from the saved profile and from the baseline; print the rows and return them with
    the worst and mean errors. ``law`` or ``clients``: the profile's law refitted first (in the form ``law``, else its
    own) on its calibration runs (those of ``clients`` clients only, where given)."""
    profile = Profile.from_json(data["profile"], "saved profile")
    if law is not None or clients:
        law = law or DEFAULT_LAW
        observations = [o for o in map(Observation.from_json, profile.calibration)
                        if not clients or o.clients.get(MODEL) in clients]
        fitted, err = fit(profile, "cpu", observations, law)
        profile = with_law(profile, "cpu", fitted)
        print(f"law {law} refitted on {len(observations)} of the profile's calibration runs "
              f"({', '.join(o.label() for o in observations)}): mean error {err * 100:.1f} %")
    print(f"law: {profile.devices['cpu'].sharing.to_json()}")
    baseline = with_law(profile, "cpu", Law("none"))
    # the calibration's instances and clients (there with the profile's threads and max batch): not held out
    calibrated = {(o.instances[MODEL], o.clients.get(MODEL)) for o in map(Observation.from_json, profile.calibration)}
    seconds = data["seconds"]
    print(f"{'inst':>4} {'batch':>5} {'clients':>7} | {'measured req/s':>14} {'repeat':>7} {'n':>5} "
          f"{'cpu us':>6} | {'p50 %':>7} {'p99 %':>7} {'tput %':>7} {'sim n':>5} | baseline p50 / p99 / tput %")
    rows = []
    for run in data["runs"]:
        serving = serving_from_json(run["serving"])
        config = ServingConfig((serving,))
        real = {k: statistics.median(m[k] for m in run["measured"]) for k in METRICS}
        rps = [m["throughput"] for m in run["measured"]]
        per_batch = statistics.median(m["per_batch"] or math.nan for m in run["measured"])
        cpu_us = statistics.median(m["cpu_us"] or math.nan for m in run["measured"])
        sim = simulated(profile, config, run["clients"], seconds)
        base = simulated(baseline, config, run["clients"], seconds)
        full = {k: sim[k] / real[k] - 1 for k in METRICS}
        naive = {k: base[k] / real[k] - 1 for k in METRICS}
        row = {"instances": run["instances"], "max_batch": run["max_batch"], "clients": run["clients"],
               "measured": real, "repeat": (max(rps) - min(rps)) / real["throughput"], "per_batch": per_batch,
               "cpu_us": cpu_us, "simulated": sim, "full": full, "baseline": naive,
               "held_out": (run["instances"], run["clients"]) not in calibrated}
        rows.append(row)
        print(f"{run['instances']:>4} {run['max_batch']:>5} {run['clients']:>7} | {real['throughput']:>14,.0f} "
              f"{row['repeat'] * 100:>6.1f}% {per_batch:>5.1f} {cpu_us:>6.0f} | " +
              " ".join(f"{full[k] * 100:>+7.1f}" for k in METRICS) + f" {sim['per_batch'] or math.nan:>5.1f} | " +
              " / ".join(f"{naive[k] * 100:+.1f}" for k in METRICS) +
              ("" if row["held_out"] else "  (as calibrated)"),
              flush=True)
    held = [r for r in rows if r["held_out"]]
    summary = {side: {k: {"worst": max(abs(r[side][k]) for r in held),
                          "mean": statistics.mean(abs(r[side][k]) for r in held)} for k in METRICS}
               for side in ("full", "baseline")}
    return {"rows": rows, "law": profile.devices["cpu"].sharing.to_json(), "summary": summary}


def summary_line(summary: dict) -> str:
    def side(name: str) -> str:
        return ", ".join(f"{k} {summary[name][k]['worst'] * 100:.1f} % (mean {summary[name][k]['mean'] * 100:.1f})"
                         for k in METRICS)
    return f"held-out worst error: {side('full')} (baseline: {side('baseline')})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (about 3 minutes)")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    parser.add_argument("--data", help="evaluate measurements saved by an earlier run instead of measuring again")
    parser.add_argument("--law", choices=FORMS, help="refit the profile's law in this form on its calibration runs "
                                                     f"(default: the profile's own, {DEFAULT_LAW} on a CPU host)")
    parser.add_argument("--calibration-clients", nargs="+", type=int, default=(),
                        help="refit the law on the profile's calibration runs of these client counts only")
    args = parser.parse_args()
    if args.data:
        data_path, data = args.data, read_json(args.data, "saved measurements")
    else:
        data = measure(args.quick)
        data_path = str(write_result("batching_fidelity_data", data, quick=args.quick, out_dir=args.out,
                                     compressed=True))
        print(f"measurements: {data_path}")
    stage("simulate")
    result = evaluate(data, args.law, tuple(args.calibration_clients))
    path = write_result("batching_fidelity", {**result, "data": data_path, "refitted_law": args.law,
                                              "calibration_clients": list(args.calibration_clients)},
                        quick=data["quick"], out_dir=args.out, timed=not args.data,
                        same_suffix_as=None if args.data else Path(data_path))
    print(f"results: {path}")
    print(summary_line(result["summary"]))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except InputError as err:  # saved measurements that cannot be read: one line, exit 2
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
