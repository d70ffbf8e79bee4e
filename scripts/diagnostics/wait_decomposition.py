#!/usr/bin/env python3
"""What a co-located model's tail is made of: each request's time split into phases, beside a long model's batches.

Replays a saved schedule (by default the demo's, ``results/demo/replay/schedule.npz``) on a new embedded tritonserver
whose runners log their executed batches, and with ``--quiet-runs`` also the profile's quiet-wait runs (every other
model at 15 and 150 req/s beside the long one's occasional batches, as ``serving-bench profile`` measures the wait
for a core). Each answered request is split into phases on the batches' clock:

* a model requested directly: *way in* (send to its batch's start), *execution*, *way out* (batch end to answer);
* an ensemble: per step the *hand-off* to its member (from the request's send, or from the end of the steps it
  needs, to the member's batch start) and the member's *execution*, then the *way out* (last step's end to answer).

A phase that starts while a batch of ``--long`` runs is compared with the median of the same phase started outside
one: the share that took more than 1 ms longer (``P(+1ms)``), the mean, p90 and largest excess (ms). A member also
requested directly is matched to its first batch after the phase starts (roughly right at low rates).

What it showed on the 2-core VM (2026-12-04, the demo's replay; docs/notes/sim-history.md, "What the tail beside a long
batch is made of", and ``benchmarks/results/wait_decomposition_2026-12-04_vm.txt``): the ways in waited (13-26 % more
than 1 ms, up to 7.8 ms) and so did the ensemble's hand-offs to its members and its combiner (9-22 %, up to 5.5 ms); the
executions and the ways out hardly did (0-7 %).

    .venv/bin/python scripts/diagnostics/wait_decomposition.py [--repo model_repo] [--schedule PATH] [--quiet-runs]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving_bench.calibrate.waits import WAITED_S  # noqa: E402
from serving_bench.calibrate.plan import QUIET_RATES_RPS, QUIET_SECONDS, quiet_rates  # noqa: E402
from serving_bench.calibrate.session import Session  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.serve.execution_log import Executions  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402
from serving_bench.serving_config import ServingConfig  # noqa: E402
from serving_bench.sim.interference import open_schedule  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def first_batch(batches: Executions, after: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (s) of the first batch starting at or after each time (NaN where none)."""
    j = np.searchsorted(batches.start_s, after)
    found = j < len(batches)
    j = np.minimum(j, max(len(batches) - 1, 0))
    start = np.where(found, batches.start_s[j], np.nan) if len(batches) else np.full(len(after), np.nan)
    end = np.where(found, batches.end_s[j], np.nan) if len(batches) else np.full(len(after), np.nan)
    return start, end


def phases(run, executions: dict[str, Executions], config: ServingConfig) -> dict[str, list]:
    """Per requested model its phases: name -> (start times, durations), answered requests only."""
    ensembles = config.ensemble_map
    out: dict[str, list] = {}
    for model, sent in run.sent.items():
        done = run.done[model]
        if model not in ensembles:
            start, end = first_batch(executions.get(model, Executions.empty()), sent)
            ok = end <= done
            out[model] = [("way in", sent[ok], (start - sent)[ok]), ("execution", start[ok], (end - start)[ok]),
                          ("way out", end[ok], (done - end)[ok])]
            continue
        members = ensembles[model]
        deps = config.steps_needed(model)
        ends: list[np.ndarray] = []
        rows = []
        for i, member in enumerate(members):
            ready = sent if not deps[i] else np.max([ends[d] for d in deps[i]], axis=0)
            start, end = first_batch(executions.get(member, Executions.empty()), ready)
            ends.append(end)
            rows += [(f"hand-off to {member}", ready, start - ready), (f"{member}", start, end - start)]
        last = np.max(ends, axis=0)
        rows.append(("way out", last, done - last))
        ok = np.isfinite(last) & (last <= done)
        out[model] = [(name, t[ok], d[ok]) for name, t, d in rows]
    return out


def report(title: str, run, executions: dict[str, Executions], config: ServingConfig, long: str) -> None:
    print(f"== {title}")
    print(f"  {'model / phase':48s} {'median':>7s} {'n':>5s} {'P(+1ms)':>7s} {'mean+':>6s} {'p90+':>6s} {'max+':>6s}"
          "   (ms; + : excess of phases started during a long batch over the median of those outside)")
    for model, rows in phases(run, executions, config).items():
        if model == long:
            continue
        print(f"  {model}")
        for name, t, d in rows:
            inside = executions[long].running_at(t)
            if inside.sum() < 5 or (~inside).sum() < 5:
                continue
            base = float(np.median(d[~inside]))
            excess = d[inside] - base
            print(f"    {name:46s} {base * 1e3:7.3f} {inside.sum():5d} {np.mean(excess > WAITED_S):7.2f} "
                  f"{excess.mean() * 1e3:6.2f} {np.percentile(excess, 90) * 1e3:6.2f} {excess.max() * 1e3:6.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT / "model_repo")
    parser.add_argument("--schedule", type=Path, default=ROOT / "results/demo/replay/schedule.npz")
    parser.add_argument("--long", default="resnet50_onnxruntime", help="the model whose batches others wait behind")
    parser.add_argument("--quiet-runs", action="store_true", help="also the profile's quiet-wait runs")
    args = parser.parse_args()
    if not args.schedule.is_file():
        parser.error(f"--schedule: {args.schedule} not found (a replay's schedule.npz: make demo writes one)")
    schedule = Schedule.load(args.schedule)
    if args.long not in schedule.models:
        parser.error(f"--long: {args.long!r} is not requested by {args.schedule} ({', '.join(schedule.models)})")
    config = ServingConfig.from_repo(args.repo, list(schedule.models))
    served = list(config.names)
    with TritonServer(args.repo, models=list(schedule.models), execution_log=True) as server:
        session = Session(server.endpoints, server)

        def measure(title: str, s: Schedule) -> dict[str, Executions]:
            run = session.replay(s)
            executions = {m: e.window(*run.window) for m, e in server.executions().items()}
            report(title, run, executions, config, args.long)
            return executions

        executions = measure(f"replay of {args.schedule}", schedule)
        if args.quiet_runs:  # the long model at LONG_SHARE of a core, from its batches' median time in the replay
            long_service_s = float(np.median(executions[args.long].duration_s))
            for rate in QUIET_RATES_RPS:
                rates = quiet_rates(served, args.long, long_service_s, rate)
                measure(f"quiet-wait run, the others at {rate:g} req/s", open_schedule(rates, QUIET_SECONDS, 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
