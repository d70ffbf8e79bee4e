"""Closed loop agreement with perf_analyzer 2.50 at concurrency 1, 4 and 8: throughput and p99 within 5 %.

    .venv/bin/python benchmarks/vs_perf_analyzer.py [--quick] [--out DIR]

One tritonserver serves ``sleep_bench`` (2 ms + 0.2 ms per item, dynamic batching up to 8): a server-bound model, so
both clients should see the same server. At each concurrency, perf_analyzer (concurrency mode, its default
synchronous threads) and serving-bench (``ClosedLoop``) each measure throughput and p99 latency from the send time
(perf_analyzer's definition; in a closed loop the intended time is the send time anyway). Ratios are
serving-bench / perf_analyzer; agreement = within 5 %. Writes
``benchmarks/results/vs_perf_analyzer[_quick]_<date>_<host>.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving_bench.export.sleep import write_sleep_entry  # noqa: E402
from serving_bench.load.driver import TritonTarget  # noqa: E402
from serving_bench.peers.perf_analyzer import PeerMissing, find_perf_analyzer  # noqa: E402
from serving_bench.peers.report import write_result  # noqa: E402
from serving_bench.run.metrics import summarize  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.run.target import ClosedLoop  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402

MODEL = "sleep_bench"


def ours(url: str, concurrency: int, duration: float) -> dict:
    n = 200000
    rng = np.random.default_rng(concurrency)
    schedule = Schedule(np.zeros(n), np.zeros(n), (MODEL,), rng.integers(0, 16, n), np.ones(n),
                        {"duration_s": duration, "warmup_s": 0.1 * duration, "cooldown_s": 0.05 * duration})
    # one sender process, like the CLI's default and like perf_analyzer (a process of its own)
    records = TritonTarget(url, mode=ClosedLoop(concurrency, duration), senders=1).run(schedule)
    s = summarize(records)["overall"]
    return {"throughput_ips": s["throughput_ips"], "p50_s": s["service_p50_s"], "p99_s": s["service_p99_s"],
            "requests": s["counts"]["ok"], "failed": s["counts"]["failed"] + s["counts"]["timeout"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (about 1 minute)")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    duration = 3.0 if args.quick else 15.0
    try:
        pa = find_perf_analyzer()
    except PeerMissing as err:
        print(f"perf_analyzer unavailable: {err}")
        return 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        write_sleep_entry(tmp, MODEL, base_ms=2.0, per_item_ms=0.2, max_batch_size=8)
        with TritonServer(tmp) as server:
            url = server.endpoints.grpc_url
            ours(url, 2, 1.0)  # warm up
            for c in (1, 4, 8):
                m = pa.measure(MODEL, url, concurrency=c, async_mode=False, measurement_s=duration / 2,
                               stability_pct=50 if args.quick else 10, max_trials=5 if args.quick else 10)
                mine = ours(url, c, duration)
                row = {"concurrency": c, "serving_bench": mine,
                       "perf_analyzer": {"throughput_ips": m.throughput_ips, "p50_s": m.p50_s, "p99_s": m.p99_s},
                       "throughput_ratio": mine["throughput_ips"] / m.throughput_ips,
                       "p99_ratio": mine["p99_s"] / m.p99_s}
                row["agree_within_5pct"] = bool(abs(row["throughput_ratio"] - 1) <= 0.05
                                                and abs(row["p99_ratio"] - 1) <= 0.05)
                rows.append(row)
                print(f"concurrency {c}: throughput {mine['throughput_ips']:.0f} vs {m.throughput_ips:.0f} infer/s "
                      f"(x{row['throughput_ratio']:.3f}); p99 {mine['p99_s'] * 1e3:.2f} vs {m.p99_s * 1e3:.2f} ms "
                      f"(x{row['p99_ratio']:.3f}) -> {'agree' if row['agree_within_5pct'] else 'DIFFER'}",
                      flush=True)
    path = write_result("vs_perf_analyzer", {"benchmark": "vs_perf_analyzer", "model": MODEL, "quick": args.quick,
                                             "duration_s": duration, "perf_analyzer": pa.version(), "rows": rows},
                        quick=args.quick, out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
