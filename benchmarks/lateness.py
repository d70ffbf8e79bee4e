"""Send lateness and the highest sustained open-loop rate: serving-bench vs perf_analyzer 2.50, same run, same
criterion.

    .venv/bin/python benchmarks/lateness.py [--quick] [--trials N] [--senders 0,1,2] [--search-senders 1]
        [--sender auto|native|python] [--out DIR]

One tritonserver (127.0.0.1) serves ``sleep_zero`` (no service time: the client is the limit). Every measurement of
either side is one *step*: Poisson arrivals at a rate over the same span — perf_analyzer's three time windows
(``-a``, ``--measurement-interval`` 600 ms, ``--max-trials 3``: 3 x 0.72 s = 2.16 s; its own stability gate opened
to ``-s 100`` so that it always reports those three windows) and a 2.16-second schedule of ours — judged by one
criterion (:mod:`serving_bench.peers.sustain`): among the requests that ended inside the span, none failed, at
most 1 % left more than 1 ms late (perf_analyzer's "delayed" warning; our lateness p99 <= 1 ms) and at least
``rate*T - 3*sqrt(rate*T)`` were delivered (Poisson count noise allowed, z = 3).

1. Fixed rates: serving-bench at 500, 1,000 and 2,000 req/s with each ``--senders`` count (send lateness p50 / p99 /
   max; target p99 <= 1 ms), perf_analyzer at the same rates.
2. Highest sustained rate, ``--trials`` times per side, the sides interleaved (ours, peer; peer, ours; ...).
   Trial 1 starts at the side's highest fixed-rate success and steps by 1.25x (by 2x from 500 req/s if none),
   later trials start at the side's previous result and step by 5 %; the step grows while the search keeps moving
   the same way, until a sustained rate and a failed one bracket the answer; then bisection to 5 %. A failed step is
   measured again before it counts (one noisy miss does not walk the search down). At most 12 steps per trial and
   side; a search still open then is reported, not compared. serving-bench runs with ``--search-senders`` sender
   processes (1: the CLI's default) of the kind ``--sender`` names (auto, the default: native where it builds).
3. Ratio = ours / perf_analyzer per trial; printed last as the median with its range over the trials. A trial's
   figure below the highest fixed rate the same side sustained in step 1 contradicts this run's own evidence: it is
   reported as unreliable and gives no ratio. Target >= 1.0.

``--quick`` (3 trials, one sender count; about 2 minutes) and the full run (5 trials, senders 0, 1 and 2 in step 1;
about 4 minutes) take every step the same way, so their ratios differ only by trial noise (within 15 % on a quiet
machine). Both clients share the 2-core machine with the server: run it on a quiet machine; the load average is
recorded. Writes ``benchmarks/results/lateness[_quick]_<date>_<host>.json``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving_bench.peers.report import compare, figure, interleave, ratio_line, write_result  # noqa: E402  (first)
from serving_bench.export.sleep import write_sleep_entry  # noqa: E402
from serving_bench.load.driver import SendOptions, TritonTarget  # noqa: E402
from serving_bench.load.native import choose_sender  # noqa: E402
from serving_bench.peers.perf_analyzer import (DELAY_TOLERANCE_S, STABILITY_WINDOWS,  # noqa: E402
                                               Level, PeerMissing, Unstable, Windows, find_perf_analyzer, span_s)
from serving_bench.peers.sustain import Delivery, judge, max_sustained  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402

MODEL = "sleep_zero"
MEASUREMENT_S = 0.6  # perf_analyzer's --measurement-interval
SPAN_S = span_s(MEASUREMENT_S)  # what both sides are judged on: 2.16 s
PA_STABILITY_PCT = 100.0  # perf_analyzer's own gate opened wide: the shared criterion decides
RATES = (500.0, 1000.0, 2000.0)
TOLERANCE = 0.05
FIRST_STEP, NEXT_STEP = 1.25, 1 + TOLERANCE  # from the best fixed-rate success; from the previous trial's figure
BLIND_STEP = 2.0  # trial 1 when no fixed rate was sustained
MAX_STEPS = 12  # per trial and side: a search still open after that is reported, not compared
SEEDS = itertools.count(1)  # a fresh Poisson draw for every step of ours, numbered within the run


def poisson(rate: float, duration: float, seed: int) -> Schedule:
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate * duration))
    return Schedule(np.sort(rng.random(n) * duration), np.zeros(n), (MODEL,), rng.integers(0, 16, n),
                    np.ones(n), {"seed": seed, "duration_s": duration})


def ours(url: str, rate: float, senders: int, sender: str) -> dict:
    """One step of serving-bench (``senders`` processes of the ``sender`` kind): a Poisson schedule over the span,
    judged on the requests that ended inside it."""
    seed = next(SEEDS)
    schedule = poisson(rate, SPAN_S, seed)
    records = TritonTarget(url, send=SendOptions(senders=senders, sender=sender)).run(schedule)
    table = records.table
    ok = (table["status"].astype(str) == "ok").to_numpy()
    done = table["done_s"].to_numpy()
    inside = ok & (done >= 0) & (done < SPAN_S)
    late = (table["sent_s"] - table["intended_s"]).to_numpy()[inside]
    delivery = Delivery(rate, SPAN_S, int(inside.sum()),
                        100.0 * float(np.mean(late > DELAY_TOLERANCE_S)) if late.size else None, int((~ok).sum()))
    row = {"side": "serving_bench", "rate": rate, "senders": senders, "sender": records.info.sender, "seed": seed,
           "requests": len(schedule), "delivered": delivery.delivered, "span_s": SPAN_S, "failed": delivery.failed,
           "delayed_pct": delivery.delayed_pct,
           "sender_cpu_us_per_request": 1e6 * records.info.sender_cpu_s / max(1, len(schedule))}
    if late.size:
        row.update(lateness_p50_s=float(np.percentile(late, 50)), lateness_p99_s=float(np.percentile(late, 99)),
                   lateness_max_s=float(late.max()))
    return {**row, **judge(delivery)}


def peer(pa, url: str, rate: float) -> dict:
    """One step of perf_analyzer ``-a`` (Poisson request rate): its three merged windows, judged the same way."""
    row = {"side": "perf_analyzer", "rate": rate}
    try:
        m = pa.measure(MODEL, url, Level(request_rate=rate, async_mode=True, distribution="poisson"),
                       Windows(measurement_s=MEASUREMENT_S, stability_pct=PA_STABILITY_PCT,
                               max_trials=STABILITY_WINDOWS))
    except Unstable as err:
        return {**row, "unstable": str(err), "sustained": False, "clear_miss": False, "why": "unstable"}
    except RuntimeError as err:  # it exits non-zero when requests fail
        return {**row, "error": str(err), "sustained": False, "clear_miss": False, "why": "perf_analyzer failed"}
    delivered = m.request_count if m.request_count is not None else round(m.throughput_ips * SPAN_S)
    span = delivered / m.throughput_ips if m.throughput_ips > 0 else SPAN_S
    delivery = Delivery(rate, span, delivered, m.delayed_pct)
    return {**row, "delivered": delivered, "span_s": span, "throughput_rps": m.throughput_ips,
            "delayed_pct": m.delayed_pct, "p99_s": m.p99_s, **judge(delivery)}


def describe(row: dict) -> str:
    late = row.get("delayed_pct")
    text = f"{row.get('delivered', 0)} delivered, " + ("<= 1 % late" if late is None else f"{late:.1f} % late")
    if "lateness_p99_s" in row:
        text += (f" (lateness p50 {row['lateness_p50_s'] * 1e3:.3f} / p99 {row['lateness_p99_s'] * 1e3:.3f} / max "
                 f"{row['lateness_max_s'] * 1e3:.2f} ms, sender CPU {row['sender_cpu_us_per_request']:.0f} us/req)")
    return f"{text}: {row['why']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 trials, one sender count (about 2 minutes)")
    parser.add_argument("--trials", type=int, help="trials per side (default 3 with --quick, else 5)")
    parser.add_argument("--senders", help="sender process counts for the fixed rates (0 = a thread of this process; "
                                          "comma-separated; default 0,1,2, with --quick the search's)")
    parser.add_argument("--search-senders", type=int, default=1,
                        help="sender processes of serving-bench in the search (default 1, the CLI's default)")
    parser.add_argument("--sender", choices=["auto", "native", "python"], default="auto",
                        help="serving-bench's sender (default auto: native where it builds, else python)")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    sender, sender_note = choose_sender(args.sender)
    print(sender_note, flush=True)
    trials = args.trials or (3 if args.quick else 5)
    senders = [int(s) for s in (args.senders or (str(args.search_senders) if args.quick else "0,1,2")).split(",")]
    if args.search_senders not in senders:
        senders.append(args.search_senders)
    t_start = time.perf_counter()
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
            # warm the server and the client libraries
            TritonTarget(url, send=SendOptions(sender=sender)).run(poisson(500, 1.0, 0))
            fixed = []
            for rate in RATES:
                for s in senders:
                    row = ours(url, rate, s, sender)
                    fixed.append(row)
                    print(f"{rate:6.0f} req/s, serving-bench ({s} sender(s)): {describe(row)}", flush=True)
                if pa is not None:
                    row = peer(pa, url, rate)
                    fixed.append(row)
                    print(f"{rate:6.0f} req/s, perf_analyzer -a: {describe(row)}", flush=True)

            def best_fixed(side: str) -> float | None:
                return max((r["rate"] for r in fixed if r["side"] == side and r["sustained"]
                            and r.get("senders", args.search_senders) == args.search_senders), default=None)

            floor = {"serving_bench": best_fixed("serving_bench"), "perf_analyzer": best_fixed("perf_analyzer")}
            probes = {"serving_bench": lambda r: ours(url, r, args.search_senders, sender)}
            if pa is not None:
                probes["perf_analyzer"] = lambda r: peer(pa, url, r)
            previous: dict[str, float | None] = {}

            def trial(side: str):
                def run(k: int) -> dict:
                    start, step = ((previous[side], NEXT_STEP) if previous.get(side) else
                                   (floor[side], FIRST_STEP) if floor[side] else (RATES[0], BLIND_STEP))
                    t0 = time.perf_counter()
                    found = max_sustained(probes[side], start, step=step, tolerance=TOLERANCE, max_steps=MAX_STEPS)
                    previous[side] = found.rate
                    print(f"trial {k + 1}, {side}: max sustained {found.rate} req/s (failed at {found.failed_at}; "
                          f"{len(found.steps)} steps from {start:.0f}"
                          f"{'' if found.converged else ', stopped before converging'}, "
                          f"{time.perf_counter() - t0:.0f} s)", flush=True)
                    return {"start": start, "rate": found.rate, "failed_at": found.failed_at,
                            "converged": found.converged, "steps": found.steps, "seconds": time.perf_counter() - t0}
                return run

            runs = interleave(trials, {side: trial(side) for side in probes})

    def figures(side: str) -> list:
        why = " req/s, which it sustained in the fixed-rate steps of this run"
        out = []
        for r in runs.get(side) or [None] * trials:
            if r is None:
                out.append(figure(None, missing="perf_analyzer unavailable"))
            elif r.get("converged") is False:
                out.append(figure(None, missing=f"search still open after {MAX_STEPS} steps (sustained "
                                                f"{r['rate']}, failed at {r['failed_at']} req/s)"))
            else:
                out.append(figure(r.get("rate"), floor=floor[side], why_floor=why, missing="sustained no rate"))
        return out

    cmp = compare(figures("serving_bench"), figures("perf_analyzer"))
    data = {"benchmark": "lateness", "model": MODEL, "quick": args.quick, "trials": trials,
            "span_s": SPAN_S, "perf_analyzer_measurement_s": MEASUREMENT_S, "perf_analyzer_stability_pct":
            PA_STABILITY_PCT, "tolerance": TOLERANCE, "search_senders": args.search_senders, "sender": sender_note,
            "perf_analyzer": pa_version, "fixed_rates": fixed, "plausible_floor_rps": floor,
            "max_sustained": runs, "comparison": cmp, "target_ratio": 1.0,
            "lateness_target_p99_s": DELAY_TOLERANCE_S, "wall_s": time.perf_counter() - t_start}
    path = write_result("lateness", data, quick=args.quick, out_dir=args.out)
    print(f"wrote {path} ({data['wall_s']:.0f} s)")
    print(ratio_line("max sustained open-loop rate", cmp, unit="req/s", target=">= 1.0"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
