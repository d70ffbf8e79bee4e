"""Variants on the real tritonserver: resnet50 on ONNX Runtime with 1 and with 2 intra-op threads, and tiny_cnn, one
instance each. The 2-thread instance runs one more runtime thread, and serves a batch of 8 faster where this host's
two CPUs make ONNX Runtime itself faster with two threads (measured here, in this process, first: on a host whose two
CPUs are one core's hyperthreads they may not); each instance's memory is read from its own stub process, and
resnet50's is the larger."""

from __future__ import annotations

import os
import time

import numpy as np
import onnxruntime as ort
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
FASTER = 1.2  # what "slower" means here: 1 thread's time per batch over 2 threads'


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


def _timed(runs: dict, x: np.ndarray) -> tuple[dict[str, float], float]:
    """Median seconds per batch of each of ``runs`` (name -> a call on ``x``, taken in alternation so that drift hits
    all alike) and the cores other processes than this one and the server's took meanwhile."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    ours = [os.getpid()]  # and the server, its child (cpu_seconds counts descendants)
    host_before, ours_before, started = cpu_seconds([]), cpu_seconds(ours), time.monotonic()
    for i in range(ROUNDS):
        for name in (list(runs) if i % 2 == 0 else list(reversed(runs))):
            start = time.perf_counter()
            runs[name](x)
            times[name].append(time.perf_counter() - start)
    elapsed = time.monotonic() - started
    others = (cpu_seconds([])[0] - host_before[0]
              - sum(v - ours_before.get(pid, 0.0) for pid, v in cpu_seconds(ours).items())) / elapsed
    return {name: float(np.median(t)) for name, t in times.items()}, others


def _quiet_medians(runs: dict, x: np.ndarray, what: str) -> dict[str, float]:
    """:func:`_timed` on the first of :data:`ATTEMPTS` attempts during which the host's other processes left the
    second core free (their CPU is measured, not assumed); the test is skipped, with the figures, when none did."""
    seen = []
    for _ in range(ATTEMPTS):
        medians, others = _timed(runs, x)
        if others <= BUSY_HOST_CORES:
            return medians
        seen.append(f"{others:.2f} cores ({', '.join(f'{k} {v:.3f} s' for k, v in medians.items())})")
    pytest.skip(f"{what}: the host was busy, other processes took {'; '.join(seen)}; comparing 1 and 2 threads needs "
                f"the second core")


@pytest.mark.exclusive
def test_one_thread_is_slower_than_two_at_batch_8_where_the_host_makes_two_faster(served):
    server, client = served
    x = get_model("resnet50").make_inputs(BATCH, 1)["input"]
    model_file = next((server.repo / ONE).glob("*/model.onnx"))
    sessions = {}
    for threads in (1, 2):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        sessions[f"{threads} thread(s) in this process"] = ort.InferenceSession(
            str(model_file), options, providers=["CPUExecutionProvider"])
    direct = {name: (lambda x, s=s: s.run(None, {"input": x})) for name, s in sessions.items()}
    for run in direct.values():
        run(x)  # warm: the first run allocates
    alone = _quiet_medians(direct, x, "ONNX Runtime in this process")
    one, two = alone.values()
    if one <= FASTER * two:
        pytest.skip(f"this host's two CPUs do not make ONNX Runtime faster with two threads (1 thread {one:.3f} s, "
                    f"2 threads {two:.3f} s per batch of {BATCH}, in this process): the served comparison would "
                    f"measure the host, not the setting")
    served_runs = {model: (lambda x, m=model: _infer(client, m, x)) for model in (ONE, TWO)}
    for run in served_runs.values():
        run(x)
    through_triton = _quiet_medians(served_runs, x, "served on Triton")
    assert through_triton[ONE] > FASTER * through_triton[TWO], (through_triton, alone)
