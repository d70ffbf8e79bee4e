"""serving-bench tune vs Triton Model Analyzer 1.58 on the same model, server and p99 budget.

    .venv/bin/python benchmarks/vs_model_analyzer.py [--quick] [--trials 3] [--model sleep_python] [--p99-ms 30]

Setup (once): Model Analyzer pins packages that conflict with ours (optuna 3.x, ...), so it is installed into
``.venv-peers/`` (gitignored) with ``triton-model-analyzer==1.58.0``, ``tritonclient[all]==2.50.0`` (the real
perf_analyzer binary) and ``nvidia-cuda-runtime-cu12`` (its ``libcudart.so.12``); perf_analyzer also needs Debian's
``libb64-0d``.

Both tools see the same thing: the runtime view of one repository entry served by the same bundled tritonserver
(``find_tritonserver()``: same binary, backend folder, LD_LIBRARY_PATH and PATH). Model Analyzer runs in local mode
with its brute-force search over instance count x max_batch_size (dynamic batching) x concurrency, constraint
``perf_latency_p99 <= budget``, objective throughput. serving-bench measures a simulator profile on that server,
then tunes on the simulator (capacity under the same p99 budget). Each tool's winning configuration is then
measured the same way: perf_analyzer 2.50 (``serving_bench.peers.perf_analyzer``) in concurrency mode (1, 2, 4, ...
32; up to 8 with ``--quick``; stable when three windows agree within 20 % on throughput and average latency) against
a server of that configuration (one per pick, up for all its trials); its throughput is the highest one whose p99
is within the budget. A level where perf_analyzer finds no stable window is recorded as unstable and the sweep goes
on; if Model Analyzer itself exits with an error, whatever results it exported are used, and without any its side
is reported as failed (no ratio) while serving-bench's is still measured. Wall time counts each tool's whole search
(serving-bench: profile + tune).

serving-bench's pick is also measured by the same sweep through serving-bench's own closed loop (one sender
process, in the same interleaved trials) and simulated by it on the profile (the same levels, windows and criterion):
the simulator's error is printed against both measurements, with each client's CPU (cores) at its best level. The
profile is measured through serving-bench's sender, so on a host where the client shares the cores the simulator
models that client; perf_analyzer's costs more CPU per request, so it measures less on a CPU-bound model. So the
sweep is simulated once more through perf_analyzer's client (``sim.client.through_client``): at each level, the CPU
per request perf_analyzer spent on *Model Analyzer's* pick (not the run it predicts) less what serving-bench's sender
spent on ours, the medians over the trials; that figure is the one to hold against perf_analyzer's measurement.

Each search runs once (Model Analyzer's takes 15 minutes in full); the measurement of the two picks is repeated
``--trials`` times (default 3), interleaved (Model Analyzer's, ours; ours, Model Analyzer's; ...), and the throughput
ratio is printed last as the median with its range over the trials. A measurement of Model Analyzer's pick below
half of what Model Analyzer itself measured for it during its search is not noise: it is reported as unreliable and
gives no ratio. ``--quick`` shrinks the search space of both tools alike (up to 2 instances, max_batch_size 4,
concurrency 8) and the measurement windows (1 s; 2 s in full): both tools still choose from one space and are
measured one way, so the quick and the full throughput ratio agree within 15 % when both find the best
configuration of their space. About 5 minutes with ``--quick``, 25 in full.

Prints a table and writes ``benchmarks/results/vs_model_analyzer[_quick]_<date>_<host>.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving_bench.peers.report import compare, figure, interleave, ratio_line, write_result  # noqa: E402  (first)
from serving_bench.load.native import choose_sender  # noqa: E402
from serving_bench.peers.perf_analyzer import (Level, PeerMissing, Unstable, Windows,  # noqa: E402
                                           find_perf_analyzer)
from serving_bench.run.metrics import summarize  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.run.target import ClosedLoop  # noqa: E402

PEERS = ROOT / ".venv-peers"
PEER_PACKAGES = ["triton-model-analyzer==1.58.0", "tritonclient[all]==2.50.0", "nvidia-cuda-runtime-cu12"]
# the search space of both tools and the measurement of their picks, --quick and full
SPACE = {True: {"instances": (1, 2), "batch_sizes": (1, 2, 4), "concurrency": (1, 2, 4, 8), "measurement_s": 1.0},
         False: {"instances": (1, 2, 3, 4), "batch_sizes": (1, 2, 4, 8, 16, 32), "concurrency": (1, 2, 4, 8, 16, 32),
                 "measurement_s": 2.0}}
PA_STABILITY_PCT, PA_MAX_TRIALS = 20.0, 6
OWN_SENDER = "serving_bench_sender"  # serving-bench's pick measured through serving-bench's own closed loop
IMPLAUSIBLE_SHORTFALL = 0.5  # a pick measured below half of what its own search measured for it is not noise


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def setup_peers() -> Path:
    """The peers venv with Model Analyzer and perf_analyzer (installed on first use)."""
    ma = PEERS / "bin" / "model-analyzer"
    if not ma.exists():
        log(f"installing Model Analyzer 1.58 into {PEERS} (once)")
        subprocess.run([sys.executable, "-m", "venv", str(PEERS)], check=True)
        subprocess.run([str(PEERS / "bin" / "pip"), "install", "-q", *PEER_PACKAGES], check=True)
    if not Path("/usr/lib/x86_64-linux-gnu/libb64.so.0d").exists():
        log("perf_analyzer needs Debian's libb64-0d: apt-get install -y libb64-0d")
    return PEERS


def peer_env(base: dict) -> dict:
    """``base`` plus the CUDA runtime library perf_analyzer links against (no GPU is used)."""
    env = dict(base)
    libs = list(PEERS.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(p) for p in libs] + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    return env


def make_repo(model: str, dest: Path) -> Path:
    """A repository holding ``model`` (the sleep entry, or a zoo model exported through serving-bench export)."""
    from serving_bench.export.api import export_models, settle_after_export
    from serving_bench.export.frameworks import ExportOptions

    name, _, framework = model.rpartition("_")
    if model == "sleep_python":
        export_models(["sleep"], [], dest,
                      options=ExportOptions(max_batch_size=32, sleep_base_ms=4.0, sleep_per_item_ms=0.5))
    else:
        export_models([name], [framework], dest, options=ExportOptions(max_batch_size=32))
    settle_after_export(time.perf_counter(), log)
    return dest


# -- Model Analyzer ------------------------------------------------------------------------------------------------
def run_model_analyzer(view: Path, model: str, p99_ms: float, work: Path, quick: bool) -> dict:
    """Model Analyzer's brute-force search in local mode; returns its best config and wall time."""
    import yaml

    from serving_bench.serve.ports import free_ports
    from serving_bench.serve.install import find_tritonserver

    install = find_tritonserver()
    http, grpc, metrics = free_ports(3)
    env = install.env
    config = {
        "model_repository": str(view),
        "profile_models": {model: {"cpu_only": True}},
        "triton_launch_mode": "local",
        "triton_server_path": str(install.server_bin),
        "triton_server_flags": {"backend-directory": str(install.backend_dir), "http-address": "127.0.0.1",
                                "grpc-address": "127.0.0.1", "metrics-address": "127.0.0.1", "http-port": http,
                                "grpc-port": grpc, "metrics-port": metrics},
        # Model Analyzer also hands this environment to perf_analyzer, so it carries libcudart's folder as well
        "triton_server_environment": {"LD_LIBRARY_PATH": peer_env(env)["LD_LIBRARY_PATH"], "PATH": env["PATH"],
                                      "PYTHONPATH": env.get("PYTHONPATH", "")},
        "triton_http_endpoint": f"127.0.0.1:{http}", "triton_grpc_endpoint": f"127.0.0.1:{grpc}",
        "triton_metrics_url": f"http://127.0.0.1:{metrics}/metrics",
        "perf_analyzer_path": str(PEERS / "bin" / "perf_analyzer"),
        "client_protocol": "grpc",
        "output_model_repository_path": str(work / "ma_output_repo"),
        "override_output_model_repository": True,
        "export_path": str(work / "ma_export"),
        "checkpoint_directory": str(work / "ma_checkpoints"),
        "run_config_search_mode": "brute",
        "run_config_search_max_instance_count": max(SPACE[quick]["instances"]),
        "run_config_search_max_concurrency": max(SPACE[quick]["concurrency"]),
        "run_config_search_max_model_batch_size": max(SPACE[quick]["batch_sizes"]),
        "constraints": {"perf_latency_p99": {"max": p99_ms}},
        "objectives": ["perf_throughput"],
        "skip_summary_reports": False,  # the summary tables hold metrics-model-inference.csv
        "num_configs_per_model": 3,
    }
    config = {k: v for k, v in config.items() if v is not None}
    (work / "ma_export").mkdir(parents=True, exist_ok=True)
    path = work / "ma_config.yaml"
    path.write_text(yaml.safe_dump(config))
    log(f"Model Analyzer: profiling {model} (local mode, brute force) — this is the slow part")
    t0 = time.perf_counter()
    proc = subprocess.run([str(PEERS / "bin" / "model-analyzer"), "profile", "-f", str(path)],
                          env=peer_env(os.environ), cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (work / "ma_stdout.log").write_text(proc.stdout + "\n" + proc.stderr)
    out: dict = {"wall_s": wall, "measurements": 0, "best": None, "config_path": None}
    if proc.returncode != 0:  # whatever it exported before failing still counts
        tail = " | ".join((proc.stdout + proc.stderr).splitlines()[-6:])
        out["error"] = f"model-analyzer exited {proc.returncode}: {tail}"
        log(f"Model Analyzer failed after {wall:.0f} s: {out['error']}")
    try:
        rows = read_ma_results(work / "ma_export")
    except RuntimeError as err:
        out.setdefault("error", str(err))
        return out
    ok = [r for r in rows if r["p99_ms"] <= p99_ms]
    out["measurements"] = len(rows)
    if not ok:
        out.setdefault("error", f"Model Analyzer found no configuration within p99 {p99_ms} ms")
        return out
    best = max(ok, key=lambda r: r["throughput"])
    log(f"Model Analyzer: {len(rows)} measurements in {wall:.0f} s; best {best['config_name']} "
        f"{best['throughput']:.0f} infer/s at concurrency {best['concurrency']}, p99 {best['p99_ms']:.1f} ms")
    return {**out, "best": best, "config_path": str(work / "ma_output_repo" / best["config_name"] / "config.pbtxt")}


def read_ma_results(export: Path) -> list[dict]:
    """Rows of Model Analyzer's ``metrics-model-inference.csv`` (one per config x concurrency)."""
    files = list(export.rglob("metrics-model-inference.csv"))
    if not files:
        raise RuntimeError(f"no metrics-model-inference.csv under {export}")
    out = []
    with open(files[0]) as fh:
        for row in csv.DictReader(fh):
            keys = {k.lower(): k for k in row}

            def get(*names):
                for n in names:
                    for lk, k in keys.items():
                        if n in lk:
                            return row[k]
                return None

            out.append({"config_name": get("model config path", "model config"), "concurrency": int(float(
                get("concurrency") or 0)), "throughput": float(get("throughput") or 0),
                "p99_ms": float(get("p99 latency") or 1e9)})
    return out


# -- serving-bench ---------------------------------------------------------------------------------------------------
def run_serving_bench(repo: Path, model: str, p99_ms: float, work: Path, quick: bool) -> dict:
    """Profile on the same server, then tune on the simulator under the same p99 budget."""
    from serving_bench.tune import adapters
    from serving_bench.tune.run import TuneOptions, run_tune

    load = work / "sb_load.yaml"
    # capacity is searched as a multiple of this load, up to max_scale below: 100 req/s x 128 = 12,800 req/s, above
    # what 2 cores can serve (a ceiling the winners reach would make them tie, and the tie goes to fewer instances)
    load.write_text(f"name: vs_model_analyzer\nduration: 5s\nseed: 1\nwarmup: 0.5s\n"
                    f"models:\n  {model}: {{rate: 100, slo: {{p99: {p99_ms}ms}}}}\n")
    t0 = time.perf_counter()
    log("serving-bench: profiling on the embedded tritonserver")
    # only what the search below can use: batch sizes up to its largest max_batch_size, co-location up to its
    # largest instance count
    batches, instances = SPACE[quick]["batch_sizes"], SPACE[quick]["instances"]
    adapters.measure_profile(repo, [model], work / "sb_profile.json", batch_sizes=batches,
                             colocation=instances, pairs=False, seconds=1.0 if quick else 2.0,
                             log=lambda line: log("  " + line))
    t_profile = time.perf_counter() - t0
    log("serving-bench: tuning on the simulator")
    doc = run_tune(TuneOptions(load=str(load), profile=str(work / "sb_profile.json"), out=str(work / "sb_tune"),
                               repo=str(repo), instances=instances, max_batch_sizes=batches,
                               queue_delays_us=(0, 500, 2000), max_scale=128.0, verify_top=0, report=False,
                               quiet=True, workers=0))  # every core, as Model Analyzer's runs use them; same result
    wall = time.perf_counter() - t0
    best = doc["best"]
    capped = " (the search ceiling)" if best["result"]["capacity_capped"] else ""
    log(f"serving-bench: profile {t_profile:.0f} s + tune {wall - t_profile:.0f} s; best {best['config'][model]}, "
        f"simulated capacity {best['result']['capacity_rps']:.0f} req/s{capped}")
    return {"wall_s": wall, "profile_s": t_profile, "tune_s": wall - t_profile, "evaluated":
            doc["search"]["evaluated"], "best": best, "tuned_repo": doc["tuned_repo"]}


# -- the common measurement ------------------------------------------------------------------------------------------
def sweep(level: Callable[[int], tuple[float, float]], p99_ms: float, quick: bool, label: str) -> dict:
    """A concurrency sweep (``SPACE[quick]["concurrency"]``), one criterion for every side: ``level(c)`` gives the
    throughput (infer/s) and p99 (ms) at concurrency ``c``; the best is the highest throughput whose p99 is within
    the budget. A level without a stable window (:class:`Unstable`) or that fails is recorded with its message, and
    the sweep goes on. Each row also holds the client's CPU over the level (cores: the ended child processes'
    CPU seconds over its wall time; perf_analyzer's includes its start and unstable windows)."""
    rows = []
    for c in SPACE[quick]["concurrency"]:
        cpu0, t0 = _children_cpu_s(), time.perf_counter()
        try:
            throughput, p99 = level(c)
            rows.append({"concurrency": c, "throughput": throughput, "p99_ms": p99,
                         "client_cores": (_children_cpu_s() - cpu0) / (time.perf_counter() - t0)})
        except Unstable as err:
            rows.append({"concurrency": c, "unstable": str(err)})
        except RuntimeError as err:
            rows.append({"concurrency": c, "error": str(err)})
    ok = [r for r in rows if "throughput" in r and r["p99_ms"] <= p99_ms]
    best = max(ok, key=lambda r: r["throughput"]) if ok else None
    log(f"{label}: " + ", ".join(
        f"c={r['concurrency']}: {r['throughput']:.0f}/s p99 {r['p99_ms']:.1f} ms" if "throughput" in r else
        f"c={r['concurrency']}: {'unstable' if 'unstable' in r else 'failed'}" for r in rows))
    return {"rows": rows, "best": best}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def perf_analyzer_level(pa, url: str, model: str, quick: bool) -> Callable[[int], tuple[float, float]]:
    """perf_analyzer at one concurrency (synchronous mode, as Model Analyzer runs it)."""
    def level(c: int) -> tuple[float, float]:
        m = pa.measure(model, url, Level(concurrency=c, async_mode=False),
                       Windows(measurement_s=SPACE[quick]["measurement_s"], stability_pct=PA_STABILITY_PCT,
                               max_trials=PA_MAX_TRIALS, stabilize_on_p99=False))
        return m.throughput_ips, m.p99_s * 1e3
    return level


def best_throughput(run: dict | None) -> float | None:
    """A sweep's (or Model Analyzer's result's) best throughput within the budget; None without one."""
    return run["best"]["throughput"] if run and run.get("best") else None


def relative_error(simulated: float | None, measured: float | None) -> float | None:
    return (simulated - measured) / measured if simulated is not None and measured else None


def client_cpu_per_request(trials: list[dict]) -> dict[int, float]:
    """A client's CPU seconds per request at each concurrency level of its sweeps (``trials``): the level's client
    cores over its throughput, the median over the trials."""
    per: dict[int, list[float]] = {}
    for run in trials:
        for row in run["rows"] if run else ():
            if row.get("throughput"):
                per.setdefault(row["concurrency"], []).append(row["client_cores"] / row["throughput"])
    return {c: statistics.median(v) for c, v in per.items()}


def client_level(profile, config, extra_cpu_s: dict[int, float], model: str,
                 quick: bool) -> Callable[[int], tuple[float, float]]:
    """The simulator's closed loop at one concurrency ``c`` through a client costing ``extra_cpu_s[c]`` more host CPU
    per request than the profile's sender (:func:`~serving_bench.sim.client.through_client`)."""
    from serving_bench.sim.client import through_client
    from serving_bench.sim.target import SimTarget

    def level(c: int) -> tuple[float, float]:
        if c not in extra_cpu_s:
            raise RuntimeError(f"no CPU per request of both clients at concurrency {c}")
        return closed_loop_level(SimTarget(through_client(profile, extra_cpu_s[c]), config, seed=1), model,
                                 quick)(c)
    return level


def closed_loop_level(target, model: str, quick: bool) -> Callable[[int], tuple[float, float]]:
    """serving-bench's closed loop at one concurrency on ``target`` (the real server through our sender, or the
    simulator): three of perf_analyzer's windows after a warm-up of a tenth of that, summarized one way for both."""
    def level(c: int) -> tuple[float, float]:
        span = 3 * SPACE[quick]["measurement_s"]
        warm = 0.1 * span
        schedule = Schedule.closed_loop({model: 1}, 400_000, {"duration_s": warm + span, "warmup_s": warm,
                                                              "cooldown_s": 0.0})
        overall = summarize(target.run(schedule, ClosedLoop(c, warm + span)))["overall"]
        return overall["throughput_ips"], overall["service_p99_s"] * 1e3
    return level


def table(args, ma: dict, ma_serving, sb: dict, cmp: dict, wall_ratio: float | None) -> str:
    """The markdown summary (medians over the measurement trials)."""
    def config(c) -> str:
        return (f"{c['instances']} inst, mbs {c['max_batch_size']}, delay {c['max_queue_delay_us']} µs"
                if c else "none")

    ma_config = ma_serving and {"instances": ma_serving.instance_count, "max_batch_size": ma_serving.max_batch_size,
                                "max_queue_delay_us": ma_serving.max_queue_delay_us}
    ratio = cmp["ratio"]
    return "\n".join([
        f"# serving-bench tune vs Model Analyzer 1.58{' (--quick)' if args.quick else ''}", "",
        f"Model `{args.model}`, p99 budget {args.p99_ms:g} ms; both picks measured with perf_analyzer 2.50 "
        f"(concurrency sweep, best throughput within the budget), {cmp['trials']} interleaved trials: median "
        "(min..max).", "",
        "| tool | wall time (s) | best config | measured throughput (infer/s) |", "|---|---|---|---|",
        f"| Model Analyzer 1.58 | {ma['wall_s']:.0f} | {config(ma_config)} | {_spread(cmp['peer'])} |",
        f"| serving-bench tune | {sb['wall_s']:.0f} (profile {sb['profile_s']:.0f} + tune {sb['tune_s']:.0f}) | "
        f"{config(sb['best']['config'][args.model])} | {_spread(cmp['ours'])} |", "",
        f"Throughput ratio (serving-bench / MA): {_spread(ratio, 2)} over {ratio['n']} trials (target >= 1.0); "
        f"wall-time ratio: {'none' if wall_ratio is None else f'{wall_ratio:.3f}'} (one search each; target <= 0.1)."
        + (f" Model Analyzer: {ma['error']}." if ma.get("error") else "")])


def prediction(simulated: dict, measured: dict[str, list[dict]], capacity_rps: float) -> dict:
    """The simulator's figure for serving-bench's pick against each measurement of it by the same sweep: per client
    (``measured``: its trials' sweeps) the median best throughput, the simulator's error on it, and the median client
    CPU at the best level; ``capacity_rps`` is the tuner's own criterion (open loop, p99 within the budget)."""
    sim = best_throughput(simulated)
    out = {"simulated_ips": sim, "open_loop_capacity_rps": capacity_rps}
    for client, trials in measured.items():
        bests = [r["best"] for r in trials if r and r.get("best")]
        median = statistics.median(b["throughput"] for b in bests) if bests else None
        out[client] = {"median_ips": median, "client_cores": statistics.median(b["client_cores"] for b in bests)
                       if bests else None,
                       "error": relative_error(sim, median)}
    return out


def through_client_prediction(simulated: dict | None, measured: dict, extra_cpu_s: dict[int, float]) -> dict:
    """The sweep simulated through perf_analyzer's client (``simulated``; None: no calibration) against
    perf_analyzer's measurement of our pick (``measured``: :func:`prediction`'s entry), with the extra CPU per
    request (µs) at each level."""
    sim = best_throughput(simulated)
    return {"simulated_ips": sim, "extra_cpu_us": {str(c): 1e6 * x for c, x in extra_cpu_s.items()},
            "calibrated_on": "perf_analyzer's runs on Model Analyzer's pick, serving-bench's sender's on ours",
            "error": relative_error(sim, measured["median_ips"])}


def prediction_text(predicted: dict) -> str:
    """One paragraph: the simulated throughput of our pick against each client's measurement of it."""
    def side(name: str, label: str) -> str:
        d = predicted[name]
        if d["median_ips"] is None:
            return f"{label}: none within the budget"
        error = "" if d["error"] is None else f", simulator {100 * d['error']:+.1f} %"
        return f"{label} {d['median_ips']:.0f} infer/s (client {d['client_cores']:.2f} cores{error})"
    sim = predicted["simulated_ips"]
    return (f"Simulated throughput of serving-bench's pick by the same sweep: "
            f"{'none within the budget' if sim is None else f'{sim:.0f} infer/s'}; measured (median of the trials) "
            f"{side('perf_analyzer', 'through perf_analyzer')}, {side('own_sender', 'through serving-bench sender')}"
            f". The profile was measured through serving-bench's sender: where the client shares the host's cores, "
            f"the simulator models that client, not perf_analyzer. Open-loop capacity (the tuner's criterion: p99 "
            f"within the budget): {predicted['open_loop_capacity_rps']:.0f} req/s.\n\n" + through_client_text(predicted))


def through_client_text(predicted: dict) -> str:
    """One paragraph: the sweep simulated through perf_analyzer's client against its measurement."""
    d = predicted["through_perf_analyzer"]
    if not d["extra_cpu_us"]:
        return ("Not simulated through perf_analyzer's client: no perf_analyzer run on Model Analyzer's pick to take "
                "its CPU per request from.")
    sim = "none within the budget" if d["simulated_ips"] is None else f"{d['simulated_ips']:.0f} infer/s"
    error = "" if d["error"] is None else f", {100 * d['error']:+.1f} % against perf_analyzer's measurement"
    extra = ", ".join(f"{us:+.0f} µs at concurrency {c}" for c, us in d["extra_cpu_us"].items())
    return (f"Simulated through perf_analyzer's client (its CPU per request over serving-bench's sender's, taken "
            f"from its runs on Model Analyzer's pick: {extra}): {sim}{error} (target: within 10 %).")


def _spread(d: dict, digits: int = 0) -> str:
    if d["median"] is None:
        return "none"
    return f"{d['median']:.{digits}f} ({d['low']:.{digits}f}..{d['high']:.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small search spaces and short measurements")
    parser.add_argument("--model", default="sleep_python", help="sleep_python or <zoo model>_<framework>")
    parser.add_argument("--p99-ms", type=float, default=30.0)
    parser.add_argument("--trials", type=int, default=3, help="measurements of each pick (default 3)")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    sender_note = choose_sender(None)[1]
    log(sender_note)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        pa = find_perf_analyzer()
    except PeerMissing as err:
        print(f"perf_analyzer unavailable: {err}")
        return 1
    setup_peers()
    work = Path(tempfile.mkdtemp(prefix="vs-ma-"))
    try:
        repo = make_repo(args.model, work / "repo")
        from serving_bench.serve.runtime_view import build_runtime_repo

        view = work / "view"
        build_runtime_repo(repo, view, models=[args.model])
        ma = run_model_analyzer(view, args.model, args.p99_ms, work, args.quick)
        sb = run_serving_bench(repo, args.model, args.p99_ms, work, args.quick)
        # Model Analyzer's winner as a repository: its config.pbtxt over a copy of ours
        from serving_bench.export.repository import read_config
        from serving_bench.serve.server import TritonServer
        from serving_bench.load.driver import SendOptions, TritonTarget
        from serving_bench.profiles.schema import Profile
        from serving_bench.serving_config import ServingConfig, model_serving_from_config
        from serving_bench.sim.target import SimTarget
        from serving_bench.tune.verify import write_tuned_repo

        ma_serving = ma_repo = None
        if ma["config_path"]:
            ma_serving = model_serving_from_config(read_config(ma["config_path"]), args.model)
            ma_repo = write_tuned_repo(repo, ServingConfig((ma_serving,)), work / "ma_repo")
        picks = {"model_analyzer": ma_repo, "serving_bench": Path(sb["tuned_repo"])}
        labels = {"model_analyzer": "Model Analyzer's pick", "serving_bench": "serving-bench's pick"}
        with contextlib.ExitStack() as stack:  # one server per pick, up for all its trials
            urls = {side: stack.enter_context(TritonServer(repo, models=[args.model])).endpoints.grpc_url
                    for side, repo in picks.items() if repo is not None}
            sides = {side: lambda k, side=side, url=url: sweep(
                perf_analyzer_level(pa, url, args.model, args.quick), args.p99_ms, args.quick,
                f"measured {labels[side]} (trial {k + 1})") for side, url in urls.items()}
            # serving-bench's pick through our own sender too: the client its profile was measured with
            own_sender = TritonTarget(urls["serving_bench"], send=SendOptions(senders=1))
            sides[OWN_SENDER] = lambda k: sweep(closed_loop_level(own_sender, args.model, args.quick), args.p99_ms,
                                                args.quick, f"measured {labels['serving_bench']} through "
                                                f"serving-bench's sender (trial {k + 1})")
            runs = interleave(args.trials, sides, log=log)
        # ... and in the simulator, by the same sweep and criterion as both measurements
        profile = Profile.load(work / "sb_profile.json")
        tuned = ServingConfig.from_repo(sb["tuned_repo"], [args.model])
        simulated = sweep(closed_loop_level(SimTarget(profile, tuned, seed=1), args.model, args.quick), args.p99_ms,
                          args.quick, f"simulated {labels['serving_bench']}")
        # ... and through perf_analyzer's client, its CPU per request taken from its runs on Model Analyzer's pick
        own_cost = client_cpu_per_request(runs[OWN_SENDER])
        pa_cost = client_cpu_per_request(runs.get("model_analyzer", []))
        extra = {c: pa_cost[c] - own_cost[c] for c in sorted(set(pa_cost) & set(own_cost))}
        log("perf_analyzer's CPU per request over serving-bench's sender's: " +
            (", ".join(f"c={c}: {1e6 * pa_cost[c]:.0f} - {1e6 * own_cost[c]:.0f} us" for c in extra) or "none"))
        simulated_pa = sweep(client_level(profile, tuned, extra, args.model, args.quick), args.p99_ms, args.quick,
                             f"simulated {labels['serving_bench']} through perf_analyzer") if extra else None
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"work folder kept: {work}")

    own = best_throughput(ma)
    def missing(run: dict | None) -> str:
        return (run or {}).get("unstable") or "no level within the p99 budget"

    ours = [figure(best_throughput(r), missing=missing(r)) for r in runs["serving_bench"]]
    peer = [figure(best_throughput(r), floor=own and IMPLAUSIBLE_SHORTFALL * own, missing=missing(r),
                   why_floor=f" infer/s, half of the {own:.0f} infer/s Model Analyzer measured for it in its search"
                   if own else "") for r in runs["model_analyzer"]] if "model_analyzer" in runs else \
        [figure(None, missing=f"Model Analyzer has no pick: {ma.get('error')}")] * args.trials
    cmp = compare(ours, peer)
    wall_ratio = sb["wall_s"] / ma["wall_s"] if ma["wall_s"] and ma["best"] else None
    predicted = prediction(simulated, {"perf_analyzer": runs["serving_bench"], "own_sender": runs[OWN_SENDER]},
                           sb["best"]["result"]["capacity_rps"])
    predicted["through_perf_analyzer"] = through_client_prediction(simulated_pa, predicted["perf_analyzer"], extra)
    result = {
        "benchmark": "vs_model_analyzer", "model": args.model, "p99_budget_ms": args.p99_ms, "quick": args.quick,
        "space": SPACE[args.quick], "trials": args.trials, "perf_analyzer": pa.version(),
        "sender": sender_note,
        "model_analyzer": {**{k: ma[k] for k in ("wall_s", "measurements", "best")}, "error": ma.get("error"),
                           "config": ma_serving and (ma_serving.__dict__ | {"instances": list(ma_serving.instances)}),
                           "measured": runs.get("model_analyzer")},
        "serving_bench": {"wall_s": sb["wall_s"], "profile_s": sb["profile_s"], "tune_s": sb["tune_s"],
                          "evaluated": sb["evaluated"], "config": sb["best"]["config"],
                          "measured": runs["serving_bench"], "measured_own_sender": runs[OWN_SENDER],
                          "simulated": simulated, "simulated_through_perf_analyzer": simulated_pa,
                          "prediction": predicted},
        "comparison": cmp, "throughput_ratio": cmp["ratio"]["median"], "wall_time_ratio": wall_ratio,
        "targets": {"throughput_ratio": ">= 1.0", "wall_time_ratio": "<= 0.1"},
    }
    text = table(args, ma, ma_serving, sb, cmp, wall_ratio) + "\n\n" + prediction_text(predicted)
    print(text)
    name = "vs_model_analyzer" + ("" if args.model == "sleep_python" else f"_{args.model}")  # one file per model
    path = write_result(name, result, quick=args.quick, out_dir=args.out, markdown=text)
    log(f"wrote {path} and {path.with_suffix('.md').name}")
    print(ratio_line("measured throughput of each tool's pick", cmp, unit="infer/s", target=">= 1.0",
                     peer="Model Analyzer")
          + f"; wall-time ratio {'none' if wall_ratio is None else f'{wall_ratio:.3f}'} (one search each, "
          "target <= 0.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
