#!/usr/bin/env python3
"""Reproduce how a request's phases move together on a 2-core host (about 1 minute).

``tiny_cnn`` on ONNX Runtime (one instance, one thread), one closed loop of one-row requests at concurrency 1 on the
embedded tritonserver with execution logs, each request matched to its batch as the profile matches them
(:func:`serving_bench.calibrate.estimators.phase_drift`): its way in (send to batch start), service and way out.
It prints, on normal scores (each phase's ranks mapped through the inverse normal CDF, so the marginals do not
matter), the correlation of the three phases of one request, the p99 of their sum measured against the same three
marginals drawn independently (what the simulator does today), and the correlation of the service of two requests
as a function of the time between them: how long the host stays slow or fast.

What it showed on the 2-core VM (2026-12-02, docs/notes/sim-history.md#the-hosts-speed-drifts-a-requests-phases-move-together): the phases of one
request correlate by 0.42-0.68; independent draws put the sum's p99 15-21 % low; two requests' services correlate by
0.57 0.5 ms apart, 0.24 at 5 ms, 0.16 at 10-20 ms and nothing from 50 ms on in a quiet run, and still 0.15 at 100 ms in
a run the hypervisor disturbed (4.9 % steal).

    .venv/bin/python scripts/diagnostics/repro_host_drift.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving_bench.export.api import export_models, settle_after_export  # noqa: E402
from serving_bench.export.frameworks import ExportOptions  # noqa: E402
from serving_bench.calibrate.estimators import phase_drift, service_and_overhead  # noqa: E402
from serving_bench.calibrate.session import ServerSetup, open_session  # noqa: E402
from serving_bench.telemetry.cpu import StealClock  # noqa: E402

MODEL = "tiny_cnn_onnxruntime"
LAGS_MS = (0.5, 1, 2, 5, 10, 20, 50, 100, 500)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the closed loop (default 10)")
    args = parser.parse_args(argv)
    steal = StealClock()
    with tempfile.TemporaryDirectory(prefix="repro-host-drift-") as tmp:
        repo = Path(tmp) / "repo"
        export_models(["tiny_cnn"], ["onnxruntime"], repo, options=ExportOptions(max_batch_size=8))
        settle_after_export(time.perf_counter(), print)
        with open_session(ServerSetup(repo, (MODEL,)), [], print) as session:
            run = session.run({MODEL: (1, 1)}, args.seconds)
    drift = phase_drift(run, MODEL, 0.0, LAGS_MS)
    if drift is None:
        print("the server logged too few batches to match")
        return 1
    service, way_out, way_in = service_and_overhead(run, MODEL, 0.0)
    total = way_in + service + way_out
    rng = np.random.default_rng(1)
    independent = sum(np.sort(x)[rng.integers(0, len(x), 200_000)] for x in (way_in, service, way_out))
    p99, p99_independent = np.quantile(total, 0.99), np.quantile(independent, 0.99)
    print(f"{len(total)} requests over {args.seconds:g} s; one request's phases: corr(in, service) "
          f"{drift['in_service']:.2f}, corr(in, out) {drift['in_out']:.2f}, corr(service, out) "
          f"{drift['service_out']:.2f}")
    print(f"the sum of the three: p50 {np.median(total) * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms measured; drawn "
          f"independently p99 {p99_independent * 1e3:.3f} ms ({100 * (p99_independent / p99 - 1):+.1f} %)")
    for lag, correlation in drift["service_by_lag_ms"].items():  # each request against the first one lag later
        print(f"services {float(lag):5.1f} ms apart: correlation {correlation:+.2f}")
    print(steal.sentence())
    return 0


if __name__ == "__main__":
    sys.exit(main())
