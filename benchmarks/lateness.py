"""Send lateness and the highest sustained open-loop rate: serving-bench vs perf_analyzer 2.50, same run.

    .venv/bin/python benchmarks/lateness.py [--quick] [--senders 0,1,2] [--out DIR]

One tritonserver (127.0.0.1) serves ``sleep_zero`` (no service time: the client is the limit). Then:

1. serving-bench replays Poisson schedules at 500, 1000 and 2000 req/s and reports send lateness (sent - intended)
   p50 / p99 / max; the target is p99 <= 1 ms. perf_analyzer (request-rate mode, ``-a``, Poisson) runs the same
   rates and reports the share of requests it sent late ("delayed"); it does not report how late.
2. The highest sustained rate of each, found by doubling then bisection (5 %, 10 % with --quick):
   serving-bench sustains a rate when lateness p99 <= 1 ms, every request succeeds and the completions keep up
   (>= 98 % of the rate); perf_analyzer when its throughput is >= 98 % of the rate and it does not warn about
   delayed requests (it warns when more than 1 % were picked up more than 1 ms late: the same criterion as ours).
   Ratio = ours / perf_analyzer, target >= 1.0.

Both clients share the 2-core machine with the server: run it on a quiet machine. Writes
``benchmarks/results/lateness[_quick]_<date>_<host>.json``.
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
from serving_bench.load.schedule import Schedule  # noqa: E402
from serving_bench.peers.perf_analyzer import PeerMissing, find_perf_analyzer  # noqa: E402
from serving_bench.peers.report import write_result  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402

MODEL = "sleep_zero"
LATENESS_P99_S = 1e-3


def poisson(rate: float, duration: float, seed: int) -> Schedule:
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate * duration))
    return Schedule(np.sort(rng.random(n) * duration), np.zeros(n), (MODEL,), rng.integers(0, 16, n),
                    np.ones(n), {"seed": seed, "duration_s": duration})


def ours(url: str, rate: float, duration: float, senders: int, seed: int = 0) -> dict:
    schedule = poisson(rate, duration, seed)
    records = TritonTarget(url, senders=senders).run(schedule)
    late = (records["sent_s"] - records["intended_s"]).dropna().to_numpy()
    ok = records["status"].astype(str) == "ok"
    done = records.loc[ok, "done_s"].to_numpy()
    window = (done >= 0.1 * duration) & (done < 0.9 * duration)
    throughput = window.sum() / (0.8 * duration)
    row = {"rate": rate, "senders": senders, "requests": len(schedule), "ok": int(ok.sum()),
           "lateness_p50_s": float(np.percentile(late, 50)), "lateness_p99_s": float(np.percentile(late, 99)),
           "lateness_max_s": float(late.max()), "throughput_rps": float(throughput),
           "sender_cpu_us_per_request": 1e6 * records.attrs["sender_cpu_s"] / max(1, len(schedule))}
    row["sustained"] = bool(row["lateness_p99_s"] <= LATENESS_P99_S and row["ok"] == len(schedule)
                            and throughput >= 0.98 * rate * (len(schedule) / (rate * duration)))
    return row


def peer(pa, url: str, rate: float, measurement_s: float, quick: bool) -> dict:
    m = pa.measure(MODEL, url, request_rate=rate, async_mode=True, distribution="poisson",
                   measurement_s=measurement_s, stability_pct=50 if quick else 10, max_trials=5 if quick else 10)
    return {"rate": rate, "throughput_rps": m.throughput_ips, "delayed_pct": m.delayed_pct, "p99_s": m.p99_s,
            "sustained": bool(m.throughput_ips >= 0.98 * rate and (m.delayed_pct is None or m.delayed_pct <= 1.0))}


def _delayed(row: dict) -> str:
    pct = row["delayed_pct"]
    return "<= 1 % delayed > 1 ms" if pct is None else f"{pct:.1f} % delayed > 1 ms"


def max_sustained(trial, start: float, tolerance: float, limit: float = 32000.0,
                  floor: float = 50.0) -> tuple[float | None, list]:
    """Doubling from ``start`` until a rate fails (halving while even ``start`` fails, down to ``floor``), then
    bisection to ``tolerance``; returns (best, steps)."""
    steps, good, bad, rate = [], None, None, start
    while rate <= limit:
        row = trial(rate)
        steps.append(row)
        if row["sustained"]:
            good, rate = rate, rate * 2
        else:
            bad = rate
            break
    while good is None and bad is not None and bad / 2 >= floor:
        row = trial(bad / 2)
        steps.append(row)
        if row["sustained"]:
            good = bad / 2
        else:
            bad = bad / 2
    if good is None:
        return None, steps
    while bad is not None and (bad - good) / bad > tolerance:
        mid = (good + bad) / 2
        row = trial(mid)
        steps.append(row)
        good, bad = (mid, bad) if row["sustained"] else (good, mid)
    return good, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (about 2 minutes)")
    parser.add_argument("--senders", default="0,1,2",
                        help="sender process counts to try (0 = a thread of this process; comma-separated)")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    duration = 3.0 if args.quick else 10.0
    measurement_s = 2.0 if args.quick else 5.0
    tolerance = 0.10 if args.quick else 0.05
    senders = [int(s) for s in args.senders.split(",")]
    try:
        pa = find_perf_analyzer()
        pa_version = pa.version()
    except PeerMissing as err:
        print(f"perf_analyzer unavailable, no peer figures: {err}")
        pa, pa_version = None, None

    with tempfile.TemporaryDirectory() as tmp:
        write_sleep_entry(tmp, MODEL, base_ms=0.0, per_item_ms=0.0)
        with TritonServer(tmp) as server:
            url = server.endpoints.grpc_url
            ours(url, 500, 1.0, 0)  # warm the server and the client libraries
            lateness = []
            for rate in (500, 1000, 2000):
                for s in senders:
                    row = ours(url, rate, duration, s)
                    if pa is not None:
                        row["perf_analyzer"] = peer(pa, url, rate, measurement_s, args.quick)
                    lateness.append(row)
                    print(f"{rate:6.0f} req/s, {s} sender(s): lateness p50 {row['lateness_p50_s'] * 1e3:.3f} ms, "
                          f"p99 {row['lateness_p99_s'] * 1e3:.3f} ms, max {row['lateness_max_s'] * 1e3:.2f} ms, "
                          f"sender CPU {row['sender_cpu_us_per_request']:.0f} us/request"
                          + (f"; perf_analyzer: {_delayed(row['perf_analyzer'])}" if pa is not None else ""),
                          flush=True)
            best = {}
            for s in senders:
                best[s] = max_sustained(lambda r: ours(url, r, duration, s), 500, tolerance)
                print(f"serving-bench, {s} sender(s): max sustained {best[s][0]} req/s", flush=True)
            peer_best = max_sustained(lambda r: peer(pa, url, r, measurement_s, args.quick), 500, tolerance) \
                if pa is not None else (None, [])
            print(f"perf_analyzer -a: max sustained {peer_best[0]} req/s", flush=True)

    top = max((v[0] or 0.0) for v in best.values())
    ratio = top / peer_best[0] if peer_best[0] else None
    data = {"benchmark": "lateness", "model": MODEL, "quick": args.quick, "duration_s": duration,
            "perf_analyzer": pa_version, "lateness": lateness,
            "max_sustained": {"serving_bench": {str(s): {"rate": v[0], "steps": v[1]} for s, v in best.items()},
                              "perf_analyzer": {"rate": peer_best[0], "steps": peer_best[1]}},
            "ratio_max_sustained": ratio, "target_ratio": 1.0, "lateness_target_p99_s": LATENESS_P99_S}
    path = write_result("lateness", data, quick=args.quick, out_dir=args.out)
    print(f"max sustained open-loop rate: serving-bench {top:.0f} req/s vs perf_analyzer "
          f"{peer_best[0] or float('nan'):.0f} req/s -> ratio {ratio if ratio is None else round(ratio, 3)} "
          f"(target >= 1.0); wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
