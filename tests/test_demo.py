"""The demo's committed load profile, and (opt-in, ~10 minutes) the whole demo end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from serving_bench.demo import (DEMO_PROFILE, ENSEMBLE, EXPORT_MODELS, FRAMEWORKS, LATE_LIMIT_S, latest_entry,
                                tune_line)


def test_demo_profile_is_poisson_plus_an_ensemble_burst():
    from serving_bench.load.profile import LoadProfile, build_schedule

    schedule = build_schedule(LoadProfile.load(DEMO_PROFILE))
    exported = {f"{m}_{f}" for m in EXPORT_MODELS for f in FRAMEWORKS} | {ENSEMBLE.split("=")[0]}
    assert set(schedule.models) <= exported and "tiny_ensemble" in schedule.models
    assert set(schedule.meta["slos"]) == set(schedule.models)
    names = schedule.model_names()
    ens = schedule.arrival_s[names == "tiny_ensemble"]
    burst = ((ens >= 12) & (ens < 18)).sum() / 6.0
    quiet = ((ens < 12) | (ens >= 18)).sum() / 24.0
    assert 3.0 < burst / quiet < 12.0  # a 6x burst, within Poisson noise
    singles = schedule.arrival_s[names != "tiny_ensemble"]
    gaps = np.diff(singles)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.15  # Poisson: exponential gaps, CV 1


def test_a_replay_is_judged_late_by_its_latest_entry():
    # the demo's replay of 2026-12-02: 0.8 ms late at p99 over all requests, but a stall held tiny_cnn_tvm's sends
    summary = {"overall": {"lateness_p99_s": 0.0008},
               "models": {"resnet50_onnxruntime": {"lateness_p99_s": 0.0004},
                          "tiny_cnn_tvm": {"lateness_p99_s": 0.0038}, "tiny_ensemble": {"lateness_p99_s": None}}}
    entry, late = latest_entry(summary)
    assert (entry, late) == ("tiny_cnn_tvm", 0.0038) and late > LATE_LIMIT_S > summary["overall"]["lateness_p99_s"]


def test_the_tune_line_says_what_triton_measured_not_only_what_the_simulator_predicted():
    verified = {"satisfiable": True, "verification": [{"slo_met": False, "capacity": {
        "predicted_scale": 2.5, "held_at_capacity": False, "agrees": False}}]}
    assert tune_line(verified) == ("on the simulator the pick meets its SLOs up to 2.50x the load; on Triton it "
                                   "missed them at 1x and missed them at the predicted capacity (the replays "
                                   "disagree with the prediction: see the report)")
    missed = {"satisfiable": False, "verification": [{"slo_met": False, "capacity": {
        "predicted_scale": 0.0, "held_at_capacity": None, "agrees": True}}]}
    assert tune_line(missed) == "on the simulator the pick misses its SLOs; on Triton it missed them at 1x"
    assert tune_line({"satisfiable": True, "verification": []}).endswith("not verified on Triton")
    interval = {"low_scale": 2.0, "high_scale": 3.0, "confidence": 0.9}
    for holds, where in ((True, "inside"), (False, "outside"), (None, "not placed by the replays against")):
        verified["verification"][0]["capacity"]["interval"] = dict(interval, holds=holds)
        assert tune_line(verified).endswith(f"(the replays disagree with the prediction: see the report); the "
                                            f"measured capacity is {where} the pick's 90% interval (2.00× to 3.00×)")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SERVING_BENCH_SLOW") != "1",
                    reason="the full demo takes ~10 minutes on 2 cores; `make demo` runs it (set SERVING_BENCH_SLOW=1 "
                           "to run it here)")
def test_demo_end_to_end(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "serving_bench.cli", "demo", "--out", str(out), "--repo",
                           str(tmp_path / "repo")], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stages = json.loads((out / "demo.json").read_text())
    assert all(s["status"] == "ok" for s in stages.values()), stages
    assert f"report: {(out / 'report.html').resolve()}" in proc.stdout
    data = json.loads((out / "report.json").read_text())
    assert data["tune"]["verification"] and data["validation"] and data["telemetry"]
    assert Path(data["tune"]["tuned_repo"]).is_dir()
