"""Variants on the real tritonserver: resnet50 on ONNX Runtime with 1 and with 2 intra-op threads, and tiny_cnn, one
instance each. The 2-thread instance runs one more runtime thread and serves a batch of 8 faster on this 2-core
host; each instance's memory is read from its own stub process, and resnet50's is the larger."""

from __future__ import annotations

import os
import time

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from serving_bench.export.api import export_models
from serving_bench.export.frameworks import ExportOptions
from serving_bench.models import get_model
from serving_bench.serve.server import TritonServer
from serving_bench.telemetry.energy import cpu_seconds
from serving_bench.telemetry.instances import instance_memory, instance_processes

pytestmark = pytest.mark.server

ONE, TWO, TINY = "resnet50_onnxruntime_intra-1", "resnet50_onnxruntime_intra-2", "tiny_cnn_onnxruntime"
BATCH = 8
ROUNDS = 6
ATTEMPTS = 3
# Other processes may take this much of the host (cores, averaged over an attempt) before the comparison means
# nothing: the 2-thread instance needs the second core. Measured on the shared 2-core VM (2026-12-06, 60 windows):
# others <= 0.15 cores: 1 thread 1.59-1.83x slower; 0.33-0.40: 1.17-1.65x; around 1 core: 0.75-1.1x (two threads
# then wait on each other at every operator).
BUSY_HOST_CORES = 0.2

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


def _attempt(server, client, x: np.ndarray) -> tuple[float, float, float]:
    """(median seconds per batch with 1 thread, with 2, cores other processes took meanwhile)."""
    times: dict[str, list[float]] = {ONE: [], TWO: []}
    ours = [server.pid, os.getpid()]
    host_before, ours_before, started = cpu_seconds([]), cpu_seconds(ours), time.monotonic()
    for i in range(ROUNDS):
        for model in ((ONE, TWO) if i % 2 == 0 else (TWO, ONE)):  # alternate, so drift hits both alike
            times[model].append(_infer(client, model, x))
    elapsed = time.monotonic() - started
    others = (cpu_seconds([])[0] - host_before[0]
              - sum(v - ours_before.get(pid, 0.0) for pid, v in cpu_seconds(ours).items())) / elapsed
    return float(np.median(times[ONE])), float(np.median(times[TWO])), others


def test_one_thread_is_slower_than_two_at_batch_8(served):
    """Judged on the first of up to three attempts during which the host's other processes left the second core
    free (their CPU is measured, not assumed); skipped, with the figures, when none did."""
    server, client = served
    x = get_model("resnet50").make_inputs(BATCH, 1)["input"]
    for model in (ONE, TWO):
        _infer(client, model, x)  # warm: the first run allocates
    seen = []
    for _ in range(ATTEMPTS):
        one, two, others = _attempt(server, client, x)
        if others <= BUSY_HOST_CORES:
            assert one > 1.2 * two, f"1 thread {one:.3f} s, 2 threads {two:.3f} s per batch of {BATCH}"
            return
        seen.append(f"{others:.2f} cores (1 thread {one:.3f} s, 2 threads {two:.3f} s)")
    pytest.skip(f"the host was busy: other processes took {'; '.join(seen)}; comparing 1 and 2 threads needs the "
                f"second core")
