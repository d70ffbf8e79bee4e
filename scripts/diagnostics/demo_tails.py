#!/usr/bin/env python3
"""Where a replay's tail is: the requests sent while a long model's request was in flight, and the others.

Reads a replay (``make demo``'s by default: ``results/demo/replay``), simulates its schedule with a profile (the
demo's by default), and prints per model the latency's p50 / p90 / p99 and the share over ``--over`` ms of the
requests sent while a request of ``--long`` was in flight (its send to its answer) and of the others — measured and
simulated, the latter also with the profile's wait for a core at one chance for every instance count (the
calibration's, what profiles did before 2026-12-04) where the profile measured it at two. A simulated tail that
matches beside the long model but not away from it has the waits' chance right and misses another tail.

    .venv/bin/python scripts/diagnostics/demo_tails.py [--replay results/demo/replay]
        [--profile results/demo/profile.json] [--repo model_repo] [--long resnet50_onnxruntime] [--over 3]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving_bench.errors import InputError  # noqa: E402
from serving_bench.profiles.law import WAIT_BY_INSTANCES  # noqa: E402
from serving_bench.profiles.schema import Profile  # noqa: E402
from serving_bench.run.records import load_records  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.serving_config import ServingConfig  # noqa: E402
from serving_bench.sim.target import SimTarget  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def beside(table, long: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per model but ``long``: the latencies (s, from the intended time) of its answered requests sent while a
    request of ``long`` was in flight, and of the others."""
    ok = table[table["status"].astype(str) == "ok"]
    model = ok["model"].astype(str)
    spans = ok[model == long]
    starts, ends = spans["sent_s"].to_numpy(), spans["done_s"].to_numpy()
    out = {}
    for m in sorted(set(model) - {long}):
        rows = ok[model == m]
        sent = rows["sent_s"].to_numpy()
        latency = (rows["done_s"] - rows["intended_s"]).to_numpy()
        inside = ((sent[:, None] >= starts[None]) & (sent[:, None] < ends[None])).any(axis=1)
        out[m] = (latency[inside], latency[~inside])
    return out


def figures(latency: np.ndarray, over_s: float) -> str:
    if not len(latency):
        return "no requests"
    return (" ".join(f"{np.percentile(latency, q) * 1e3:5.2f}" for q in (50, 90, 99)) +
            f" ({np.mean(latency > over_s) * 100:4.1f} % > {over_s * 1e3:g} ms, n {len(latency)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replay", type=Path, default=ROOT / "results/demo/replay")
    parser.add_argument("--profile", type=Path, default=ROOT / "results/demo/profile.json")
    parser.add_argument("--repo", type=Path, default=ROOT / "model_repo")
    parser.add_argument("--long", default="resnet50_onnxruntime")
    parser.add_argument("--over", type=float, default=3.0, help="ms: the share of requests longer than this")
    args = parser.parse_args()
    try:
        real = load_records(args.replay).table
        schedule = Schedule.load(args.replay / "schedule.npz")
        data = json.loads(args.profile.read_text())
        profiles = {"simulated": Profile.from_json(data, str(args.profile))}
        config = ServingConfig.from_repo(args.repo, list(schedule.models))
    except (OSError, ValueError, InputError) as err:
        parser.error(f"--replay / --profile / --repo: {err}")
    if args.long not in schedule.models:
        parser.error(f"--long: {args.long!r} is not requested by {args.replay} ({', '.join(schedule.models)})")
    for device in data["devices"].values():
        law = device.get("law") or {}
        if all(k in law for k in WAIT_BY_INSTANCES):
            for k in WAIT_BY_INSTANCES:
                del law[k]
            profiles["one chance"] = Profile.from_json(data, str(args.profile))
    sides = {"measured": beside(real, args.long)}
    sides.update({name: beside(SimTarget(p, config, seed=0).run(schedule).table, args.long)
                  for name, p in profiles.items()})
    over_s = args.over / 1e3
    print(f"latency p50 / p90 / p99 (ms) of the requests sent while a {args.long} request was in flight, and of the "
          f"others: {', '.join(sides)}")
    for m in sides["measured"]:
        for i, where in enumerate(("beside", "away")):
            print(f"  {m[:22]:22s} {where:6s} " + " | ".join(figures(side[m][i], over_s) for side in sides.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
