"""Telemetry against the real tritonserver (sleep model): /metrics per model, CPU of the server tree, GPU fallback."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pandas as pd
import pytest
import tritonclient.grpc as grpcclient

from serving_bench.errors import ServerError
from serving_bench.serve.ports import free_port
from serving_bench.serve.server import TritonServer
from serving_bench.telemetry import Telemetry
from serving_bench.telemetry.cpu import DISTURBED_SHARE, JUDGED_AFTER_S, StealClock
from serving_bench.telemetry.gpu import GpuBusy, GpuSampler
from serving_bench.telemetry.prometheus import parse_prometheus, scrape

pytestmark = pytest.mark.server

N_REQUESTS = 48


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory):
    """One sleep entry (2 ms + 0.5 ms/item) that batches: 50 ms queue delay, preferred batch 8."""
    from serving_bench.export.sleep import write_sleep_entry

    repo = tmp_path_factory.mktemp("telemetry_repo")
    write_sleep_entry(repo, "sleep_batch", base_ms=2.0, per_item_ms=0.5, max_queue_delay_us=50_000,
                      preferred_batch_sizes=(8,))
    with TritonServer(repo) as server:
        yield server


def _burst(server: TritonServer, n: int) -> list:
    """Send ``n`` single-row requests at once (async gRPC) and wait for all answers."""
    client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
    x = np.ones((1, 4), np.float32)
    inp = grpcclient.InferInput("input", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    errors, done = [], threading.Semaphore(0)

    def callback(result, error):
        errors.append(error)
        done.release()

    for _ in range(n):
        client.async_infer("sleep_batch", [inp], callback)
    for _ in range(n):
        assert done.acquire(timeout=60), "a request was never answered"
    client.close()
    return errors


def test_metrics_text_parses_into_per_model_samples(batching_server):
    samples = scrape(batching_server.endpoints.metrics_url)
    names = {s.name for s in samples if s.labels.get("model") == "sleep_batch"}
    assert {"nv_inference_request_success", "nv_inference_exec_count", "nv_inference_queue_duration_us"} <= names
    parsed = parse_prometheus('# HELP x y\nfoo{model="a",reason="q\\"x"} 3.5\nbar 2 1700000000\nnot a sample\n')
    assert [(s.name, s.labels, s.value) for s in parsed] == [("foo", {"model": "a", "reason": 'q"x'}, 3.5),
                                                             ("bar", {}, 2.0)]


def test_telemetry_sees_requests_batches_queue_and_cpu(batching_server, tmp_path):
    t0 = time.perf_counter()
    with Telemetry(batching_server.endpoints.metrics_url, interval_s=0.1, pid=batching_server.process.pid,
                   t0=t0) as tel:
        time.sleep(0.35)  # an idle stretch first, to check windowing
        traffic_from = time.perf_counter() - t0
        assert all(e is None for e in _burst(batching_server, N_REQUESTS))
        time.sleep(0.25)
    summary = tel.summary()
    model = summary["models"]["sleep_batch"]
    assert model["requests_ok"] == N_REQUESTS and model["requests_failed"] == 0
    assert model["inferences"] == N_REQUESTS
    # 48 simultaneous rows with a 50 ms queue delay and preferred batch 8 cannot run one at a time.
    assert 1 < model["executions"] < N_REQUESTS
    assert model["mean_batch"] == pytest.approx(N_REQUESTS / model["executions"])
    # each request sleeps at least 2 ms + 0.5 ms in the model, and waits in the queue for its batch to form
    assert model["compute_s_mean"] >= 0.0025 and model["queue_s_mean"] > 0
    assert 0 < model["queue_fraction"] < 1
    assert summary["ticks"] >= 4 and summary["errors"] == {}

    cpu = summary["cpu"]
    assert 0 <= cpu["system_util_mean_pct"] <= cpu["system_util_peak_pct"] <= 100
    assert cpu["server_rss_peak_bytes"] > 10e6  # the server and its stub

    gpu = summary["gpu"]
    if not gpu["available"]:
        assert "NVML" in gpu["reason"] and gpu["devices"] == {}

    idle = tel.summary(end_s=traffic_from)["models"]["sleep_batch"]
    assert idle["requests_ok"] == 0 and idle["mean_batch"] is None

    frame = tel.frame()
    assert list(frame.columns) == ["t_s", "source", "metric", "model", "value"]
    assert frame["t_s"].is_monotonic_increasing
    rates = frame[(frame["metric"] == "request_rate_rps") & (frame["model"] == "sleep_batch")]
    assert rates["value"].max() > 0
    batches = frame[frame["metric"] == "exec_batch_mean"]["value"]
    assert (batches >= 1).all() and len(batches) >= 1

    tel.save(tmp_path)
    saved = pd.read_parquet(tmp_path / "telemetry.parquet")
    pd.testing.assert_frame_equal(saved, frame.reset_index(drop=True), check_dtype=False)
    assert json.loads((tmp_path / "telemetry.json").read_text())["models"]["sleep_batch"]["requests_ok"] == N_REQUESTS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["telemetry.csv", "telemetry.json", "telemetry.parquet"]


def test_unreadable_metrics_endpoint_is_a_clear_error():
    port = free_port()
    with pytest.raises(ServerError, match=f"cannot read Triton metrics at 127.0.0.1:{port}"):
        Telemetry(f"127.0.0.1:{port}").start()


def test_cpu_only_telemetry_without_server():
    with Telemetry(None, interval_s=0.05, gpu=False) as tel:
        time.sleep(0.2)
    summary = tel.summary()
    assert "gpu" not in summary and summary["models"] == {}
    assert summary["cpu"]["system_util_mean_pct"] is not None and summary["cpu"]["server_cpu_mean_pct"] is None
    assert set(tel.frame()["source"]) == {"cpu"}


def test_missing_gpu_is_reported_once(caplog):
    first = GpuSampler()
    if first.available:
        first.close()
        pytest.skip("a GPU is present: the no-GPU fallback cannot be exercised")
    caplog.clear()  # ``first`` said it, unless an earlier test in this process already had
    with caplog.at_level("WARNING", logger="serving_bench.telemetry.gpu"):
        second, third = GpuSampler(), GpuSampler()
    assert first.reason and "NVML" in first.reason and second.sample() == [] and not third.available
    assert len(caplog.records) == 0  # already said once in this process


def test_gpu_busy_share_is_none_without_nvml_and_the_block_runs():
    """Where NVML is missing (these CPU machines) a profile's GPU entry records no busy share (the simulator then
    estimates the demand): the block runs, no thread is left, ``share`` is None."""
    if GpuSampler().available:
        pytest.skip("a GPU is present: the no-GPU fallback cannot be exercised")
    ran = []
    with GpuBusy(0, interval_s=0.01) as busy:
        ran.append(True)
        time.sleep(0.05)
    assert ran == [True] and busy.share is None and busy._thread is None
    assert GpuSampler().busy_pct(0) is None


def test_the_steal_clock_judges_a_disturbance_only_over_a_span_long_enough_to_count():
    clock = StealClock()
    assert clock.seconds() >= 0.0 and not clock.disturbed
    # stolen just now: 5 % of the machine's CPU time over a judged span, a far larger share of the short one so far
    clock.stolen -= 0.05 * JUDGED_AFTER_S * (os.cpu_count() or 1)
    assert clock.share() > DISTURBED_SHARE and not clock.disturbed
    clock.started -= JUDGED_AFTER_S  # the same steal over a span long enough to judge
    assert 0.04 < clock.share() <= 0.06 and clock.disturbed
    assert clock.sentence().startswith("the hypervisor took 5.") and clock.sentence().endswith("not comparable)")
