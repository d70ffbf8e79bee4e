"""The framework comparison on this machine's CPU: each framework at several batch sizes with its main settings.

For each model (resnet50 and bert_base by default) the zoo model is exported with ``serving_bench.export`` (so every
artifact passed the parity check against torch) and then, per framework, measured in a fresh process (so peak memory
is that framework's): p50/p99 latency of one batch, throughput (items/s = batch / mean latency), peak resident
memory of the process, export time and artifact size. Torch eager is the reference column: ``x eager`` is the
framework's p50 divided by torch eager's p50 at the same batch (below 1 = faster).

Settings: intra-op threads (``--threads``, default = the CPU count) for every framework; ONNX Runtime at graph
optimisation levels ``all`` and ``basic``; fp32; TVM untuned and, with ``--tvm-tune-trials N`` > 0, MetaSchedule-tuned
with static buckets = the measured batch sizes (records cached, see docs/export.md#frameworks-and-what-an-entry-holds). Each cell runs ``--warmup``
batches then measures until ``--iterations`` batches or ``--budget-s`` seconds, whichever comes first (at least 3
batches); a cell whose single batch is estimated (from the smaller batches) to exceed ``--max-batch-s`` is skipped and
the table says so (untuned TVM at batch 8/32).

    python benchmarks/frameworks.py --quick          # tiny models, a minute: checks that everything runs
    python benchmarks/frameworks.py                  # resnet50 + bert_base, batch 1/8/32 (long; run on a quiet machine)

Writes ``benchmarks/results/frameworks_<date>_<host>.md`` and ``.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import multiprocessing
import os
import platform
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# column name -> (framework for load_predictor or "eager", load settings, which export repo: untuned / tuned)
COLUMNS = {
    "torch eager": ("eager", {}, None),
    "torchscript": ("torchscript", {}, "untuned"),
    "onnxruntime[all]": ("onnxruntime", {"graph_optimization_level": "all"}, "untuned"),
    "onnxruntime[basic]": ("onnxruntime", {"graph_optimization_level": "basic"}, "untuned"),
    "tvm untuned": ("tvm", {}, "tvm_untuned"),
    "tvm tuned": ("tvm", {}, "tuned"),
}


def peak_rss_mb() -> float:
    """Peak resident memory of this process (``VmHWM``; ``ru_maxrss`` would include the parent's peak, which Linux
    carries across fork and exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(column: str, model: str, seq_len: int | None, entry: str | None, runtime: dict, batches: list[int],
            threads: int, warmup: int, iterations: int, budget_s: float, max_batch_s: float, seed: int) -> list[dict]:
    """Run in a fresh process: latency per batch size for one (model, column). A batch size whose estimated time
    (per-item time of the smaller batches x batch) exceeds ``max_batch_s`` is skipped with a note."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    from serving_bench.models import get_model

    spec = get_model(model, seq_len=seq_len)
    framework, settings, _ = COLUMNS[column]
    if framework == "eager":
        import torch

        torch.set_num_threads(threads)
        module = spec.create(seed)

        def predict(inputs):
            with torch.inference_mode():
                return module(*(torch.from_numpy(inputs[n]) for n in spec.input_names))
    else:
        from serving_bench.export.frameworks import load_predictor

        predict = load_predictor(framework, Path(entry) / "1", spec.input_names, spec.output_names, threads=threads,
                                 **settings, **runtime)
    rows = []
    per_item_s = 0.0
    for batch in batches:
        estimate_s = per_item_s * batch
        if estimate_s > max_batch_s:  # skip, and say so in the table
            rows.append({"model": model, "column": column, "batch": batch, "n": 0, "p50_ms": float("nan"),
                         "p99_ms": float("nan"), "throughput": float("nan"), "peak_mb": peak_rss_mb(),
                         "note": f"skipped: ~{estimate_s:.0f} s per batch (> --max-batch-s {max_batch_s:g})"})
            continue
        inputs = spec.make_inputs(batch, seed)
        for _ in range(warmup):
            predict(inputs)
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < iterations and (len(times) < 3 or time.perf_counter() - start < budget_s):
            t0 = time.perf_counter()
            predict(inputs)
            times.append(time.perf_counter() - t0)
        lat = np.array(times)
        per_item_s = max(per_item_s, float(np.median(lat)) / batch)
        rows.append({"model": model, "column": column, "batch": batch, "n": len(times),
                     "p50_ms": float(np.percentile(lat, 50) * 1e3), "p99_ms": float(np.percentile(lat, 99) * 1e3),
                     "throughput": float(batch / lat.mean()), "peak_mb": peak_rss_mb()})
    return rows


def export_all(models: list[str], seq_len: int | None, repo: Path, batches: list[int], tune_trials: int) -> dict:
    """Export every model; returns manifest records by (model, framework, repo kind).

    Kinds: ``untuned`` (TorchScript, ONNX Runtime; parity at batch 1 and the largest batch), ``tvm_untuned`` (parity
    at the smallest batch only: untuned TVM runs naive loops, ~4 s per resnet50 image and ~30 s per bert_base sample on
    2 cores, so a parity check at batch 32 alone would take minutes; the dynamic-batch library is the same code for
    every batch, and the test suite checks it at several batch sizes) and, with ``tune_trials``, ``tuned`` (TVM with
    static buckets = the measured batch sizes, parity at the smallest and largest)."""
    from serving_bench.export.api import export_models
    from serving_bench.export.frameworks import ExportOptions
    from serving_bench.export.repository import load_manifest

    plans = [("untuned", "torchscript,onnxruntime", 0, max(batches)), ("tvm_untuned", "tvm", 0, min(batches))]
    if tune_trials > 0:
        plans.append(("tuned", "tvm", tune_trials, max(batches)))
    records = {}
    for kind, frameworks, trials, max_batch in plans:
        target = repo / kind
        for model in models:
            exported = export_models(model, frameworks, target,
                                     options=ExportOptions(max_batch_size=max_batch, seq_len=seq_len,
                                                           tvm_tune_trials=trials,
                                                           tvm_buckets=batches if trials else ()),
                                     overwrite=True, log=lambda line: print("  " + line, flush=True))
            failed = [r for r in exported if r["status"] != "exported"]
            if failed:
                raise SystemExit(f"export failed: {failed[0]['name']}: {failed[0].get('reason')}")
        for name, rec in load_manifest(target)["entries"].items():
            records[(rec["model"], rec["framework"], kind)] = {**rec, "entry": str(target / name)}
    return records


def eager_size_bytes(model: str, seq_len: int | None) -> int:
    from serving_bench.models import get_model

    module = get_model(model, seq_len=seq_len).create()
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def table(rows: list[dict]) -> str:
    eager = {(r["model"], r["batch"]): r["p50_ms"] for r in rows if r["column"] == "torch eager"}
    head = ("| model | framework | batch | p50 ms | p99 ms | x eager (p50) | items/s | peak RSS MB | export s | "
            "artifact MB | n | note |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        if not r["n"]:
            lines.append(f"| {r['model']} | {r['column']} | {r['batch']} | - | - | - | - | - | {r['export_s']:.1f} | "
                         f"{r['artifact_mb']:.1f} | 0 | {r.get('note', '')} |")
            continue
        ratio = r["p50_ms"] / eager[(r["model"], r["batch"])] if (r["model"], r["batch"]) in eager else float("nan")
        lines.append(f"| {r['model']} | {r['column']} | {r['batch']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                     f"{ratio:.2f} | {r['throughput']:.1f} | {r['peak_mb']:.0f} | {r['export_s']:.1f} | "
                     f"{r['artifact_mb']:.1f} | {r['n']} | {r.get('note', '')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny_cnn + tiny_mlp, batch 1/8, few iterations")
    parser.add_argument("--models", default=None, help="comma-separated (default resnet50,bert_base)")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,8,32)")
    parser.add_argument("--seq-len", type=int, default=128, help="bert_base sequence length (default 128)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads (default: all)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="unmeasured batches first (TorchScript optimises after its first runs)")
    parser.add_argument("--iterations", type=int, default=50, help="most batches measured per cell")
    parser.add_argument("--budget-s", type=float, default=20.0, help="time per cell after which measuring stops")
    parser.add_argument("--max-batch-s", type=float, default=60.0,
                        help="skip a cell whose single batch is estimated to take longer (default 60 s)")
    parser.add_argument("--tvm-tune-trials", type=int, default=0, help="MetaSchedule trials for the 'tvm tuned' column "
                                                                       "(0: no tuned column)")
    parser.add_argument("--columns", default=",".join(COLUMNS), help=f"subset of: {', '.join(COLUMNS)}")
    parser.add_argument("--repo", default=None, help="export folder (default: a temporary one)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="results folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.models = args.models or "tiny_cnn,tiny_mlp"
        args.batches = args.batches or "1,8"
        args.iterations, args.budget_s = min(args.iterations, 20), min(args.budget_s, 2.0)
    models = (args.models or "resnet50,bert_base").split(",")
    batches = [int(b) for b in (args.batches or "1,8,32").split(",")]
    columns = [c for c in args.columns.split(",") if c]
    if args.tvm_tune_trials <= 0 and "tvm tuned" in columns:
        columns.remove("tvm tuned")
    seq_len = args.seq_len
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as tmp:
        repo = Path(args.repo) if args.repo else Path(tmp)
        print(f"exporting {', '.join(models)} (max batch {max(batches)}) to {repo}", flush=True)
        records = export_all(models, seq_len, repo, batches, args.tvm_tune_trials)
        rows: list[dict] = []
        ctx = multiprocessing.get_context("spawn")
        for model in models:
            model_seq = seq_len if model == "bert_base" else None
            for column in columns:
                framework, _, kind = COLUMNS[column]
                rec = records.get((model, framework, kind)) if kind else None
                runtime = {}
                if rec and rec.get("settings", {}).get("buckets"):
                    runtime["buckets"] = ",".join(map(str, rec["settings"]["buckets"]))
                with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
                    measured = pool.submit(measure, column, model, model_seq, rec["entry"] if rec else None, runtime,
                                           batches, args.threads, args.warmup, args.iterations, args.budget_s,
                                           args.max_batch_s, args.seed).result()
                for row in measured:
                    row["export_s"] = rec["export_s"] if rec else 0.0
                    row["artifact_mb"] = (rec["size_bytes"] if rec else eager_size_bytes(model, model_seq)) / 1e6
                    rows.append(row)
                    print(f"  {model} {column} batch {row['batch']}: " + (row.get("note") or
                          f"p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms ({row['n']} batches)"), flush=True)
    now = dt.datetime.now(dt.timezone.utc)
    host = socket.gethostname().split(".")[0]
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.1f}"
    header = (f"# Framework comparison ({'quick' if args.quick else 'full'})\n\n{now:%Y-%m-%d %H:%M} UTC on {host} "
              f"({machine}); threads {args.threads}; fp32; bert_base seq {seq_len}; TVM tune trials "
              f"{args.tvm_tune_trials}; {time.perf_counter() - started:.0f} s in all.\n"
              f"Command: `python benchmarks/frameworks.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    text = header + "\n" + table(rows) + "\n"
    print("\n" + text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"frameworks_{'quick_' if args.quick else ''}{now:%Y-%m-%d}_{host}"
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out / stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
