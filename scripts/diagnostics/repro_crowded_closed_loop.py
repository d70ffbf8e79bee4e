#!/usr/bin/env python3
"""Where a crowded closed loop's tail comes from, measured and simulated (about 1 minute).

Every model of a profile at once, one client each, two instances each (the profile's "all together" calibration
run: more threads than the 2-core host has cores), on the embedded tritonserver with its execution logs; each
request is matched to its batch (one client: one request at a time), so its latency splits into the way in (send to
the batch's start), the runtime (the batch's logged duration) and the way out (the batch's end to the answer). The
same run is then simulated with the profile. It prints per model the measured p50 / p90 / p99 of the latency and of
each phase, the phases of the slowest 1 %, and the simulated latency's p50 / p90 / p99.

What it showed on the 2-core VM (2026-12-04, the demo's profile of that day's gate): the tiny models' p50s simulated
within -12 … +6 %, their p99s within -16 … -5 %, but their p90s 31-42 % too short (1.64-2.58 ms against 2.84-3.73 ms):
measured, the way in's p90 is twice its p50 and the way out's three times, and the slowest 1 % spent 3.4-4.6 ms on
the way in (solo p99 0.25-0.49 ms) and 1.8-2.4 ms on the way out (docs/notes/sim-history.md, "Crowded closed loops").

    .venv/bin/python scripts/diagnostics/repro_crowded_closed_loop.py --profile results/demo/profile.json \
        --repo model_repo
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving_bench.profiles.schema import Profile  # noqa: E402
from serving_bench.calibrate.session import ServerSetup, open_session  # noqa: E402
from serving_bench.sim.interference import Observation, answered, simulate  # noqa: E402


def quantiles_ms(values: np.ndarray) -> str:
    """p50 / p90 / p99 of ``values`` (s) in ms."""
    return " / ".join(f"{1e3 * np.percentile(values, q):.2f}" for q in (50, 90, 99))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="a measured profile with an all-together calibration run")
    parser.add_argument("--repo", required=True, help="the model repository it was measured on")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of the closed loop (s)")
    args = parser.parse_args()
    profile = Profile.load(args.profile)
    together = [o for o in map(Observation.from_json, profile.calibration)
                if not o.rates and set(o.clients) == set(profile.models) and set(o.clients.values()) == {1}]
    if not together:
        print(f"{args.profile}: calibration: no closed loop of every model with one client each", file=sys.stderr)
        return 2
    obs = together[0]
    instances = max(count for serving in obs.serving.values() for _, count in serving.instances)
    models = list(obs.clients)
    with open_session(ServerSetup(Path(args.repo), tuple(models), instances), [], print) as session:
        run = session.run({m: (1, 1) for m in models}, args.seconds)
    simulated = answered(simulate(profile, obs, args.seconds), args.seconds)
    for m in models:
        sent, done, batches = run.sent[m], run.done[m], run.executions[m]
        first = np.searchsorted(batches.start_s, sent)  # the first batch that starts after the send
        keep = first < len(batches)
        first, sent, done = first[keep], sent[keep], done[keep]
        way_in = batches.start_s[first] - sent
        runtime = batches.end_s[first] - batches.start_s[first]
        way_out = done - batches.end_s[first]
        latency = done - sent
        slowest = latency >= np.percentile(latency, 99)
        rows = simulated[simulated["model"].astype(str) == m]
        print(f"{m}: {len(latency)} requests, latency {quantiles_ms(latency)} ms (simulated "
              f"{quantiles_ms((rows['done_s'] - rows['sent_s']).to_numpy())}); way in {quantiles_ms(way_in)}, "
              f"runtime {quantiles_ms(runtime)}, way out {quantiles_ms(way_out)}; the slowest 1 %: way in "
              f"{1e3 * way_in[slowest].mean():.2f}, runtime {1e3 * runtime[slowest].mean():.2f}, way out "
              f"{1e3 * way_out[slowest].mean():.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
