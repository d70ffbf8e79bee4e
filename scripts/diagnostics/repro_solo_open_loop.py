#!/usr/bin/env python3
"""Reproduce how one CPU model alone in an open loop is predicted (about 2 minutes).

``tiny_cnn`` on ONNX Runtime (one instance, the default threads: 2 on a 2-core host), profiled on the embedded
tritonserver as the demo profiles (no co-located runs), then replayed with Poisson arrivals at 30 to 900 req/s on the
real server and in the simulator with that profile; it prints measured and simulated p50 and p99 per rate, and the
simulation of a baseline in the same run: the profile with median cold-start extras only (no p90 extras of the
ways in and out).

What it showed on the 2-core VM while the profile measured cold starts at even spacings (2026-12-02/03, native
sender, ONNX Runtime's spinning off): every rate predicted too fast, p50 by 14-38 %, p99 by 29-55 %. With the cold
starts measured at random quiet times (2026-12-03, quiet VM): p50 -11 / -0 / +4 / -3 / -4 %, p99 -14 / +19 / -16 /
-19 / -8 % at 30 / 100 / 300 / 600 / 900 req/s (docs/notes/sim-history.md#cold-starts-under-irregular-arrivals).

    .venv/bin/python scripts/diagnostics/repro_solo_open_loop.py [--seconds 6]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving_bench.export.api import export_models, settle_after_export  # noqa: E402
from serving_bench.export.frameworks import ExportOptions  # noqa: E402
from serving_bench.export.repository import CONFIG_NAME, entry_dir, read_config  # noqa: E402
from serving_bench.load.arrivals import poisson_times  # noqa: E402
from serving_bench.load.driver import TritonTarget  # noqa: E402
from serving_bench.calibrate.measure import measure_profile  # noqa: E402
from serving_bench.calibrate.plan import MeasureConfig, calibration_serving  # noqa: E402
from serving_bench.run.metrics import summarize  # noqa: E402
from serving_bench.run.schedule import Schedule  # noqa: E402
from serving_bench.serve.server import TritonServer  # noqa: E402
from serving_bench.serving_config import ServingConfig  # noqa: E402
from serving_bench.sim.target import SimTarget  # noqa: E402
from serving_bench.telemetry.cpu import StealClock  # noqa: E402

MODEL = "tiny_cnn_onnxruntime"
RATES = (30, 100, 300, 600, 900)  # req/s


def poisson(rate: float, seconds: float) -> Schedule:
    """One-row requests of the model at Poisson times of ``rate`` per second for ``seconds`` (seed: the rate)."""
    t = poisson_times(rate, seconds, np.random.default_rng(int(rate)))
    n = len(t)
    return Schedule(t, np.zeros(n, dtype=np.int32), (MODEL,), np.zeros(n, dtype=np.int32), np.ones(n, dtype=np.int32),
                    {"duration_s": seconds, "warmup_s": 1.0, "seed": int(rate)})


def error(sim: dict, real: dict, key: str) -> str:
    return f"{100 * (sim[key] / real[key] - 1):+.0f} %"


def without_cold_tails(profile):
    """The baseline: the same profile with the median cold-start extras only (no p90 extras of the ways)."""
    def strip(md):
        idle = md.idle and dataclasses.replace(md.idle, overhead_extra_p90_s=(), dispatch_extra_p90_s=())
        return dataclasses.replace(md, idle=idle)
    return dataclasses.replace(profile, models={m: dataclasses.replace(mp, devices={d: strip(md) for d, md in
                                                                                   mp.devices.items()})
                                                for m, mp in profile.models.items()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each replay (s)")
    args = parser.parse_args()
    steal = StealClock()
    with tempfile.TemporaryDirectory(prefix="solo-open-loop-") as tmp:
        repo = Path(tmp) / "repo"
        export_models(["tiny_cnn"], ["onnxruntime"], repo, options=ExportOptions(max_batch_size=8))
        settle_after_export(time.perf_counter(), print)
        profile = measure_profile(repo, [MODEL], Path(tmp) / "profile.json",
                                  MeasureConfig(seconds=2.0, calibrate=0, pairs=False))
        medians_only = without_cold_tails(profile)
        largest = max(profile.models[MODEL].devices["cpu"].batch_sizes)
        config = ServingConfig((calibration_serving(read_config(entry_dir(repo, MODEL) / CONFIG_NAME), "cpu", 1,
                                                    largest),))
        with TritonServer(repo, models=[MODEL]) as server:
            for rate in RATES:
                schedule = poisson(rate, args.seconds)
                records = TritonTarget(server).run(schedule)
                real = summarize(records)["models"][MODEL]
                sims = {label: summarize(SimTarget(p, config, seed=0).run(schedule))["models"][MODEL]
                        for label, p in (("simulated", profile), ("with median cold extras", medians_only))}
                print(f"{rate:4d} req/s ({records.info.sender} sender): measured p50 {real['p50_s'] * 1e3:.2f} ms, "
                      f"p99 {real['p99_s'] * 1e3:.2f} ms | " + " | ".join(
                          f"{label} p50 {sim['p50_s'] * 1e3:.2f} ms ({error(sim, real, 'p50_s')}), p99 "
                          f"{sim['p99_s'] * 1e3:.2f} ms ({error(sim, real, 'p99_s')})" for label, sim in sims.items()),
                      flush=True)
    print(steal.sentence())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
