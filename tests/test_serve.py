"""The real tritonserver serving exported models: ONNX Runtime, TorchScript and TVM runners and an ensemble, one
server for the module (2 instances of the ONNX entry), over gRPC and HTTP, compared with the direct runtimes and
torch; served configs, /metrics, the external-server interface, runner errors, pre-launch faults, clean stop."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from serving_bench.errors import InputError, ServerError
from serving_bench.export.frameworks import load_predictor
from serving_bench.models import get_model
from serving_bench.serve.control import Control
from serving_bench.serving_config import default_threads
from serving_bench.serve.external import ExternalServer
from serving_bench.serve.server import TritonServer, connect
from serving_bench.telemetry import Telemetry

pytestmark = pytest.mark.server

FRAMEWORKS = ("onnxruntime", "torchscript", "tvm")
ENTRIES = [f"tiny_cnn_{fw}" for fw in FRAMEWORKS]
ENSEMBLE = "tiny_ens"
MAX_BATCH = 8
SEED = 0

FAILING_RUNNER = '''
from serving_bench.serve.runners.base import BatchingRunner


class TritonPythonModel(BatchingRunner):
    def run(self, inputs):
        x = inputs["input"]
        if (x < 0).any():
            raise ValueError("negative input rejected by the test runner")
        return {"output": x}
'''


@pytest.fixture(scope="module")
def zoo_repo(tmp_path_factory):
    """tiny_cnn exported by the exporters to ONNX Runtime, TorchScript and TVM, an ensemble of two of them, and a
    python entry whose runner raises on negative input."""
    from serving_bench.export.api import export_models
    from serving_bench.export.frameworks import ExportOptions
    from serving_bench.export.sleep import write_sleep_entry

    repo = tmp_path_factory.mktemp("zoo") / "repo"
    records = export_models(["tiny_cnn"], FRAMEWORKS, repo, options=ExportOptions(max_batch_size=MAX_BATCH, seed=SEED),
                            ensembles=[f"{ENSEMBLE}=tiny_cnn_onnxruntime,tiny_cnn_torchscript"])
    assert {r["name"]: r["status"] for r in records if r["status"] != "exported"} == {}
    entry = write_sleep_entry(repo, "failing_python", base_ms=0, per_item_ms=0, max_batch_size=4)
    (entry / "1" / "model.py").write_text(FAILING_RUNNER)
    return repo


@pytest.fixture(scope="module")
def served(zoo_repo):
    with TritonServer(zoo_repo, instances={"tiny_cnn_onnxruntime": 2}) as server:
        yield server


@pytest.fixture(scope="module")
def reference():
    """torch outputs of the seeded tiny_cnn on seeded inputs (batch 3)."""
    import torch

    spec = get_model("tiny_cnn")
    x = spec.make_inputs(3, seed=7)["input"]
    with torch.no_grad():
        y = spec.create(SEED)(torch.from_numpy(x)).numpy()
    return x, y


def _grpc_infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp]).as_numpy("output")
    finally:
        client.close()


def _http_infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    try:
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp]).as_numpy("output")
    finally:
        client.close()


@pytest.mark.parametrize("entry", ENTRIES)
def test_served_outputs_match_direct_runtime_and_torch(served, zoo_repo, reference, entry):
    x, torch_out = reference
    framework = entry.rsplit("_", 1)[1]
    direct = load_predictor(framework, zoo_repo / entry / "1", ["input"], ["output"], threads=1)({"input": x})["output"]
    via_grpc = _grpc_infer(served.endpoints.grpc_url, entry, x)
    via_http = _http_infer(served.endpoints.http_url, entry, x)
    np.testing.assert_allclose(via_grpc, direct, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(via_http, via_grpc)
    np.testing.assert_allclose(via_grpc, torch_out, rtol=1e-4, atol=1e-5)


def test_ensemble_averages_its_members(served, reference):
    x, torch_out = reference
    out = _grpc_infer(served.endpoints.grpc_url, ENSEMBLE, x)
    members = [_grpc_infer(served.endpoints.grpc_url, m, x) for m in ("tiny_cnn_onnxruntime", "tiny_cnn_torchscript")]
    np.testing.assert_allclose(out, np.mean(members, axis=0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out, torch_out, rtol=1e-4, atol=1e-5)


def test_concurrent_requests_are_split_back_to_their_senders(served, zoo_repo):
    """Many async requests of different batch sizes at once: Triton's batcher merges them, the runner concatenates
    and splits; every request must get exactly its own rows back."""
    predict = load_predictor("torchscript", zoo_repo / "tiny_cnn_torchscript" / "1", ["input"], ["output"])
    spec = get_model("tiny_cnn")
    client = grpcclient.InferenceServerClient(served.endpoints.grpc_url)
    stats_before = client.get_inference_statistics("tiny_cnn_torchscript").model_stats[0]
    sizes = [1, 2, 3, 1, 4, 2, 1, 3] * 3
    inputs = [spec.make_inputs(b, seed=100 + i)["input"] for i, b in enumerate(sizes)]
    results: dict[int, object] = {}
    done = threading.Semaphore(0)
    for i, x in enumerate(inputs):
        inp = grpcclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)

        def callback(result, error, i=i):
            results[i] = error if error is not None else result.as_numpy("output")
            done.release()

        client.async_infer("tiny_cnn_torchscript", [inp], callback)
    for _ in inputs:
        assert done.acquire(timeout=60)
    # Triton counts a batch after its responses are sent: the last one may land just after our callbacks ran
    deadline = time.monotonic() + 5.0
    while True:
        stats = client.get_inference_statistics("tiny_cnn_torchscript").model_stats[0]
        if stats.inference_count - stats_before.inference_count >= sum(sizes) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    client.close()
    for i, x in enumerate(inputs):
        assert isinstance(results[i], np.ndarray), results[i]
        np.testing.assert_allclose(results[i], predict({"input": x})["output"], rtol=1e-5, atol=1e-6)
    assert stats.inference_count - stats_before.inference_count == sum(sizes)
    assert stats.execution_count - stats_before.execution_count <= len(sizes)


def test_served_configs_keep_the_export_and_show_instances(served, zoo_repo):
    from serving_bench.export.repository import read_config

    client = grpcclient.InferenceServerClient(served.endpoints.grpc_url)
    try:
        configs = {m: client.get_model_config(m, as_json=True)["config"] for m in served.served_models}
    finally:
        client.close()
    assert sorted(configs) == sorted(ENTRIES + [ENSEMBLE, f"{ENSEMBLE}_combiner", "failing_python"])
    counts = {m: sum(int(g["count"]) for g in c.get("instance_group", [])) for m, c in configs.items()}
    assert counts["tiny_cnn_onnxruntime"] == 2 and counts["tiny_cnn_torchscript"] == 1 and counts["tiny_cnn_tvm"] == 1
    total = sum(v for k, v in counts.items() if k != ENSEMBLE)
    for name, platform in (("tiny_cnn_onnxruntime", "onnxruntime_onnx"), ("tiny_cnn_torchscript", "pytorch_libtorch")):
        served_cfg, exported = configs[name], read_config(zoo_repo / name / "config.pbtxt")
        assert exported.platform == platform and served_cfg["backend"] == "python"
        assert served_cfg["parameters"]["original_platform"]["string_value"] == platform
        assert int(served_cfg["max_batch_size"]) == exported.max_batch_size == MAX_BATCH
        assert "dynamic_batching" in served_cfg
        assert [(i["name"], i["data_type"], [int(d) for d in i["dims"]]) for i in served_cfg["input"]] == \
            [("input", "TYPE_FP32", [3, 32, 32])]
        assert served_cfg["parameters"]["threads_per_instance"]["string_value"] == str(default_threads(total))
    assert configs[ENSEMBLE]["platform"] == "ensemble"


def test_metrics_and_external_server_interface(served, reference):
    """Reading /metrics through Telemetry, and the same server reached as an external one (``--url``)."""
    x, _ = reference
    with ExternalServer(served.endpoints) as external:  # ports are not the default 8000/8001/8002 layout
        assert external.endpoints == served.endpoints and external.pid is None
        assert set(served.served_models) <= set(external.served_models)
        external.check_alive()
        with Control(external.endpoints.grpc_url) as control:
            before = _successes_once_settled(control, "tiny_cnn_tvm")
            times = control.model_times(["tiny_cnn_tvm"])["tiny_cnn_tvm"]
            with Telemetry(external.endpoints.metrics_url, interval_s=0.1, gpu=False) as tel:
                for _ in range(3):
                    _grpc_infer(external.endpoints.grpc_url, "tiny_cnn_tvm", x)
                assert _successes_once_settled(control, "tiny_cnn_tvm") == before + 3
            # the statistics extension per executed batch size: three batches of 3 rows, each request queued once
            run = control.model_times(["tiny_cnn_tvm"])["tiny_cnn_tvm"].minus(times)
            assert run.batch_counts().keys() == {3} and run.executed(3) == 3 and run.compute_s(3) > 0
            assert run.queue[0] == run.success[0] == 3 and run.inferences == 9 and run.executions == 3
            assert control.batch_stats(["tiny_cnn_tvm"])["tiny_cnn_tvm"][3][0] >= 3
        models = tel.summary()["models"]
    assert models["tiny_cnn_tvm"]["requests_ok"] == 3 and models["tiny_cnn_tvm"]["inferences"] == 9
    assert models["tiny_cnn_onnxruntime"]["requests_ok"] == 0
    assert isinstance(connect(url=served.endpoints.grpc_url), ExternalServer)


def _successes_once_settled(control: Control, model: str, timeout_s: float = 5.0) -> int:
    """The model's success count once two reads 50 ms apart agree: Triton counts a request (statistics and metrics
    together) just after its response has left, so a client that has its answer can read the count one short."""
    last, deadline = None, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        count = control.statistics([model])[model]["success_count"]
        if count == last:
            return count
        last = count
        time.sleep(0.05)
    return last


def test_runner_exception_is_a_triton_error_and_the_server_keeps_serving(served):
    bad = -np.ones((2, 4), np.float32)
    with pytest.raises(grpcclient.InferenceServerException, match="ValueError: negative input rejected"):
        _grpc_infer(served.endpoints.grpc_url, "failing_python", bad)
    np.testing.assert_array_equal(_grpc_infer(served.endpoints.grpc_url, "failing_python", -bad), -bad)
    served.check_alive()


# -- faults found before launch (no server is started) ---------------------------------------------------------------
def _copy_entry(zoo_repo, tmp_path, name="tiny_cnn_onnxruntime"):
    repo = tmp_path / "repo"
    shutil.copytree(zoo_repo / name, repo / name)
    return repo, repo / name


def _server_folders() -> set[str]:
    import glob
    import tempfile

    return set(glob.glob(f"{tempfile.gettempdir()}/serving-bench-server-*"))


def test_malformed_config_is_one_line_before_launch(zoo_repo, tmp_path):
    repo, entry = _copy_entry(zoo_repo, tmp_path)
    (entry / "config.pbtxt").write_text((entry / "config.pbtxt").read_text().replace("max_batch_size", "max_batch_sise"))
    before = _server_folders()
    with pytest.raises(InputError) as err:
        TritonServer(repo).start()
    assert str(entry / "config.pbtxt") in err.value.line() and "max_batch_sise" in err.value.line()
    assert "\n" not in err.value.line() and _server_folders() == before


def test_missing_artifact_is_named_before_launch(zoo_repo, tmp_path):
    repo, entry = _copy_entry(zoo_repo, tmp_path)
    (entry / "1" / "model.onnx").unlink()
    with pytest.raises(InputError, match=r"1/model\.onnx: missing"):
        TritonServer(repo).start()


def test_tensorrt_and_gpu_instances_refused_here_before_launch(zoo_repo, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the refusal cannot be exercised")
    repo, entry = _copy_entry(zoo_repo, tmp_path, "tiny_cnn_torchscript")
    text = (entry / "config.pbtxt").read_text()
    (entry / "config.pbtxt").write_text(text.replace("KIND_CPU", "KIND_GPU"))
    with pytest.raises(InputError, match=r"config.pbtxt: instance_group\[0\]\.kind: KIND_GPU but torch sees no CUDA"):
        TritonServer(repo).start()
    trt = repo / "tiny_trt"
    trt.mkdir()
    (trt / "config.pbtxt").write_text('name: "tiny_trt"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n'
                                      'input { name: "input" data_type: TYPE_FP32 dims: [3, 32, 32] }\n'
                                      'output { name: "output" data_type: TYPE_FP32 dims: [10] }\n')
    with pytest.raises(InputError, match=r"tiny_trt/config.pbtxt: platform: tensorrt_plan cannot be served here: "
                                         r"(the tensorrt Python package cannot be imported|no CUDA GPU)"):
        TritonServer(repo, models=["tiny_trt"]).start()


def test_stop_leaves_no_process(served):
    """Last test of the module: stopping the shared server ends it and all its stubs."""
    pid = served.pid
    assert pid is not None
    assert len(subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split()) >= 6
    served.stop()
    assert subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split() == []
    with pytest.raises(ServerError, match="not running"):
        served.check_alive()
