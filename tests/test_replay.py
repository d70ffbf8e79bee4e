"""``serving-bench replay`` end to end on the real server: results folder, saved schedule replayed exactly, unknown
models rejected before anything is sent, and accounting when the server is killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from conformance import assert_target_contract

from serving_bench.cli import main as cli
from serving_bench.load.native import native_check
from serving_bench.load.profile import LoadProfile, build_schedule
from serving_bench.run.schedule import Schedule
from serving_bench.run.records import load_records

pytestmark = pytest.mark.server

PROFILE = {"name": "sleep3", "duration": "3s", "seed": 5, "warmup": "0.5s",
           "arrival": {"process": "poisson", "rate": 60},
           "models": {"sleep_python": {"share": 1, "batch": {1: 3, 2: 1}, "slo": {"p99": "200ms"}}}}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    from serving_bench.export.sleep import write_sleep_entry

    path = tmp_path_factory.mktemp("replay_repo")
    write_sleep_entry(path, "sleep_python", base_ms=5.0, per_item_ms=1.0)
    write_sleep_entry(path, "sleep_zero", base_ms=0.0, per_item_ms=0.0)
    return path


@pytest.fixture()
def profile(tmp_path):
    path = tmp_path / "sleep3.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    return path


@pytest.mark.slow
def test_replay_writes_results_and_a_saved_schedule_replays_exactly(repo, profile, tmp_path, capsys):
    out = tmp_path / "run1"
    assert cli(["replay", str(profile), "--repo", str(repo), "--out", str(out), "--no-progress"]) == 0
    for name in ("records.parquet", "records.csv", "records.json", "summary.json", "perf_analyzer.csv",
                 "schedule.npz", "telemetry.json"):
        assert (out / name).is_file(), name
    schedule = Schedule.load(out / "schedule.npz")
    assert schedule.equals(build_schedule(LoadProfile.load(profile)))
    records = load_records(out)
    assert_target_contract(schedule, records)
    summary = json.loads((out / "summary.json").read_text())
    model = summary["models"]["sleep_python"]
    for key in ("p50_s", "p90_s", "p95_s", "p99_s", "p99.9_s", "mean_s", "throughput_rps", "goodput_rps",
                "lateness_p50_s", "lateness_p99_s", "lateness_max_s", "counts", "slo_met"):
        assert key in model, key
    assert model["counts"]["ok"] == len(schedule) and summary["valid"] and not summary["partial"]
    assert model["p50_s"] >= 0.005  # the model sleeps 5 ms + 1 ms per item
    assert "cpu" in summary["telemetry"] and summary["run"]["mode"] == "open"
    pa = pd.read_csv(out / "perf_analyzer.csv")
    assert list(pa["Model"]) == ["sleep_python", "overall"]
    assert pa.loc[0, "p50 latency"] >= 5000 and pa.loc[0, "Server Compute Infer"] >= 5000  # µs
    assert "sleep_python" in capsys.readouterr().out

    # the saved schedule, replayed against a running server through --url, sends the same requests
    from serving_bench.serve.server import TritonServer

    with TritonServer(repo, models=["sleep_python"]) as server:
        out2 = tmp_path / "run2"
        assert cli(["replay", str(profile), "--url", server.endpoints.grpc_url, "--out", str(out2),
                    "--schedule", str(out / "schedule.npz"), "--no-progress", "--no-telemetry"]) == 0
        # an MLPerf-style Server scenario through the same command
        out3 = tmp_path / "scenario"
        assert cli(["replay", str(profile), "--url", server.endpoints.grpc_url, "--out", str(out3), "--scenario",
                    "server", "--qps", "40", "--min-duration", "1s", "--min-queries", "20"]) == 0
    scenario = json.loads((out3 / "scenario.json").read_text())
    assert scenario["scenario"] == "server" and scenario["valid"] and scenario["qps"] == 40
    assert load_records(out3).table["status"].astype(str).eq("ok").all()
    again = load_records(out2).table
    np.testing.assert_array_equal(again["intended_s"].to_numpy(), records.table["intended_s"].to_numpy())
    np.testing.assert_array_equal(again["batch"].to_numpy(), records.table["batch"].to_numpy())


def test_unknown_model_lists_served_models_and_writes_nothing(repo, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**PROFILE, "models": {"sleep_python": {"share": 1}, "resnet9000": {"share": 1}}}))
    out = tmp_path / "never"
    assert cli(["replay", str(path), "--repo", str(repo), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "resnet9000" in err and "sleep_python, sleep_zero" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_bad_profile_is_one_line_and_exit_2(repo, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**PROFILE, "arrival": {"process": "gamma", "rate": 10}}))
    assert cli(["replay", str(path), "--repo", str(repo), "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {path}: arrival.cv: missing; the gamma process needs rate, cv"


def test_ctrl_c_saves_partial_results_and_accounting_holds_when_the_server_is_killed(repo, tmp_path, capsys):
    import subprocess
    import sys

    from serving_bench.serve.server import TritonServer

    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({**PROFILE, "duration": "6s", "arrival": {"process": "poisson", "rate": 150},
                                    "models": {"sleep_zero": {"share": 1}}}))
    out = tmp_path / "killed"
    server = TritonServer(repo, models=["sleep_zero"]).start()
    try:
        # Ctrl-C: SIGINT to a real `serving-bench replay` process
        interrupted = tmp_path / "interrupted"
        proc = subprocess.Popen([sys.executable, "-m", "serving_bench.cli", "replay", str(path), "--url",
                                 server.endpoints.grpc_url, "--out", str(interrupted), "--no-progress",
                                 "--no-telemetry"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 60
        while not _running(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, output
        records = load_records(interrupted)
        c = assert_target_contract(Schedule.load(interrupted / "schedule.npz"), records)
        assert records.info.partial and records.info.stop_reason == "interrupted (Ctrl-C)"
        assert c["ok"] > 50 and c["not_sent"] > 100

        # server death: SIGKILL of the server's process group mid-run
        killer = threading.Timer(2.0, lambda: os.killpg(server.process.pid, signal.SIGKILL))
        killer.start()
        started = time.monotonic()
        code = cli(["replay", str(path), "--url", server.endpoints.grpc_url, "--out", str(out), "--no-progress",
                    "--no-telemetry", "--timeout", "2s"])
        killer.join()
    finally:
        server.stop()
    assert code == 3 and time.monotonic() - started < 6.0  # stopped at the death, not at the end of the schedule
    records = load_records(out)
    schedule = Schedule.load(out / "schedule.npz")
    c = assert_target_contract(schedule, records)
    assert records.info.partial is True and "server" in records.info.stop_reason
    assert records.info.sender == ("python" if native_check().problem else "native")  # the default: auto
    assert c["ok"] > 100 and c["not_sent"] > 100 and c["sent"] == c["ok"] + c["failed"] + c["timeout"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True and summary["valid"] is False
    assert "partial records saved" in capsys.readouterr().err


def _running(server) -> bool:
    """True once the server has answered an inference (the replay's warm-up request reached it)."""
    from serving_bench.load.driver import TritonTarget

    stats = TritonTarget(server)._stats(["sleep_zero"])
    return stats["sleep_zero"]["inference_count"] > 0
