"""Simulator fidelity: relative error of the simulator against real replays of the sleep model, FIFO and dynamic
batching, single and co-located models, at loads up to 0.9 of capacity. For each scenario a profile is measured
first on the real server (``calibrate.measure``: server-side service times, overhead, gap between batches,
per-request cost, co-location and pair curves); each load is then one ``validate`` run (same schedule on Triton and
in the simulator). Figures: p50, p90, p99, throughput and mean-batch errors per model, against the issue's targets
(|p50| <= 5 %, |p99| <= 10 %, |throughput| <= 3 %). Load is the offered rate over the capacity of one instance at
batch 1 *as measured in the profile* (service time plus gap between batches: on a busy 2-core machine the 6 ms sleep
takes ~7 ms on the server), split evenly between co-located models.

    .venv/bin/python benchmarks/sim_fidelity.py [--quick] [--out benchmarks/results/sim_fidelity_<date>_<host>.json]

On a shared machine the errors mix model error with the machine changing speed between profiling and replay: the
``utilisation`` row (Triton's compute time during the replay against the simulator's) shows that drift, and the
``send lateness`` row shows how late the load generator itself sent requests. The summary's last two columns
separate the two: the same schedule simulated again with each model's service times scaled by the replay's own
measured/simulated busy time (the machine's speed during the replay, which no profile measured earlier can know);
what remains there is the queueing model's error. A diagnosis only: the headline errors are the first columns.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from dataclasses import replace
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving_bench.export.sleep import write_sleep_entry  # noqa: E402
from serving_bench.load.profile import LoadProfile, build_schedule  # noqa: E402
from serving_bench.calibrate.measure import measure_profile  # noqa: E402
from serving_bench.calibrate.plan import MeasureConfig  # noqa: E402
from serving_bench.profiles.distributions import Dist  # noqa: E402
from serving_bench.profiles.schema import Profile  # noqa: E402
from serving_bench.run.metrics import summarize  # noqa: E402
from serving_bench.serving_config import ServingConfig  # noqa: E402
from serving_bench.sim.target import SimTarget  # noqa: E402
from serving_bench.validate import format_table, run_validation  # noqa: E402

# (name, entries: name -> (max_batch_size, queue delay us, instances))
SCENARIOS = [
    ("fifo_single", {"sleep_a": (1, 0, 1)}),
    ("dynbatch_single", {"sleep_a": (8, 1000, 1)}),
    ("colocated", {"sleep_a": (8, 0, 1), "sleep_b": (8, 500, 1)}),
]
TARGETS = {"p50": 0.05, "p99": 0.10, "throughput": 0.03}


def at_replay_speed(profile: Profile, rows: list[dict], yaml: Path, repo: Path, val_dir: Path) -> dict[str, dict]:
    """p50/p99 errors of the simulator when each model's service times are scaled by the replay's measured /
    simulated utilisation (the machine's speed during the replay), per model: ``{model: {factor, p50, p99}}``."""
    util = {r["model"]: r for r in rows if r["metric"] == "utilisation"}
    factors = {m: r["measured"] / r["simulated"] for m, r in util.items() if r["measured"] and r["simulated"]}
    models = dict(profile.models)
    for m, f in factors.items():
        devices = {d: replace(md, batches={b: Dist(dist.q, tuple(x * f for x in dist.s))
                                            for b, dist in md.batches.items()})
                   for d, md in models[m].devices.items()}
        models[m] = replace(models[m], devices=devices)
    schedule = build_schedule(LoadProfile.load(yaml))
    config = ServingConfig.from_repo(repo, list(schedule.models))
    sim = summarize(SimTarget(replace(profile, models=models), config, seed=0).run(schedule))["models"]
    real = json.loads((val_dir / "real" / "summary.json").read_text())["models"]
    return {m: {"factor": factors.get(m), **{k: (sim[m][f"{k}_s"] - real[m][f"{k}_s"]) / real[m][f"{k}_s"]
                                             for k in ("p50", "p99")}} for m in real}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs, loads 0.5 and 0.9 only")
    parser.add_argument("--out")
    parser.add_argument("--scenarios", help="comma-separated subset of " + ", ".join(s[0] for s in SCENARIOS))
    args = parser.parse_args()
    seconds = 8 if args.quick else 30
    loads = (0.5, 0.9) if args.quick else (0.3, 0.5, 0.7, 0.9)
    wanted = set(args.scenarios.split(",")) if args.scenarios else None
    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, entries in SCENARIOS:
            if wanted and name not in wanted:
                continue
            repo = tmp / name / "repo"
            for entry, (maxb, delay, inst) in entries.items():
                write_sleep_entry(repo, entry, base_ms=5.0, per_item_ms=1.0, max_batch_size=maxb,
                                  max_queue_delay_us=delay, instances=inst)
            profile = tmp / name / "p.json"
            measure_profile(repo, list(entries), profile, MeasureConfig(seconds=1.0 if args.quick else 2.0,
                                                                        rounds=2 if args.quick else 3,
                                                                        colocation=(1, 2)), log=print)
            measured = Profile.load(profile)
            capacity = {}
            for e, (_, _, inst) in entries.items():
                md = measured.models[e].devices["cpu"]
                capacity[e] = inst / (md.batches[1].mean + md.batch_gap_s)
            for load in loads:
                models = "\n".join(f"  {e}: {{rate: {load * capacity[e] / len(entries):.1f}}}" for e in entries)
                yaml = tmp / name / f"load_{load}.yaml"
                yaml.write_text(f"name: {name}\nduration: {seconds}s\nwarmup: 1s\nseed: 1\nmodels:\n{models}\n")
                val_dir = tmp / name / f"val_{load}"
                rows = run_validation(yaml, repo, profile, val_dir)
                speed = at_replay_speed(measured, rows, yaml, repo, val_dir)
                print(f"== {name} at load {load}")
                print(format_table(rows))
                print("at the replay's speed: " + "; ".join(
                    f"{m}: service x {v['factor']:.3f}, p50 {v['p50'] * 100:+.1f} %, p99 {v['p99'] * 100:+.1f} %"
                    for m, v in speed.items()))
                results.append({"scenario": name, "load": load, "rows": rows, "at_replay_speed": speed})
    print("\n== summary: relative errors (target |p50| <= 5 %, |p99| <= 10 %, |throughput| <= 3 %)")
    print(f"{'scenario':<16} {'load':>5} {'model':<8} {'p50':>8} {'p99':>8} {'tput':>8} {'batch':>8} {'util':>8}"
          f" | {'p50@spd':>8} {'p99@spd':>8}")
    for res in results:
        by = {}
        for row in res["rows"]:
            by.setdefault(row["model"], {})[row["metric"]] = row["rel_error"]
        for model, errs in by.items():
            cells = []
            for metric in ("p50", "p99", "throughput", "mean batch", "utilisation"):
                e = errs.get(metric)
                mark = "*" if metric in TARGETS and e is not None and abs(e) > TARGETS[metric] else " "
                cells.append(f"{e * 100:+7.1f}{mark}" if e is not None else f"{'-':>8}")
            speed = res["at_replay_speed"].get(model, {})
            cells.append("|")
            cells += [f"{speed[k] * 100:+8.1f}" if speed.get(k) is not None else f"{'-':>8}" for k in ("p50", "p99")]
            print(f"{res['scenario']:<16} {res['load']:>5} {model:<8} " + " ".join(cells))
    print("(* outside the target; @spd: simulated with the service times scaled to the replay's measured busy time, "
          "the machine's drift removed: a diagnosis, not the result)")
    if args.out:
        Path(args.out).write_text(json.dumps({"date": date.today().isoformat(), "host": socket.gethostname(),
                                              "cores": os.cpu_count(), "loadavg_before": load_before,
                                              "loadavg_after": os.getloadavg(), "quick": args.quick,
                                              "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
