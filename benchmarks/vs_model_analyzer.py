"""serving-bench tune vs Triton Model Analyzer 1.58 on the same model, server and p99 budget.

    .venv/bin/python benchmarks/vs_model_analyzer.py [--quick] [--model sleep_python] [--p99-ms 30]

Setup (once): Model Analyzer pins packages that conflict with ours (optuna 3.x, ...), so it is installed into
``.venv-peers/`` (gitignored) with ``triton-model-analyzer==1.58.0``, ``tritonclient[all]==2.50.0`` (the real
perf_analyzer binary) and ``nvidia-cuda-runtime-cu12`` (its ``libcudart.so.12``); perf_analyzer also needs Debian's
``libb64-0d``.

Both tools see the same thing: the runtime view of one repository entry served by the same bundled tritonserver
(``find_tritonserver()``: same binary, backend folder, LD_LIBRARY_PATH and PATH). Model Analyzer runs in local mode
with its brute-force search over instance count x max_batch_size (dynamic batching) x concurrency, constraint
``perf_latency_p99 <= budget``, objective throughput. serving-bench measures a simulator profile on that server,
then tunes on the simulator (capacity under the same p99 budget). Each tool's winning configuration is then
measured the same way: perf_analyzer in concurrency mode (1, 2, 4, ... 32) against a fresh server with that
configuration; its throughput is the highest one whose p99 is within the budget. Wall time counts each tool's whole
search (serving-bench: profile + tune).

Prints a table and writes ``benchmarks/results/vs_model_analyzer_<date>_<host>.{json,md}``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PEERS = ROOT / ".venv-peers"
PEER_PACKAGES = ["triton-model-analyzer==1.58.0", "tritonclient[all]==2.50.0", "nvidia-cuda-runtime-cu12"]


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
    from serving_bench.export.api import export_models

    name, _, framework = model.rpartition("_")
    if model == "sleep_python":
        export_models(["sleep"], [], dest, max_batch_size=32, sleep_base_ms=4.0, sleep_per_item_ms=0.5)
    else:
        export_models([name], [framework], dest, max_batch_size=32)
    return dest


# -- Model Analyzer ------------------------------------------------------------------------------------------------
def run_model_analyzer(view: Path, model: str, p99_ms: float, work: Path, quick: bool) -> dict:
    """Model Analyzer's brute-force search in local mode; returns its best config and wall time."""
    import yaml

    from serving_bench.serve.ports import free_port
    from serving_bench.serve.install import find_tritonserver

    install = find_tritonserver()
    http, grpc, metrics = free_port(), free_port(), free_port()
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
        "run_config_search_max_instance_count": 2 if quick else 4,
        "run_config_search_max_concurrency": 16 if quick else 64,
        "run_config_search_max_model_batch_size": 8 if quick else 32,
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
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"model-analyzer failed (exit {proc.returncode}); log {work / 'ma_stdout.log'}:\n{tail}")
    rows = read_ma_results(work / "ma_export")
    ok = [r for r in rows if r["p99_ms"] <= p99_ms]
    if not ok:
        raise RuntimeError(f"Model Analyzer found no configuration within p99 {p99_ms} ms")
    best = max(ok, key=lambda r: r["throughput"])
    best_config = work / "ma_output_repo" / best["config_name"] / "config.pbtxt"
    log(f"Model Analyzer: {len(rows)} measurements in {wall:.0f} s; best {best['config_name']} "
        f"{best['throughput']:.0f} infer/s at concurrency {best['concurrency']}, p99 {best['p99_ms']:.1f} ms")
    return {"wall_s": wall, "measurements": len(rows), "best": best, "config_path": str(best_config)}


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
    from serving_bench.tune.cli import TuneOptions, run_tune

    load = work / "sb_load.yaml"
    # capacity is searched as a multiple of this load, up to max_scale below: 100 req/s x 128 = 12,800 req/s, above
    # what 2 cores can serve (a ceiling the winners reach would make them tie, and the tie goes to fewer instances)
    load.write_text(f"name: vs_model_analyzer\nduration: 5s\nseed: 1\nwarmup: 0.5s\n"
                    f"models:\n  {model}: {{rate: 100, slo: {{p99: {p99_ms}ms}}}}\n")
    t0 = time.perf_counter()
    log("serving-bench: profiling on the embedded tritonserver")
    # only what the search below can use: batch sizes up to its largest max_batch_size, co-location up to its
    # largest instance count
    batches = (1, 2, 4, 8) if quick else (1, 2, 4, 8, 16, 32)
    instances = (1, 2) if quick else (1, 2, 3, 4)
    adapters.measure_profile(repo, [model], work / "sb_profile.json", batch_sizes=batches,
                             colocation=instances, pairs=False, seconds=1.0 if quick else 2.0,
                             log=lambda line: log("  " + line))
    t_profile = time.perf_counter() - t0
    log("serving-bench: tuning on the simulator")
    doc = run_tune(TuneOptions(load=str(load), profile=str(work / "sb_profile.json"), out=str(work / "sb_tune"),
                               repo=str(repo), instances=instances, max_batch_sizes=batches,
                               queue_delays_us=(0, 500, 2000), max_scale=128.0, verify_top=0, report=False,
                               quiet=True))
    wall = time.perf_counter() - t0
    best = doc["best"]
    capped = " (the search ceiling)" if best["result"]["capacity_capped"] else ""
    log(f"serving-bench: profile {t_profile:.0f} s + tune {wall - t_profile:.0f} s; best {best['config'][model]}, "
        f"simulated capacity {best['result']['capacity_rps']:.0f} req/s{capped}")
    return {"wall_s": wall, "profile_s": t_profile, "tune_s": wall - t_profile, "evaluated":
            doc["search"]["evaluated"], "best": best, "tuned_repo": doc["tuned_repo"]}


