#!/usr/bin/env python3
"""Reproduce how the host's CPU per request falls as the host gets busy, with and without batching (about a minute).

One model (``tiny_cnn`` on ONNX Runtime, CPU) with 8 instances on the embedded tritonserver, a closed loop of k
clients for k = 1, 2, 4, 8, twice: with dynamic batching (as exported) and without it (every executed batch is one
request). Per run it prints the answered requests per second, the host's CPU seconds per answered request (server,
runners and this client: what the profile's per-request / per-batch split ``c_r + c_b / n`` is fitted to) and the
requests per executed batch ``n`` (from the runners' execution log).

What it shows on the 2-core VM (2026-12-02, two runs at 06:00 and 06:30): without batching ``n`` is 1 throughout,
and the CPU per request still falls with k (k = 2 / 4 / 8: 1.17 / 0.93 / 0.77 ms, then 1.08 / 0.96 / 0.74 ms), by
about as much as with batching (1.03 / 0.80 / 0.63 ms at ``n`` 1.18 / 1.59 / 2.52). So part of what the split
attributes to batching is the host being busy: threads that find work waiting are not put to sleep and woken again
(on a VM, waking an idle virtual CPU costs a hypervisor exit). Each run's k = 1 is sometimes twice as slow as usual
(432 and 582 req/s against 850-1,000; its CPU per request doubles too): a slow mode of this VM that a first server
start after an export sometimes meets, not understood. See docs/notes/sim-history.md#fidelity-and-what-is-noise.

    .venv/bin/python scripts/diagnostics/repro_busy_host_cpu.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving_bench.export.api import export_models, settle_after_export  # noqa: E402
from serving_bench.export.frameworks import ExportOptions  # noqa: E402
from serving_bench.export.repository import CONFIG_NAME, entry_dir  # noqa: E402
from serving_bench.calibrate.session import Session  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402
from serving_bench.telemetry.cpu import StealClock  # noqa: E402

MODEL = "tiny_cnn_onnxruntime"
INSTANCES = 8
CLIENTS = (1, 2, 4, 8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each closed-loop run (s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="busy-host-cpu-") as tmp:
        repo = Path(tmp) / "repo"
        export_models(["tiny_cnn"], ["onnxruntime"], repo, options=ExportOptions(max_batch_size=8))
        settle_after_export(time.perf_counter(), print)
        config = entry_dir(repo, MODEL) / CONFIG_NAME
        exported = config.read_text()
        steal = StealClock()
        for variant in ("dynamic batching", "no batching"):
            if variant == "no batching":
                config.write_text(re.sub(r"dynamic_batching\s*\{[^}]*\}", "", exported))
            with TritonServer(repo, models=[MODEL], instances={MODEL: INSTANCES}, execution_log=True) as server:
                session = Session(server.endpoints, server)
                for k in CLIENTS:
                    run = session.run({MODEL: (1, k)}, args.seconds)
                    answered = len(run.latency[MODEL])
                    per_batch = answered / max(len(run.executions[MODEL].start_s), 1)
                    print(f"{variant:<16} k = {k}: {answered / args.seconds:6.0f} req/s, "
                          f"{run.cpu_s / answered * 1e3:.3f} ms of host CPU per request, "
                          f"{per_batch:.2f} requests per batch", flush=True)
        print(steal.sentence())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
