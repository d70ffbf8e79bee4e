#!/usr/bin/env python3
"""Could a short reference run before a replay tell how fast the host will serve it? (About 6 minutes.)

Two tiny entries (``tiny_cnn_onnxruntime``, ``tiny_mlp_torchscript``; one instance, one thread each) on one embedded
tritonserver. Every ``--every`` seconds: a closed loop of one-row requests at concurrency 1 on each alone, then on
both at once, ``--window`` seconds each. It prints each window's mean latency (ms), and over the windows each
series' coefficient of variation, its lag-1 autocorrelation (how much one window tells of the next) and how the two
entries' solo windows correlate (a shared host speed). A reference is worth taking only where the windows are
correlated in time; where they are not, dividing a replay's prediction by a reference adds the reference's own noise.

What it showed on the 2-core VM (2026-12-05, quiet: raw CPU speed — a Python loop, a 64x64 matmul, the ONNX Runtime
sessions in process — stayed within 0.5 % over 8 minutes outside one 15 s disturbance; docs/notes/sim-history.md#fidelity-and-what-is-noise): 30 windows of 2 s, the solo means varied by 4.0-5.7 % (CV), with lag-1 autocorrelation
0.01 and 0.22 and a correlation of 0.25 between the two entries; the co-located means by 5.3 % and 12.8 %, lag-1 0.43
and 0.14, drifting down by about 10 % over the 6 minutes.

    .venv/bin/python scripts/diagnostics/repro_speed_windows.py [--repo model_repo] [--minutes 6] [--window 2]
        [--every 12]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving_bench.calibrate.session import ServerSetup, open_session  # noqa: E402

MODELS = ("tiny_cnn_onnxruntime", "tiny_mlp_torchscript")


def lag1(x: np.ndarray) -> float:
    """Lag-1 autocorrelation of a series."""
    x = x - x.mean()
    return float((x[1:] * x[:-1]).sum() / (x * x).sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", default="model_repo", help="a repository holding both entries (make demo's)")
    parser.add_argument("--minutes", type=float, default=6.0, help="how long to sample (default 6)")
    parser.add_argument("--window", type=float, default=2.0, help="seconds per closed loop (default 2)")
    parser.add_argument("--every", type=float, default=12.0, help="seconds from one round's start to the next's")
    args = parser.parse_args(argv)
    series: dict[str, list[float]] = {}
    with open_session(ServerSetup(Path(args.repo), tuple(MODELS)), [], print) as session:
        start = time.monotonic()
        print(f"{'s':>6} " + " ".join(f"{m[:14] + ' alone':>20}" for m in MODELS) + " "
              + " ".join(f"{m[:14] + ' both':>20}" for m in MODELS))
        while time.monotonic() - start < args.minutes * 60:
            round_start = time.monotonic()
            row = {f"{m} alone": float(np.mean(session.run({m: (1, 1)}, args.window).latency[m])) for m in MODELS}
            both = session.run({m: (1, 1) for m in MODELS}, args.window)
            row.update({f"{m} both": float(np.mean(both.latency[m])) for m in MODELS})
            for key, value in row.items():
                series.setdefault(key, []).append(value)
            print(f"{round_start - start:6.1f} " + " ".join(f"{v * 1e3:20.3f}" for v in row.values()), flush=True)
            time.sleep(max(0.0, args.every - (time.monotonic() - round_start)))
    if len(next(iter(series.values()))) < 3:
        print("too few windows to judge")
        return 1
    for key, values in series.items():
        x = np.asarray(values)
        print(f"{key:<32} CV {x.std() / x.mean() * 100:5.1f} %   lag-1 autocorrelation {lag1(x):+.2f}")
    a, b = (np.asarray(series[f"{m} alone"]) for m in MODELS)
    print(f"the two entries' solo windows correlate by {np.corrcoef(a, b)[0, 1]:+.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
