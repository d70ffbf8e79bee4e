"""Variants on the real tritonserver: resnet50 on ONNX Runtime with 1 and with 2 intra-op threads, and tiny_cnn, one
instance each. The 2-thread instance runs one more runtime thread (the setting is applied; how much faster it serves is
a benchmark's question, benchmarks/frameworks.py, not a timed test's); each instance's memory is read from its own stub
process, and resnet50's is the larger."""

from __future__ import annotations

import time

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from serving_bench.export.api import export_models
from serving_bench.export.frameworks import ExportOptions
from serving_bench.models import get_model
from serving_bench.serve.server import TritonServer
from serving_bench.telemetry.instances import instance_memory, instance_processes

pytestmark = pytest.mark.server

ONE, TWO, TINY = "resnet50_onnxruntime_intra-1", "resnet50_onnxruntime_intra-2", "tiny_cnn_onnxruntime"
BATCH = 8


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("variants") / "repo"
    records = export_models("resnet50", options=ExportOptions(max_batch_size=BATCH), repo=repo,
                            variants="onnxruntime:intra=1,onnxruntime:intra=2")
    records += export_models("tiny_cnn", options=ExportOptions(max_batch_size=BATCH), repo=repo, variants="onnxruntime")
    assert [r["status"] for r in records] == ["exported"] * 3, records
    with TritonServer(repo) as server:
        client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
        yield server, client
        client.close()


def _infer(client, model: str, x: np.ndarray) -> float:
    """Seconds for one request of ``x``."""
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    start = time.perf_counter()
    client.infer(model, [tensor])
    return time.perf_counter() - start


def test_each_instance_is_found_by_its_stub_and_its_memory_read(served):
    server, client = served
    x = get_model("resnet50").make_inputs(BATCH, 0)["input"]
    for model in (ONE, TINY):
        _infer(client, model, x if model == ONE else get_model("tiny_cnn").make_inputs(BATCH, 0)["input"])
    found = instance_processes(server.pid)
    assert [(p.model, p.instance) for p in found] == [(ONE, f"{ONE}_0_0"), (TWO, f"{TWO}_0_0"), (TINY, f"{TINY}_0_0")]
    reading = instance_memory(server.pid)
    memory = {m.model: m for m in reading.instances}
    for m in memory.values():
        assert 20e6 < m.rss_bytes <= m.peak_rss_bytes < 4e9
        assert m.uss_bytes is None or m.uss_bytes <= m.rss_bytes
    # resnet50's 25.6 M fp32 weights (102 MB) and a batch of 8's activations live in its instance, not tiny_cnn's
    assert memory[ONE].peak_rss_bytes - memory[TINY].peak_rss_bytes > 80e6
    assert memory[ONE].uss_bytes is None or memory[ONE].uss_bytes - memory[TINY].uss_bytes > 80e6
    if reading.device != "nvml":
        assert all(m.device_bytes is None for m in memory.values()) and "NVML" in reading.device
    by_model = reading.by_model()
    assert by_model[ONE]["instances"] == 1 and by_model[ONE]["rss_bytes"] == memory[ONE].rss_bytes


def test_the_two_thread_instance_runs_one_more_runtime_thread(served):
    """ONNX Runtime starts intra-op threads - 1 pool threads with the session: the runner applied the entry's
    setting (both instances are otherwise the same artifact, runner and server)."""
    server, _ = served
    threads = {p.model: psutil.Process(p.pid).num_threads() for p in instance_processes(server.pid)}
    assert threads[TWO] == threads[ONE] + 1
