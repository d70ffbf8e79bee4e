#!/usr/bin/env python3
"""Where the simulator's error grows with the load: the benchmark's open-loop replays, measured and simulated.

Replays ``benchmarks/colocation_fidelity.py``'s open-loop schedules (every entry together at a share of its measured
co-located capacity, from a saved ``--data`` file) on a new embedded tritonserver whose runners log their batches,
and simulates the same schedules with that file's solo profile and the law the benchmark fits on its all-together
run (the wait as measured). Per load it prints the host's CPU (the server, its stubs and the client, in cores) beside
the simulator's (the CPU its jobs received, in the law's units and divided by ``eta``: real cores), and per model
the latency quantiles measured and simulated; at the highest load also each phase's quantiles as measured (way in:
send to the batch's start; runtime: the logged batch; way out: batch end to answer — each request matched to the
first batch that starts after its send, which is its own only while the model rarely queues: not resnet50's). A model whose simulated CPU
agrees while its latency spreads less than measured is missing a mechanism of the tail, not of the mean.

    .venv/bin/python scripts/load_phases.py --data benchmarks/results/colocation_fidelity_data_<date>.json.xz
        [--repo DIR (exported there when missing)] [--loads 0.3,0.6,0.9]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

os.environ["SERVING_BENCH_SIM_PURE"] = "1"  # the Python engine, whose device this script instruments
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))

import colocation_fidelity as bench  # noqa: E402
from wait_decomposition import first_batch  # noqa: E402

from serving_bench.errors import InputError  # noqa: E402
from serving_bench.files import read_json  # noqa: E402
from serving_bench.profiles.schema import Profile  # noqa: E402
from serving_bench.profiles.session import Session  # noqa: E402
from serving_bench.serve.runners import cpu_cores  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402
from serving_bench.sim.interference import fit, with_law  # noqa: E402
from serving_bench.sim.target import SimTarget  # noqa: E402

QUANTILES = (10, 50, 90, 99)


def simulated_cpu_s(target: SimTarget, schedule) -> tuple[object, float]:
    """The simulated run and the CPU its jobs received (solo-demand seconds: the sum over running jobs of demand x
    rate, integrated), the Python engine's device instrumented for the one run."""
    from serving_bench.sim import device

    received = [0.0]
    advance = device.Device._advance

    def counting(self, now: float) -> None:
        if now > self.last and self.jobs:
            received[0] += sum(r.kind.demand * r.heap.n * r.rate for r in self.active) * (now - self.last)
        advance(self, now)

    device.Device._advance = counting
    try:
        return target.run(schedule), received[0]
    finally:
        device.Device._advance = advance


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
    print("law fitted on the all-together run: " + ", ".join(f"{k} {v:.4g}" for k, v in law.items() if k != "name"))
    config = bench.serving_config({m: bench.serving_from_json(s) for m, s in data["serving"].items()}, bench.STREAMS)
    with TritonServer(args.repo, models=list(bench.STREAMS), execution_log=True) as server:
        session = Session(server.endpoints, server)
        for load in loads:
            schedule = bench.poisson_schedule(data["capacity"], load, data["replay_s"], int(load * 10))
            run = session.replay(schedule)
            executions = {m: e.window(*run.window) for m, e in server.executions().items()}
            seconds = run.window[1] - run.window[0]
            records, cpu_s = simulated_cpu_s(SimTarget(with_law(profile, "cpu", law), config, seed=0), schedule)
            table = records.table[records.table["status"].astype(str) == "ok"]
            print(f"\n== load {load}: host CPU measured {run.cpu_s / seconds:.2f} cores, simulated "
                  f"{cpu_s / records.info.sim.duration_s / law.get('eta', 1.0):.2f}")
            print(f"  {'latency (ms) at p' + '/'.join(map(str, QUANTILES)):36s} {'measured':>31s} | simulated")
            for m in bench.STREAMS:
                mine = table[table["model"].astype(str) == m]
                print(f"  {m:36s} {quantiles_ms(run.latency[m])} | "
                      f"{quantiles_ms((mine['done_s'] - mine['intended_s']).to_numpy())}")
            if load != max(loads):
                continue
            print(f"  measured phases (ms) at p{'/'.join(map(str, QUANTILES))}: way in | runtime | way out")
            for m in bench.STREAMS:
                if m not in executions:  # an ensemble: its members' batches are not its own
                    continue
                start, end = first_batch(executions[m], run.sent[m])
                ok = end <= run.done[m]
                print(f"  {m:36s} {quantiles_ms((start - run.sent[m])[ok])} | {quantiles_ms((end - start)[ok])} | "
                      f"{quantiles_ms((run.done[m] - end)[ok])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
