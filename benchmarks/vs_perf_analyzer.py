"""Closed loop agreement with perf_analyzer 2.50 at concurrency 1, 4 and 8: throughput and p99 within 5 %.

    .venv/bin/python benchmarks/vs_perf_analyzer.py [--quick] [--trials N] [--out DIR]

One tritonserver serves ``sleep_bench`` (2 ms + 0.2 ms per item, dynamic batching up to 8): a server-bound model, so
both clients should see the same server. At each concurrency the two clients measure in turn, ``--trials`` times
(default 3), interleaved (peer, ours; ours, peer; ...): perf_analyzer in concurrency mode (its default synchronous
threads; windows of 3 s, 1 s with ``--quick``; stable when three windows agree within 20 % on throughput and average
latency, at most 5 windows; its figures are those of its last three) and serving-bench (``ClosedLoop``, one sender process like the CLI) over the same span — three of those
windows — after a warm-up of a tenth of it. Both take throughput and p99 latency from the send time (perf_analyzer's
definition; in a closed loop the intended time is the send time anyway).

Ratios serving-bench / perf_analyzer are taken per trial and printed as the median with its range (min..max);
agreement = both medians within 5 %. A throughput above what the server can do at that concurrency (every request in
flight in one batch, nothing but the model's sleep: c / (2 + 0.2 min(c, 8)) ms) or below the lowest the same client
reached at the previous, lower concurrency in this run is reported as unreliable and gives no ratio; a perf_analyzer
point without a stable window is recorded as unstable. ``--quick`` (about 2 minutes) and the full run (about 5)
measure the same way with shorter windows: their ratios agree within 15 %. Beside each side's figures: the server's
requests per executed batch during its runs (Triton's counters), which sets this model's throughput at a given
concurrency; and per request, the server's time (receipt to response) and the time outside it (c / throughput, the
round trip by Little's law, less the server's time): the client's own cost and the wire, where two clients of one
server differ (2026-12-02, 2-core VM: perf_analyzer 425 / 619 / 815 us at c = 1 / 4 / 8, serving-bench 162 / 288 /
408 us, while the server's times agreed within 6 %: the throughput ratios above 1 are perf_analyzer's heavier
client). Writes ``benchmarks/results/vs_perf_analyzer[_quick]_<date>_<host>.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from dataclasses import asdict
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving_bench.peers.report import (Figure, Spread, compare, figure, interleave, ratio_line,  # noqa: E402
                                        write_result)
from serving_bench.export.sleep import write_sleep_entry  # noqa: E402
from serving_bench.load.driver import SendOptions, TritonTarget  # noqa: E402
from serving_bench.load.native import choose_sender  # noqa: E402
from serving_bench.peers.perf_analyzer import (Level, PeerMissing, Windows, find_perf_analyzer,  # noqa: E402
                                           span_s)
from serving_bench.run.metrics import summarize  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.run.target import ClosedLoop  # noqa: E402
from serving_bench.serve.control import Control, stats_delta  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402

MODEL = "sleep_bench"
SLEEP = {"base_ms": 2.0, "per_item_ms": 0.2, "max_batch_size": 8}
LEVELS = (1, 4, 8)
PA_STABILITY_PCT, PA_MAX_TRIALS = 20.0, 5
AGREE = 0.05


def ceiling_ips(concurrency: int) -> float:
    """The most the server can deliver at ``concurrency``: all of it in one batch, nothing but the model's sleep."""
    items = min(concurrency, SLEEP["max_batch_size"])
    return 1e3 * concurrency / (SLEEP["base_ms"] + SLEEP["per_item_ms"] * items)


def ours(url: str, concurrency: int, span: float) -> dict:
    """serving-bench's closed loop: ``span`` seconds measured after a warm-up of a tenth of it."""
    n = 200000
    warm = 0.1 * span
    rng = np.random.default_rng(concurrency)
    schedule = Schedule(np.zeros(n), np.zeros(n), (MODEL,), rng.integers(0, 16, n), np.ones(n),
                        {"duration_s": warm + span, "warmup_s": warm, "cooldown_s": 0.0})
    # one sender process, like the CLI's default and like perf_analyzer (a process of its own)
    records = TritonTarget(url, mode=ClosedLoop(concurrency, warm + span), send=SendOptions(senders=1)).run(schedule)
    s = summarize(records)["overall"]
    return {"throughput_ips": s["throughput_ips"], "p50_s": s["service_p50_s"], "p99_s": s["service_p99_s"],
            "requests": s["counts"]["ok"], "failed": s["counts"]["failed"] + s["counts"]["timeout"]}


def peer(pa, url: str, concurrency: int, measurement_s: float) -> dict:
    m = pa.measure(MODEL, url, Level(concurrency=concurrency, async_mode=False),
                   Windows(measurement_s=measurement_s, stability_pct=PA_STABILITY_PCT, max_trials=PA_MAX_TRIALS,
                           stabilize_on_p99=False))
    return {"throughput_ips": m.throughput_ips, "p50_s": m.p50_s, "p99_s": m.p99_s, "requests": m.request_count}


def with_server_figures(url: str, run: Callable[[], dict]) -> dict:
    """``run()``'s figures plus, from Triton's counters before and after (warm-up and perf_analyzer's unstable
    windows included), the server's requests per executed batch (``mean_exec_batch``: how the side's requests fell
    into the dynamic batcher's batches, which sets this model's throughput at a given concurrency) and its mean time
    per request from receipt to response (``server_s``, s)."""
    with Control(url) as control:
        before = control.statistics([MODEL])
        out = run()
        delta = stats_delta(before, control.statistics([MODEL]))[MODEL]
    return {**out, "mean_exec_batch": delta["mean_exec_batch"], "server_s": delta["success_mean_s"]}


