#!/usr/bin/env python3
"""Where the simulator's error grows with the load: the benchmark's open-loop replays, measured and simulated.

Runs ``benchmarks/colocation_fidelity.py``'s all-together closed loop (one client per entry) and replays its
open-loop schedules (every entry together at a share of its measured co-located capacity, from a saved ``--data``
file) on a new embedded tritonserver whose runners log their batches, and simulates the replays with that file's solo
profile and the law the benchmark fits on its all-together run (the wait as measured). Per load it prints the host's
CPU (the server, its stubs and the client, in cores) beside the simulator's (the CPU its jobs received, in the law's
units and divided by ``eta``: real cores), and per model the latency quantiles measured and simulated; at the
highest load also each phase's quantiles, measured and simulated (way in: send to the batch's start; batch: the
runner's logged batch, the simulator's execution with Triton's hop to the runner; way out: batch end to answer —
each request matched to the first batch that starts after its send, which is its own only while the model rarely
queues: not resnet50's). A model whose simulated CPU agrees while its latency spreads less than measured is missing
a mechanism of the tail, not of the mean.

For the closed loop and each load it also prints what the kernel's scheduler gave each process of the server
(``/proc/PID/task/*/schedstat``: time on a core and time runnable but waiting for one, summed over its threads, in
cores; a stub is named by its model) and, per logged batch, the runner's CPU, the rows and the times the process was
put on a core: a runner whose CPU per row grows with the load is slowed by the host (caches, memory, preemptions),
one whose wait grows while its CPU per row does not, by the scheduler alone.

    .venv/bin/python scripts/diagnostics/load_phases.py \
        --data benchmarks/results/colocation_fidelity_data_<date>.json.xz
        [--repo DIR (exported there when missing)] [--loads 0.3,0.6,0.9]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

os.environ["SERVING_BENCH_SIM_PURE"] = "1"  # the Python engine, whose device this script instruments
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling wait_decomposition

import colocation_fidelity as bench  # noqa: E402
from wait_decomposition import first_batch  # noqa: E402

from serving_bench.errors import InputError  # noqa: E402
from serving_bench.files import read_json  # noqa: E402
from serving_bench.profiles.schema import Profile  # noqa: E402
from serving_bench.calibrate.session import Session  # noqa: E402
from serving_bench.serve.execution_log import Executions  # noqa: E402
from serving_bench.serving_config import cpu_cores  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402
from serving_bench.sim.interference import fit, with_law  # noqa: E402
from serving_bench.sim.target import SimTarget  # noqa: E402

QUANTILES = (10, 50, 90, 99)


def simulated(target: SimTarget, schedule) -> tuple[object, float, dict[str, Executions]]:
    """The simulated run, the CPU its jobs received (solo-demand seconds: the sum over running jobs of demand x
    rate, integrated) and each model's executed batches (start and end, seconds from the run's start; no CPU, rows
    or instances), the Python engine's device and server instrumented for the one run."""
    from serving_bench.sim import core, device

    received = [0.0]
    batches: list[tuple[int, float, float]] = []
    names: list[str] = []
    advance, pop_finished, init = device.Device._advance, device.Device.pop_finished, core.Server.__init__

    def counting(self, now: float) -> None:
        if now > self.last and self.jobs:
            received[0] += sum(r.kind.demand * r.heap.n * r.rate for r in self.active) * (now - self.last)
        advance(self, now)

    def logging(self, now: float) -> list:
        done = pop_finished(self, now)
        batches.extend((job.model, job.start, now) for job in done if job.kind.batch > 0)
        return done

    def naming(self, spec, *args, **kwargs) -> None:
        names[:] = [m.name for m in spec.models]
        init(self, spec, *args, **kwargs)

    device.Device._advance, device.Device.pop_finished, core.Server.__init__ = counting, logging, naming
    try:
        records = target.run(schedule)
    finally:
        device.Device._advance, device.Device.pop_finished, core.Server.__init__ = advance, pop_finished, init
    table = np.array(sorted(batches, key=lambda b: b[1])).reshape(-1, 3)
    executions = {}
    for m, name in enumerate(names):
        mine = table[table[:, 0] == m]
        n = len(mine)
        executions[name] = Executions(mine[:, 1], mine[:, 2], np.zeros(n), np.ones(n, np.int32),
                                      np.ones(n, np.int32), np.zeros(n, np.int32))
    return records, received[0], executions


def schedstats(pid: int) -> dict[str, tuple[float, float, int]]:
    """Per process of the server's group (the server, and the stubs named by their model, a model's instances
    together): seconds on a core, seconds runnable but waiting for one and the times it was put on a core, summed
    over its threads so far (threads and processes that ended are not counted)."""
    import psutil

    out: dict[str, tuple[float, float, int]] = {}
    server = psutil.Process(pid)
    for p in [server, *server.children(recursive=True)]:
        try:
            cmd = p.cmdline()
        except psutil.Error:  # the process ended meanwhile
            continue
        name = "tritonserver" if p.pid == pid else next(
            (Path(a).parts[-3] for a in cmd if a.endswith(".py") and Path(a).parent.name == "1"), p.name())
        run, wait, slices = out.get(name, (0.0, 0.0, 0))
        for task in Path(f"/proc/{p.pid}/task").glob("*"):
            try:
                fields = (task / "schedstat").read_text().split()
            except OSError:  # the thread ended meanwhile
                continue
            run, wait, slices = run + int(fields[0]) * 1e-9, wait + int(fields[1]) * 1e-9, slices + int(fields[2])
        out[name] = (run, wait, slices)
    return out