# -- the common measurement ------------------------------------------------------------------------------------------
def measure(repo: Path, model: str, p99_ms: float, quick: bool, label: str) -> dict:
    """perf_analyzer concurrency sweep against a fresh server of ``repo``; best throughput within the p99 budget."""
    from serving_bench.serve.server import TritonServer

    levels = [1, 2, 4, 8, 16] if quick else [1, 2, 4, 8, 16, 32]
    rows = []
    with TritonServer(repo, models=[model]) as server:
        for c in levels:
            with tempfile.NamedTemporaryFile(suffix=".csv") as out:
                cmd = [str(PEERS / "bin" / "perf_analyzer"), "-m", model, "-u", server.endpoints.grpc_url, "-i",
                       "grpc", "--concurrency-range", str(c), "--percentile", "99", "-f", out.name,
                       "--measurement-interval", "3000" if quick else "5000", "--max-trials", "10",
                       "--stability-percentage", "20"]
                proc = subprocess.run(cmd, env=peer_env(os.environ), capture_output=True, text=True)
                if proc.returncode != 0:
                    raise RuntimeError(f"perf_analyzer failed: {proc.stderr.strip()[-400:] or proc.stdout[-400:]}")
                with open(out.name) as fh:
                    r = next(csv.DictReader(fh))
                rows.append({"concurrency": c, "throughput": float(r["Inferences/Second"]),
                             "p99_ms": float(r["p99 latency"]) / 1000.0})
    ok = [r for r in rows if r["p99_ms"] <= p99_ms]
    best = max(ok, key=lambda r: r["throughput"]) if ok else None
    log(f"measured {label}: " + ", ".join(f"c={r['concurrency']}: {r['throughput']:.0f}/s p99 {r['p99_ms']:.1f} ms"
                                          for r in rows))
    return {"rows": rows, "best": best}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small search spaces and short measurements")
    parser.add_argument("--model", default="sleep_python", help="sleep_python or <zoo model>_<framework>")
    parser.add_argument("--p99-ms", type=float, default=30.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
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
        from serving_bench.serving_config import ServingConfig, model_serving_from_config
        from serving_bench.tune.verify import write_tuned_repo

        ma_serving = model_serving_from_config(read_config(ma["config_path"]), args.model)
        ma_repo = write_tuned_repo(repo, ServingConfig((ma_serving,)), work / "ma_repo")
        m_ma = measure(ma_repo, args.model, args.p99_ms, args.quick, "Model Analyzer's best")
        m_sb = measure(Path(sb["tuned_repo"]), args.model, args.p99_ms, args.quick, "serving-bench's best")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"work folder kept: {work}")
    tput_ma = m_ma["best"]["throughput"] if m_ma["best"] else 0.0
    tput_sb = m_sb["best"]["throughput"] if m_sb["best"] else 0.0
    result = {
        "date": dt.date.today().isoformat(), "host": platform.node(), "cpus": os.cpu_count(),
        "model": args.model, "p99_budget_ms": args.p99_ms, "quick": args.quick,
        "model_analyzer": {"wall_s": ma["wall_s"], "measurements": ma["measurements"], "config": ma_serving.__dict__ |
                           {"instances": list(ma_serving.instances)}, "measured": m_ma},
        "serving_bench": {"wall_s": sb["wall_s"], "profile_s": sb["profile_s"], "tune_s": sb["tune_s"],
                          "evaluated": sb["evaluated"], "config": sb["best"]["config"], "measured": m_sb},
        "throughput_ratio": tput_sb / tput_ma if tput_ma else None,
        "wall_time_ratio": sb["wall_s"] / ma["wall_s"] if ma["wall_s"] else None,
        "targets": {"throughput_ratio": ">= 1.0", "wall_time_ratio": "<= 0.1"},
    }
    lines = [f"# serving-bench tune vs Model Analyzer 1.58 — {result['date']}, {result['host']}, "
             f"{result['cpus']} CPUs{' (--quick)' if args.quick else ''}", "",
             f"Model `{args.model}`, p99 budget {args.p99_ms:g} ms; both winners measured with perf_analyzer 2.50 "
             "(concurrency sweep, best throughput within the budget).", "",
             "| tool | wall time (s) | best config | measured throughput (infer/s) | p99 (ms) |", "|---|---|---|---|---|",
             f"| Model Analyzer 1.58 | {ma['wall_s']:.0f} | {ma_serving.instance_count} inst, mbs "
             f"{ma_serving.max_batch_size}, delay {ma_serving.max_queue_delay_us} µs | {tput_ma:.0f} | "
             f"{m_ma['best']['p99_ms'] if m_ma['best'] else float('nan'):.1f} |",
             f"| serving-bench tune | {sb['wall_s']:.0f} (profile {sb['profile_s']:.0f} + tune {sb['tune_s']:.0f}) | "
             f"{sb['best']['config'][args.model]['instances']} inst, mbs "
             f"{sb['best']['config'][args.model]['max_batch_size']}, delay "
             f"{sb['best']['config'][args.model]['max_queue_delay_us']} µs | {tput_sb:.0f} | "
             f"{m_sb['best']['p99_ms'] if m_sb['best'] else float('nan'):.1f} |", "",
             f"Throughput ratio (serving-bench / MA): {result['throughput_ratio'] or 0:.2f} (target >= 1.0); "
             f"wall-time ratio: {result['wall_time_ratio'] or 0:.3f} (target <= 0.1)."]
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"vs_model_analyzer_{result['date']}_{result['host']}{'_quick' if args.quick else ''}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    log(f"wrote {out / stem}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
