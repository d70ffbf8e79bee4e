"""Where one entry's capacity on the embedded Triton (CPU) goes: open-loop replays of tiny_cnn on ONNX Runtime at
given rates, each read for what limited it (docs/notes/capacity-fidelity.md, the diagnosis of 2026-12-06).

Per replay it prints:

* the latency (p50, p99 from the intended time, after the first half second) and the sender's **lateness** (sent
  less intended): a late sender measures the client, not the server;
* Triton's statistics: executed batches and their mean size, queue time, and the compute phases per request (input,
  infer, output: the mean time of the batch each request was in);
* the runner's own batches (its execution log): time and CPU per request, its demand;
* CPU seconds per request by process — Triton's (gRPC front end, the batcher, the python backend's side of the
  hand-offs), each python-backend stub, the sender, this driver — their sum in cores, and the whole machine's busy
  cores (the rest: other tenants);
* the run-queue wait per request (``/proc/<pid>/task/*/schedstat``): time the server's and the stubs' threads were
  runnable but had no core.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/capacity_ceiling.py --rates 2000,3000 --config 1:1:0 --config 1:32:2

``--config INSTANCES:MAX_BATCH:DELAY_MS`` (repeatable; default 1:1:0 and 1:32:2), ``--seconds`` per replay (3).
Instances run one runtime thread, as in ``capacity_fidelity.py``. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import capacity_cases as cc  # noqa: E402
from serving_bench.export.api import export_models  # noqa: E402
from serving_bench.export.frameworks import ExportOptions  # noqa: E402
from serving_bench.load.driver import SendOptions, TritonTarget  # noqa: E402
from serving_bench.run.records import Records  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402
from serving_bench.serving_config import ServingConfig  # noqa: E402
from serving_bench.tune.verify import copy_repo  # noqa: E402

ENTRY = cc.GRID_ENTRY
BASE_RPS = 1000.0  # the load file's rate; a replay at R req/s is its schedule at scale R / BASE_RPS


@dataclass(frozen=True)
class Snapshot:
    """CPU seconds so far per process (``triton``, ``stub <pid>``, ``driver``), the (on-CPU, run-queue wait)
    seconds of the server's and the stubs' threads, the machine's busy CPU seconds, and the clock (s)."""

    cpu: dict
    sched: dict
    machine_s: float
    at_s: float


def schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a core, seconds runnable without one) summed over the threads of ``pid``."""
    on = wait = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except OSError:  # the thread ended meanwhile
            continue
        on, wait = on + int(fields[0]), wait + int(fields[1])
    return on / 1e9, wait / 1e9


def snapshot(server_pid: int) -> Snapshot:
    root = psutil.Process(server_pid)
    stubs = root.children(recursive=True)
    procs = {"triton": root, **{f"stub {p.pid}": p for p in stubs}, "driver": psutil.Process()}
    cpu = {name: sum(p.cpu_times()[:2]) for name, p in procs.items()}
    sched = {"triton": schedstat(server_pid), "stubs": tuple(map(sum, zip(*(schedstat(p.pid) for p in stubs))))}
    t = psutil.cpu_times()
    return Snapshot(cpu, sched, t.user + t.nice + t.system + t.irq + t.softirq + t.steal, time.perf_counter())


def report(records: Records, before: Snapshot, after: Snapshot, batches) -> None:
    """Print one replay's figures (module doc); ``batches``: the runner's executions during it."""
    t, n = records.table, len(records.table)
    late = (t.sent_s - t.intended_s).to_numpy()
    judged = t[t.intended_s >= 0.5]
    latency = (judged.done_s - judged.intended_s).to_numpy()
    print(f"  latency p50 {np.nanpercentile(latency, 50) * 1e3:.1f} ms, p99 {np.nanpercentile(latency, 99) * 1e3:.1f} "
          f"ms; lateness p50 {np.percentile(late, 50) * 1e6:.0f} us, p99 {np.percentile(late, 99) * 1e6:.0f} us, "
          f"max {late.max() * 1e3:.1f} ms, {np.mean(late > 1e-3):.1%} over 1 ms")
    s = records.info.server_stats.get(ENTRY, {})
    phase = {p: (s.get(f"{p}_mean_s") or 0.0) * 1e6 for p in ("queue", "compute_input", "compute_infer",
                                                              "compute_output")}
    print(f"  Triton: {s.get('execution_count')} batches of mean {s.get('mean_exec_batch') or 0:.1f}; queue "
          f"{phase['queue'] / 1e3:.2f} ms; per batch input {phase['compute_input']:.0f} + infer "
          f"{phase['compute_infer']:.0f} + output {phase['compute_output']:.0f} us")
    requests = max(int(batches.requests.sum()), 1)
    print(f"  runner: {len(batches)} batches, {batches.duration_s.sum() / requests * 1e6:.0f} us and "
          f"{batches.cpu_s.sum() / requests * 1e6:.0f} us CPU per request (demand "
          f"{batches.cpu_s.sum() / max(batches.duration_s.sum(), 1e-9):.2f})")
    wall = after.at_s - before.at_s
    cpu = {k: after.cpu[k] - before.cpu.get(k, 0.0) for k in after.cpu}
    cpu["sender"] = records.info.sender_cpu_s or 0.0
    ours, machine = sum(cpu.values()), after.machine_s - before.machine_s
    print("  CPU per request: " + ", ".join(f"{k} {v / n * 1e6:.0f} us" for k, v in cpu.items()) +
          f"; all {ours / n * 1e6:.0f} us = {ours / wall:.2f} cores; machine {machine / wall:.2f} cores busy "
          f"(other tenants {(machine - ours) / wall:.2f})")
    waits = {k: (after.sched[k][1] - before.sched[k][1]) / n * 1e6 for k in after.sched if before.sched.get(k)}
    print("  run-queue wait per request: " + ", ".join(f"{k} {v:.0f} us" for k, v in waits.items()))


def replay(server: TritonServer, load, rate: float) -> None:
    """One replay at ``rate`` req/s, the server idle first, with its figures printed."""
    cc.idle(server.endpoints.grpc_url, [ENTRY], 0.3)
    done = len(server.executions().get(ENTRY, []))
    before = snapshot(server.pid)
    records = TritonTarget(server, send=SendOptions(timeout_s=2.0)).run(load.at(rate / BASE_RPS))
    after = snapshot(server.pid)
    executions = server.executions()[ENTRY]
    print(f"- {rate:.0f} req/s: {len(records)} requests, {int((records.table.status == 'ok').sum())} ok; "
          f"load average {os.getloadavg()[0]:.2f}")
    report(records, before, after, executions.select(np.arange(done, len(executions))))
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="2000,3000", help="comma-separated req/s")
    parser.add_argument("--config", action="append", help="INSTANCES:MAX_BATCH:DELAY_MS (repeatable)")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    configs = [c.split(":") for c in (args.config or ["1:1:0", "1:32:2"])]
    with tempfile.TemporaryDirectory(prefix="capacity-ceiling-") as tmp:
        repo = Path(tmp) / "repo"
        export_models(["tiny_cnn"], ["onnxruntime"], repo, options=ExportOptions(max_batch_size=32))
        exported = ServingConfig.from_repo(repo, [ENTRY])
        spec = {"name": "ceiling", "duration": args.seconds, "seed": cc.SEED, "warmup": cc.WARMUP_S,
                "models": {ENTRY: {"rate": BASE_RPS, "slo": {"p99": cc.SLO_FLOOR_S}}}}
        load = cc.case_load(spec, Path(tmp))
        for instances, max_batch, delay in configs:
            case = cc.grid(int(instances), int(max_batch), float(delay))
            copy = copy_repo(repo, Path(tmp) / f"served-{instances}-{max_batch}-{delay}", [ENTRY])
            cc.serving_config(case, exported).apply_to_repo(copy)
            print(f"== {case.name} (uptime load {os.getloadavg()[0]:.2f})", flush=True)
            with TritonServer(copy, models=[ENTRY], threads_per_instance=cc.THREADS, execution_log=True) as server:
                warm = load.at(1.0)
                TritonTarget(server).run(warm.select(warm.arrival_s < cc.WARM_S))
                for rate in rates:
                    replay(server, load, rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
