#!/usr/bin/env python3
"""What being preempted costs a long execution: resnet50 on ONNX Runtime (one thread, pinned to core 0), its CPU and
wall time per inference alone and beside other work.

Beside: a busy loop on core 1 (shared caches, memory bandwidth, a hidden SMT sibling), a busy loop on core 0 (the
core time-shared in long slices), and *wakers* that run a few microseconds every few hundred on core 0 or 1 (many
preemptions, little CPU). The CPU per inference rising with the times it was put on a core (``slices``, from
``/proc/thread-self/schedstat``) is the price of a preemption (caches refilled); rising beside the busy loop on
core 1, the price of a neighbour. Each figure is the median of ``--runs`` inferences, every case twice.

    .venv/bin/python scripts/diagnostics/repro_preemption_cost.py --model REPO/resnet50_onnxruntime/1/model.onnx \
        [--runs 20]

(``benchmarks/colocation_fidelity.py`` and ``scripts/diagnostics/load_phases.py`` export that repository; a host of at
least 2 cores.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BUSY = "import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
WAKER = ("import os, time\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    t = time.perf_counter()\n"
         "    while time.perf_counter() - t < {run_s}:\n        pass\n    time.sleep({sleep_s})\n")
BESIDE = (("alone", None),
          ("busy loop on core 1", BUSY.format(core=1)),
          ("busy loop on core 0 (its own core)", BUSY.format(core=0)),
          ("waker 20 us every ~200 us on core 0", WAKER.format(core=0, run_s=20e-6, sleep_s=150e-6)),
          ("waker 100 us every ~1 ms on core 0", WAKER.format(core=0, run_s=100e-6, sleep_s=0.9e-3)),
          ("waker 20 us every ~200 us on core 1", WAKER.format(core=1, run_s=20e-6, sleep_s=150e-6)))


def slices() -> int:
    """Times this thread has been put on a core so far."""
    return int(Path("/proc/thread-self/schedstat").read_text().split()[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="resnet50's model.onnx (or any ONNX model)")
    parser.add_argument("--runs", type=int, default=20, help="inferences per case (default 20)")
    args = parser.parse_args()
    if not args.model.is_file():
        parser.error(f"--model: {args.model} is not a file")
    if args.runs < 1:
        parser.error(f"--runs: expected at least 1, got {args.runs}")
    if (os.cpu_count() or 1) < 2:
        parser.error("this host has one core: the cases need two")
    import onnxruntime as ort

    os.sched_setaffinity(0, {0})
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(args.model), options, providers=["CPUExecutionProvider"])
    first = session.get_inputs()[0]
    shape = [1] + [d if isinstance(d, int) else 1 for d in first.shape[1:]]
    feed = {first.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    for _ in range(5):
        session.run(None, feed)
    print(f"# scripts/diagnostics/repro_preemption_cost.py --model {args.model.name}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC')}, median of {args.runs} inferences")
    print(f"{'beside':40s} {'CPU ms':>8s} {'wall ms':>8s} {'slices':>7s}")
    for _ in range(2):
        for label, code in BESIDE:
            other = subprocess.Popen([sys.executable, "-c", code]) if code else None
            try:
                time.sleep(1.0 if other else 0.0)
                cpu, wall, put = [], [], []
                for _ in range(args.runs):
                    s0, c0, t0 = slices(), time.thread_time(), time.perf_counter()
                    session.run(None, feed)
                    cpu.append(time.thread_time() - c0)
                    wall.append(time.perf_counter() - t0)
                    put.append(slices() - s0)
            finally:
                if other:
                    other.kill()
                    other.wait()
            print(f"{label:40s} {np.median(cpu) * 1e3:8.2f} {np.median(wall) * 1e3:8.2f} {np.median(put):7.0f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