def print_scheduler(before: dict, after: dict, executions: dict, seconds: float) -> None:
    """The table of :func:`schedstats` between two snapshots ``seconds`` apart, with the runners' logged batches."""
    print("  scheduler, per process (cores): on a core | waiting for one | wait / run | batches | per batch (ms): the "
          "process on a core, the runner's CPU, the batch; rows, slices per batch")
    for name, now in sorted(after.items()):
        run_s, wait_s, slices = (a - b for a, b in zip(now, before.get(name, (0, 0, 0))))
        ex = executions.get(name)
        batches = len(ex) if ex is not None else 0
        per_batch = (f"{run_s / batches * 1e3:8.3f} {ex.cpu_s.mean() * 1e3:8.3f} {ex.duration_s.mean() * 1e3:8.3f} "
                     f"{ex.rows.mean():5.2f} {slices / batches:7.1f}" if batches else "")
        print(f"  {name:36s} {run_s / seconds:6.3f} | {wait_s / seconds:6.3f} | {wait_s / max(run_s, 1e-9):5.2f} | "
              f"{batches:6d} | {per_batch}")


def quantiles_ms(values: np.ndarray) -> str:
    return " ".join(f"{np.percentile(values, q) * 1e3:7.2f}" for q in QUANTILES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a colocation_fidelity_data_*.json.xz file")
    parser.add_argument("--repo", type=Path, default=Path("/tmp/serving-bench-load-phases"))
    parser.add_argument("--loads", default="0.3,0.6,0.9")
    args = parser.parse_args()
    try:
        data = read_json(args.data, "saved measurements")
        loads = [float(x) for x in args.loads.split(",")]
    except (InputError, OSError, ValueError) as err:
        parser.error(f"--data / --loads: {err}")
    if "replays" not in data or "capacity" not in data:
        parser.error(f"--data: {args.data} has no 'capacity' and 'replays' (a colocation_fidelity data file?)")
    if not (args.repo / bench.LONGEST).exists():
        bench.export(args.repo)
    profile = Profile.from_json(data["profile"], str(args.data))
    together = bench.saved_observation(data["cases"]["all together"])
    law = fit(profile, "cpu", [together], bench.DEFAULT_LAW, workers=cpu_cores(), measured=data.get("quiet_wait"))[0]
    print("law fitted on the all-together run: " + ", ".join(f"{k} {v:.4g}" for k, v in law.params().items()))
    config = bench.serving_config({m: bench.serving_from_json(s) for m, s in data["serving"].items()}, bench.STREAMS)
    with TritonServer(args.repo, models=list(bench.STREAMS), execution_log=True) as server:
        session = Session(server.endpoints, server)
        before = schedstats(server.pid)
        run = session.run({m: (1, 1) for m in bench.STREAMS}, data["replay_s"])
        after = schedstats(server.pid)
        seconds = run.window[1] - run.window[0]
        print(f"\n== all together, closed loop (one client each): host CPU measured {run.cpu_s / seconds:.2f} cores")
        print("  throughput (req/s), now | saved: " + ", ".join(
            f"{m} {len(run.latency[m]) / seconds:.1f} | {data['cases']['all together']['real'][m]['throughput']:.1f}"
            for m in bench.STREAMS))
        print_scheduler(before, after, {m: e.window(*run.window) for m, e in server.executions().items()}, seconds)
        for load in loads:
            schedule = bench.poisson_schedule(data["capacity"], load, data["replay_s"], int(load * 10))
            before = schedstats(server.pid)
            run = session.replay(schedule)
            after = schedstats(server.pid)
            executions = {m: e.window(*run.window) for m, e in server.executions().items()}
            seconds = run.window[1] - run.window[0]
            records, cpu_s, simulated_batches = simulated(SimTarget(with_law(profile, "cpu", law), config, seed=0),
                                                          schedule)
            table = records.table[records.table["status"].astype(str) == "ok"]
            print(f"\n== load {load}: host CPU measured {run.cpu_s / seconds:.2f} cores, simulated "
                  f"{cpu_s / records.info.sim.duration_s / law.value('eta'):.2f}")
            print(f"  {'latency (ms) at p' + '/'.join(map(str, QUANTILES)):36s} {'measured':>31s} | simulated")
            for m in bench.STREAMS:
                mine = table[table["model"].astype(str) == m]
                print(f"  {m:36s} {quantiles_ms(run.latency[m])} | "
                      f"{quantiles_ms((mine['done_s'] - mine['intended_s']).to_numpy())}")
            print_scheduler(before, after, executions, seconds)
            if load != max(loads):
                continue
            print(f"  phases (ms) at p{'/'.join(map(str, QUANTILES))}: way in | batch | way out; measured, then "
                  "simulated")
            for m in bench.STREAMS:
                if m not in executions:  # an ensemble: its members' batches are not its own
                    continue
                mine = table[table["model"].astype(str) == m]
                for label, batches, sent, done in (
                        ("measured", executions[m], run.sent[m], run.done[m]),
                        ("simulated", simulated_batches[m], mine["sent_s"].to_numpy(), mine["done_s"].to_numpy())):
                    start, end = first_batch(batches, sent)
                    ok = end <= done
                    print(f"  {m + ' ' + label:36s} {quantiles_ms((start - sent)[ok])} | "
                          f"{quantiles_ms((end - start)[ok])} | {quantiles_ms((done - end)[ok])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