def outside_server_us(result: dict, concurrency: int) -> float | None:
    """A trial's mean time per request outside the server (us): its round trip by Little's law (``concurrency`` /
    throughput: every request in flight all the time in a closed loop) less the server's time per request. It is the
    client's own cost plus the wire, the part in which two clients of the same server may differ."""
    if not result.get("throughput_ips") or not result.get("server_s"):
        return None
    return 1e6 * (concurrency / result["throughput_ips"] - result["server_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1-second windows (about 2 minutes)")
    parser.add_argument("--trials", type=int, default=3, help="trials per side and concurrency (default 3)")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    sender_note = choose_sender(None)[1]
    print(sender_note, flush=True)
    measurement_s = 1.0 if args.quick else 3.0
    span = span_s(measurement_s)
    t_start = time.perf_counter()
    try:
        pa = find_perf_analyzer()
    except PeerMissing as err:
        print(f"perf_analyzer unavailable: {err}")
        return 1
    rows = []
    floor: dict[str, float | None] = {"serving_bench": None, "perf_analyzer": None}
    with tempfile.TemporaryDirectory() as tmp:
        write_sleep_entry(tmp, MODEL, **SLEEP)
        with TritonServer(tmp) as server:
            url = server.endpoints.grpc_url
            ours(url, 2, 1.0)  # warm up
            for c in LEVELS:
                runs = interleave(args.trials, {
                    "perf_analyzer": lambda k, c=c: with_server_figures(url, lambda: peer(pa, url, c, measurement_s)),
                    "serving_bench": lambda k, c=c: with_server_figures(url, lambda: ours(url, c, span))})
                judged = {}
                for side, results in runs.items():
                    tput = [figure(r.get("throughput_ips"), floor=floor[side], ceiling=ceiling_ips(c),
                                   why_floor=" infer/s, the least it reached at a lower concurrency in this run",
                                   why_ceiling=" infer/s, the server's limit at this concurrency",
                                   missing=r.get("unstable", "no figure")) for r in results]
                    p99 = [Figure(r["p99_s"] * 1e3 if r.get("p99_s") else None, f.unreliable)  # ms
                           for r, f in zip(results, tput)]
                    judged[side] = (tput, p99)
                    usable = [f.value for f in tput if f.usable]
                    floor[side] = min(usable) if usable else floor[side]
                row = {"concurrency": c, "trials": runs,
                       "throughput": compare(judged["serving_bench"][0], judged["perf_analyzer"][0]),
                       "p99": compare(judged["serving_bench"][1], judged["perf_analyzer"][1])}
                medians = [row[k]["ratio"]["median"] for k in ("throughput", "p99")]
                row["agree_within_5pct"] = all(m is not None and abs(m - 1) <= AGREE for m in medians)
                rows.append(row)
                print(f"concurrency {c}: " + ratio_line("throughput", row["throughput"], unit="infer/s",
                                                         target="1 +- 0.05"), flush=True)
                print(f"concurrency {c}: " + ratio_line("p99 latency", row["p99"], unit="ms", target="1 +- 0.05",
                                                         digits=2), flush=True)
                row["mean_exec_batch"] = {side: asdict(Spread.of([r["mean_exec_batch"] for r in results
                                                                  if r.get("mean_exec_batch")]))
                                          for side, results in runs.items()}
                print(f"concurrency {c}: requests per executed batch, median (min..max): " + ", ".join(
                    f"{side} {Spread(**s).text(2)}" for side, s in row["mean_exec_batch"].items()), flush=True)
                for key, of in (("server_us", lambda r: 1e6 * r["server_s"] if r.get("server_s") else None),
                                ("outside_server_us", lambda r, c=c: outside_server_us(r, c))):
                    row[key] = {side: asdict(Spread.of([v for v in map(of, results) if v is not None]))
                                for side, results in runs.items()}
                print(f"concurrency {c}: per request, median (min..max) us: in the server " + ", ".join(
                    f"{side} {Spread(**s).text(0)}" for side, s in row["server_us"].items()) + "; outside it "
                    "(the client and the wire: c / throughput less the server's time) " + ", ".join(
                    f"{side} {Spread(**s).text(0)}" for side, s in row["outside_server_us"].items()), flush=True)
    data = {"benchmark": "vs_perf_analyzer", "model": MODEL, "sleep": SLEEP, "quick": args.quick,
            "trials": args.trials, "perf_analyzer_measurement_s": measurement_s, "span_s": span,
            "perf_analyzer_stability_pct": PA_STABILITY_PCT, "perf_analyzer_max_trials": PA_MAX_TRIALS,
            "perf_analyzer": pa.version(), "sender": sender_note, "rows": rows,
            "wall_s": time.perf_counter() - t_start}
    path = write_result("vs_perf_analyzer", data, quick=args.quick, out_dir=args.out)
    print(f"wrote {path} ({data['wall_s']:.0f} s)")

    def ratios(key: str) -> str:
        return ", ".join(f"c={r['concurrency']} {Spread(**r[key]['ratio']).text(3)}" for r in rows)

    agree = [str(r["concurrency"]) for r in rows if r["agree_within_5pct"]]
    print(f"closed loop vs perf_analyzer, ratio median (min..max) over {args.trials} trials: throughput "
          f"{ratios('throughput')}; p99 {ratios('p99')}; both within 5 % at concurrency "
          f"{', '.join(agree) or 'none'} of {', '.join(str(c) for c in LEVELS)} (target: all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
