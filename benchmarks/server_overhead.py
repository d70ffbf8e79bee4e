"""What the embedded Triton server adds over calling the runtime directly: latency (p50, p99) and throughput at
concurrency 1, 4 and 8, for ``tiny_cnn`` (ONNX Runtime and TorchScript runners) and the ``sleep`` model.

    .venv/bin/python benchmarks/server_overhead.py [--quick] [--out DIR]

Direct: the same artifact loaded in this process by the same loader the runner uses (``load_predictor``, one
intra-op thread), batch 1. Latency is timed around each call, one caller; throughput at concurrency c is c threads
calling it back to back for a fixed time (ONNX Runtime and torch release the GIL while computing). For the sleep
model the "runtime" is its service time itself: ``time.sleep(base_ms + per_item_ms)``.

Server: one tritonserver in the same run serving the same files, one instance per model with one intra-op thread,
the exported configs' dynamic batching left on, measured by the real perf_analyzer 2.50 (``serving_bench.peers``;
concurrency mode, its synchronous threads), latency from the send. Overhead = server - direct at concurrency 1.
At concurrency 4 and 8 the server batches waiting requests into one execution while the direct callers run side by
side; both are what a user gets from each way of serving, and the ratio says how they compare.

On the shared 2-core development machine perf_analyzer, the server and the model share two cores, so figures there
are indicative only; the result file records the load average.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving_bench.export.api import export_models  # noqa: E402
from serving_bench.export.frameworks import ExportOptions, load_predictor  # noqa: E402
from serving_bench.export.sleep import write_sleep_entry  # noqa: E402
from serving_bench.models import get_model  # noqa: E402
from serving_bench.peers.perf_analyzer import Level, PeerMissing, Windows, find_perf_analyzer  # noqa: E402
from serving_bench.peers.report import write_result  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402

CONCURRENCY = (1, 4, 8)
SLEEP = {"base_ms": 2.0, "per_item_ms": 0.5}
SEED = 0


def direct_callables(repo: Path, frameworks: list[str]) -> dict[str, Callable[[], object]]:
    """Entry name -> a zero-argument call running one batch-1 request on the runtime directly."""
    calls = {}
    x = get_model("tiny_cnn").make_inputs(1, seed=SEED)
    for fw in frameworks:
        predict = load_predictor(fw, repo / f"tiny_cnn_{fw}" / "1", ["input"], ["output"], threads=1)
        calls[f"tiny_cnn_{fw}"] = lambda predict=predict: predict(x)
    delay_s = (SLEEP["base_ms"] + SLEEP["per_item_ms"]) / 1e3
    calls["sleep_python"] = lambda: time.sleep(delay_s)
    return calls


def direct_latency(call: Callable[[], object], n: int) -> dict:
    for _ in range(min(50, n)):
        call()
    samples = np.empty(n)
    for i in range(n):
        start = time.perf_counter()
        call()
        samples[i] = time.perf_counter() - start
    p50, p99 = np.percentile(samples, [50, 99])
    return {"p50_s": float(p50), "p99_s": float(p99), "calls": n}


def direct_throughput(call: Callable[[], object], concurrency: int, duration_s: float) -> float:
    """Calls per second with ``concurrency`` threads calling back to back for ``duration_s``."""
    counts = [0] * concurrency
    stop = threading.Event()

    def worker(k: int) -> None:
        while not stop.is_set():
            call()
            counts[k] += 1

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(duration_s)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def measure_server(pa, server, model: str, concurrency: int, window_s: float, stability_pct: float):
    """perf_analyzer at one concurrency; if it finds no stable window (a busy machine), once more accepting any
    spread (``-s 100``). Returns the measurement and the stability criterion it met (recorded with the figures)."""
    for stability in (stability_pct, 100.0):
        try:
            with server.guard():
                m = pa.measure(model, server.endpoints.grpc_url, Level(concurrency=concurrency, async_mode=False),
                               Windows(measurement_s=window_s, stability_pct=stability, max_trials=10))
            return m, stability
        except RuntimeError as err:
            if "stable measurement" not in str(err) or stability == 100.0:
                raise
            print(f"  {model} c={concurrency}: no window within {stability:g} %; retrying with -s 100", flush=True)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, ONNX Runtime only (about 2 minutes)")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    try:
        pa = find_perf_analyzer()
    except PeerMissing as err:
        print(f"perf_analyzer unavailable: {err}", file=sys.stderr)
        return 2
    frameworks = ["onnxruntime"] if args.quick else ["onnxruntime", "torchscript"]
    latency_n = 300 if args.quick else 3000
    window_s = 1.5 if args.quick else 4.0
    rows = []
    with tempfile.TemporaryDirectory(prefix="server-overhead-") as tmp:
        repo = Path(tmp) / "repo"
        records = export_models(["tiny_cnn"], frameworks, repo, options=ExportOptions(max_batch_size=8, seed=SEED))
        failed = [r for r in records if r["status"] != "exported"]
        if failed:
            print(f"export failed: {failed}", file=sys.stderr)
            return 1
        write_sleep_entry(repo, "sleep_python", max_batch_size=8, **SLEEP)
        direct = {}
        for name, call in direct_callables(repo, frameworks).items():  # before the server: nothing else running
            direct[name] = direct_latency(call, latency_n)
            direct[name]["throughput_rps"] = {c: direct_throughput(call, c, window_s) for c in CONCURRENCY}
            print(f"direct {name}: p50 {direct[name]['p50_s'] * 1e3:.3f} ms, p99 {direct[name]['p99_s'] * 1e3:.3f} ms",
                  flush=True)
        with TritonServer(repo, threads_per_instance=1) as server:
            for name in direct:
                server_rows = {}
                for c in CONCURRENCY:
                    m, stability = measure_server(pa, server, name, c, window_s, 50 if args.quick else 10)
                    server_rows[c] = {"throughput_rps": m.throughput_ips, "p50_s": m.p50_s, "p99_s": m.p99_s,
                                      "server_queue_s": m.server_queue_s,
                                      "server_compute_infer_s": m.server_compute_infer_s,
                                      "stability_pct": stability, "measurement_s": window_s}
                d, s1 = direct[name], server_rows[1]
                row = {"model": name, "direct": d, "server": server_rows,
                       "added_p50_s": s1["p50_s"] - d["p50_s"], "added_p99_s": s1["p99_s"] - d["p99_s"],
                       "throughput_ratio": {c: server_rows[c]["throughput_rps"] / d["throughput_rps"][c]
                                            for c in CONCURRENCY}}
                rows.append(row)
                print(f"{name}: server adds p50 {row['added_p50_s'] * 1e3:+.3f} ms, p99 {row['added_p99_s'] * 1e3:+.3f}"
                      f" ms at concurrency 1; throughput server/direct "
                      + ", ".join(f"c={c}: {server_rows[c]['throughput_rps']:.0f}/{d['throughput_rps'][c]:.0f}"
                                  for c in CONCURRENCY), flush=True)
    print()
    print(table(rows))
    path = write_result("server_overhead", {"benchmark": "server_overhead", "quick": args.quick,
                                            "perf_analyzer": pa.version(), "sleep": SLEEP, "window_s": window_s,
                                            "rows": rows, "table": table(rows)}, quick=args.quick, out_dir=args.out)
    print(f"wrote {path}")
    return 0


def table(rows: list[dict]) -> str:
    """Markdown table of the figures (ms, req/s)."""
    head = ("| model | direct p50 ms | server p50 ms | added p50 ms | direct p99 ms | server p99 ms | added p99 ms | "
            + " | ".join(f"req/s c={c} server/direct" for c in CONCURRENCY) + " |")
    lines = [head, "|" + "---|" * (7 + len(CONCURRENCY))]
    for r in rows:
        d, s = r["direct"], r["server"][1]
        tput = " | ".join(f"{r['server'][c]['throughput_rps']:.0f} / {d['throughput_rps'][c]:.0f}" for c in CONCURRENCY)
        lines.append(f"| {r['model']} | {d['p50_s'] * 1e3:.3f} | {s['p50_s'] * 1e3:.3f} | {r['added_p50_s'] * 1e3:+.3f} "
                     f"| {d['p99_s'] * 1e3:.3f} | {s['p99_s'] * 1e3:.3f} | {r['added_p99_s'] * 1e3:+.3f} | {tput} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
