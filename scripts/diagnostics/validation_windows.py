#!/usr/bin/env python3
"""Where in a replay the measured tail happened: a validation's measured and simulated latency per time window.

Splits both sides' records of one schedule (the real replay and its simulation, as ``serving-bench validate`` or
``make demo`` write them) into windows of intended time and prints, per entry and window, the answered requests,
measured and simulated p50 / p99 / max (ms, from the intended time) and how many of the measured requests the load
generator sent more than 1 ms late. A window where the sender itself ran late is one where the host stalled (the
simulated client is never late, and at a demo's load the sender has a core to itself): a measured tail there that
the simulation lacks is the machine's, not the server model's.

    .venv/bin/python scripts/diagnostics/validation_windows.py [--real results/demo/replay]
        [--sim results/demo/validate/sim] [--window-s 3]

What it showed for the demo on the 2-core VM (2026-12-02, docs/notes/sim-history.md#host-stalls-set-the-demos-p99):
one half-second at 5.2-5.8 s in which requests were sent up to 12.5 ms late held most of each tiny model's measured
requests above its simulated p99; outside it the p99s agreed within a few percent.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving_bench.run.records import load_records  # noqa: E402

LATE_S = 1e-3  # a send this late means the sender did not get a core when it was due


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--real", default="results/demo/replay", help="the measured records' folder")
    parser.add_argument("--sim", default="results/demo/validate/sim", help="the simulated records' folder")
    parser.add_argument("--window-s", type=float, default=3.0, help="window length in seconds of intended time")
    args = parser.parse_args(argv)
    real, sim = load_records(args.real), load_records(args.sim)
    meta = real.info.meta
    start, end = float(meta.get("warmup_s", 0.0)), float(meta["duration_s"]) - float(meta.get("cooldown_s", 0.0))
    edges = np.append(np.arange(start, end, args.window_s), end)
    print(f"windows of {args.window_s:g} s from {start:g} to {end:g} s; latency in ms from the intended time")
    for name in sorted(real.table["model"].astype(str).unique()):
        print(name)
        for lo, hi in zip(edges[:-1], edges[1:]):
            cells = []
            for label, records in (("measured", real), ("simulated", sim)):
                t = records.table
                rows = t[(t["model"].astype(str) == name) & (t["status"].astype(str) == "ok")
                         & (t["intended_s"] >= lo) & (t["intended_s"] < hi)]
                latency = 1e3 * (rows["done_s"] - rows["intended_s"]).to_numpy()
                if not len(latency):
                    cells.append(f"{label} none")
                    continue
                cell = (f"{label} {len(latency):4d}: p50 {np.median(latency):6.2f} p99 "
                        f"{np.quantile(latency, 0.99):6.2f} max {latency.max():6.1f}")
                if label == "measured":
                    late = int(((rows["sent_s"] - rows["intended_s"]).to_numpy() > LATE_S).sum())
                    cell += f", {late:3d} sent late"
                cells.append(cell)
            print(f"  {lo:5.1f}-{hi:5.1f} s  " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
