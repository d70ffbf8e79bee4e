"""Simulator speed: simulated requests and executed batches per second of CPU time on one core, against a naive
SimPy M/M/1.

Scenarios, on the bundled H200 profile (torch eager, fp16: resnet50, mobilenet_v3_large, efficientnet_b0, bert_base),
the four models co-located on one GPU with 2 instances each:

* ``dynamic``: Triton's dynamic batcher (max_batch_size 64, max_queue_delay 200 us), Poisson traffic at loads 0.1,
  0.3, 0.6, 0.9 of the models' capacity at batch 64 sharing the device. The engine's work is per executed batch and
  device event, so requests per second grow with the batch: ~2 requests per batch at 0.1, ~64 at 0.9;
* ``fifo``: no batching (max_batch_size 1, each request its own batch) at 0.6 of the instances' batch-1 capacity:
  one batch, and one device event, per request;
* ``cpu_host``: ``dynamic`` at 0.3 with every request's way in and way out simulated as work on a 16-core host
  (``request_device``): per-request events by design (two jobs per request on the host's cores).

The baseline is the textbook SimPy M/M/1 with one process per request, timed in the same run on the same machine;
its ratio is printed last. Times are CPU seconds of the timing thread (``time.thread_time``): on a shared machine wall
time also counts other processes' turns, and a process's CPU time its other threads' (in a test suite, threads an
earlier test left running); the ratio to the baseline is what carries over between machines. Whole
``SimTarget.run`` calls are timed: the workload's draws and the records table included.

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

from serving_bench.profiles import Profile  # noqa: E402
from serving_bench.profiles.importers import import_h200_eager  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.serving_config import ModelServing, ServingConfig  # noqa: E402
from serving_bench.sim import ENGINE_BUILD  # noqa: E402
from serving_bench.sim.target import SimTarget  # noqa: E402

MODELS = ("resnet50_fp16", "mobilenet_v3_large_fp16", "efficientnet_b0_fp16", "bert_base_fp16")
LOADS = (0.1, 0.3, 0.6, 0.9)
HOST_CORES = 16


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
    t0 = time.thread_time()
    env.run()
    return n / (time.thread_time() - t0)


def with_cpu_host(profile: Profile) -> Profile:
    """``profile`` with a 16-core host whose cores carry every request's way in and out (~0.1-0.4 ms each, one core
    busy 90 % of it)."""
    data = profile.to_json()
    data["devices"]["cpu"] = {"kind": "cpu", "name": "host", "cores": HOST_CORES}
    data["request_device"] = "cpu"
    for name in MODELS:
        model = data["models"][name]
        model["request_demand"] = 0.9
        model["dispatch"] = {"samples_s": [0.0001, 0.00015, 0.0002, 0.0004]}
        model["overhead"] = {"samples_s": [0.0001, 0.00012, 0.0002, 0.0003]}
    return Profile.from_json(data, "h200_with_cpu_host")


def scenario(kind: str, load: float, n: int, seed: int = 0) -> tuple[SimTarget, Schedule, float]:
    """The target, a Poisson schedule of ``n`` requests at ``load`` and its rate (requests per second)."""
    profile = import_h200_eager()
    batch = 1 if kind == "fifo" else 64
    config = ServingConfig(tuple(ModelServing(m, max_batch_size=batch, dynamic_batching=batch > 1,
                                              max_queue_delay_us=200 if batch > 1 else 0, instances=(("gpu0", 2),))
                                 for m in MODELS))
    times = {m: profile.models[m].devices["gpu0"].batches[batch].median for m in MODELS}
    if kind == "fifo":  # batch-1 work leaves most of the GPU idle: each instance at its solo speed
        rate = load * sum(2 / times[m] for m in MODELS)
    else:  # each model alone at batch 64 on its 2 instances, a quarter of the device each
        rate = load * sum(2 * 64 / times[m] for m in MODELS) / 4
    if kind == "cpu_host":
        profile = with_cpu_host(profile)
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    sched = Schedule(t, rng.integers(0, len(MODELS), n), MODELS, np.zeros(n), np.ones(n), {"duration_s": float(t[-1])})
    return SimTarget(profile, config, seed=seed), sched, rate


def measure(kind: str, load: float, n: int, repeats: int, baseline: float) -> dict:
    """Best of ``repeats`` timed runs of one scenario."""
    target, sched, rate = scenario(kind, load, n)
    best = np.inf
    for _ in range(repeats):
        t0 = time.thread_time()
        records = target.run(sched)
        best = min(best, time.thread_time() - t0)
    sim = records.info.sim
    batches = sum(sim.executions.values())
    per_model = [v for v in sim.items_per_execution.values() if v]
    return {"scenario": kind, "load": load, "rate_rps": rate, "requests": n, "batches": batches,
            "sim_requests_per_s": n / best, "sim_batches_per_s": batches / best, "cpu_s": best,
            "ratio_to_naive_simpy": n / best / baseline, "mean_exec_batch": float(np.mean(per_model)),
            "gpu_busy": sim.device_busy_s["gpu0"] / sim.duration_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    n = 200_000 if args.quick else 2_000_000
    repeats = 2 if args.quick else 3
    load_before = os.getloadavg()
    baseline = max(naive_mm1(n // 4, seed) for seed in range(2))
    runs = [("dynamic", load) for load in LOADS] + [("fifo", 0.6), ("cpu_host", 0.3)]
    print(f"engine: {ENGINE_BUILD}; {n:,} requests per scenario, best of {repeats}; CPU seconds of the timing thread")
    print(f"{'scenario':<10} {'load':>4} {'offered/s':>9} {'req/batch':>9} {'sim req/s':>11} {'batches/s':>11} "
          f"{'x naive':>7}")
    rows = []
    for kind, load in runs:
        row = measure(kind, load, n, repeats, baseline)
        rows.append(row)
        print(f"{kind:<10} {load:>4.1f} {row['rate_rps']:>9,.0f} {row['requests'] / row['batches']:>9.1f} "
              f"{row['sim_requests_per_s']:>11,.0f} {row['sim_batches_per_s']:>11,.0f} "
              f"{row['ratio_to_naive_simpy']:>7.1f}")
    slowest = min((r for r in rows if r["scenario"] != "cpu_host"), key=lambda r: r["sim_requests_per_s"])
    result = {"date": date.today().isoformat(), "host": socket.gethostname(), "cpu": platform.processor(),
              "python": platform.python_version(), "engine": ENGINE_BUILD, "loadavg_before": load_before,
              "loadavg_after": os.getloadavg(), "clock": "CPU seconds of the timing thread (thread_time)",
              "naive_simpy_mm1_rps": baseline, "scenarios": rows, "quick": args.quick}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"naive SimPy M/M/1 (one process per request): {baseline:,.0f} req/s; slowest batching scenario "
          f"({slowest['scenario']} {slowest['load']:.1f}): {slowest['sim_requests_per_s']:,.0f} req/s = "
          f"{slowest['ratio_to_naive_simpy']:.1f}x naive SimPy M/M/1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
