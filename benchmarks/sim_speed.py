"""Simulator speed: simulated requests per second of CPU time on one core, against a naive SimPy M/M/1.

Scenario: 4 models co-located on one GPU (the bundled H200 torch-eager profile: resnet50, mobilenet_v3_large,
efficientnet_b0, bert_base, fp16), each with Triton's dynamic batcher (max_batch_size 64, max_queue_delay 200 us,
2 instances), Poisson traffic at three loads. The engine's work is per executed batch (and per event of the shared
device), not per request, so requests per second grow with the batch size: at load 0.3 batches hold ~5 requests and
all 8 instances share the device (every batch start and end re-rates 8 running batches), at 0.9 ~64. The baseline
is the textbook SimPy M/M/1 with one process per request, timed in the same run on the same machine.

Times are CPU seconds of this process (``time.process_time``): on a shared machine wall time also counts other
processes' turns; the ratio to the baseline is what carries over between machines.

    .venv/bin/python benchmarks/sim_speed.py [--quick] [--out benchmarks/results/sim_speed_<date>_<host>.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import simpy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving_bench.profiles.importers import import_h200_eager  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.serving_config import ModelServing, ServingConfig  # noqa: E402
from serving_bench.sim.target import SimTarget  # noqa: E402

MODELS = ("resnet50_fp16", "mobilenet_v3_large_fp16", "efficientnet_b0_fp16", "bert_base_fp16")


def naive_mm1(n: int, seed: int = 0) -> float:
    """Requests per second of a SimPy M/M/1 with one process per request (rho = 0.8)."""
    env = simpy.Environment()
    server = simpy.Resource(env, capacity=1)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / 0.8, n)
    service = rng.exponential(1.0, n)
    done = []

    def request(i):
        with server.request() as req:
            yield req
            yield env.timeout(service[i])
        done.append(env.now)

    def source():
        for i in range(n):
            yield env.timeout(gaps[i])
            env.process(request(i))

    env.process(source())
    t0 = time.process_time()
    env.run()
    return n / (time.process_time() - t0)


def scenario(load: float, n: int, seed: int = 0):
    profile = import_h200_eager()
    config = ServingConfig(tuple(ModelServing(m, max_batch_size=64, dynamic_batching=True, max_queue_delay_us=200,
                                              instances=(("gpu0", 2),)) for m in MODELS))
    # capacity of each model alone at batch 64 on its 2 instances, shared by 4 models on one device
    cap = sum(64 / profile.models[m].devices["gpu0"].batches[64].median for m in MODELS) / len(MODELS) / 4 * 2
    rate = load * cap * len(MODELS)
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    sched = Schedule(t, rng.integers(0, len(MODELS), n), MODELS, np.zeros(n), np.ones(n), {"duration_s": float(t[-1])})
    return SimTarget(profile, config, seed=seed), sched, rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    n = 200_000 if args.quick else 2_000_000
    baseline = max(naive_mm1(n // 4, seed) for seed in range(2))
    rows = []
    for load in (0.3, 0.6, 0.9):
        target, sched, rate = scenario(load, n)
        best = 0.0
        for _ in range(2 if args.quick else 3):
            t0 = time.process_time()
            records = target.run(sched)
            best = max(best, n / (time.process_time() - t0))
        batch = records.info.sim.items_per_execution
        batch = float(np.mean([v for v in batch.values() if v]))
        util = records.info.sim.device_busy_s["gpu0"] / records.info.sim.duration_s
        rows.append({"load": load, "rate_rps": rate, "requests": n, "sim_requests_per_s": best,
                     "ratio_to_naive_simpy": best / baseline, "mean_exec_batch": batch, "gpu_busy": util})
        print(f"load {load:.1f} ({rate:,.0f} req/s offered): {best:,.0f} simulated req/s "
              f"({best / baseline:.1f}x naive SimPy M/M/1), {batch:.1f} requests per batch, device busy {util:.2f}")
    print(f"naive SimPy M/M/1 (one process per request): {baseline:,.0f} req/s")
    result = {"date": date.today().isoformat(), "host": socket.gethostname(), "cpu": platform.processor(),
              "python": platform.python_version(), "loadavg": os.getloadavg(), "clock": "CPU seconds (process_time)",
              "naive_simpy_mm1_rps": baseline, "scenarios": rows, "quick": args.quick}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
