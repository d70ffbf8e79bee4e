"""The runtime view's file layout and the runner helpers that need no server (fast)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from serving_bench.export.repository import read_config
from serving_bench.export.sleep import write_sleep_entry
from serving_bench.serve.runners import PACKAGE_DIR, SAFE_RUNNER_NAME
from serving_bench.serving_config import default_threads
from serving_bench.serve.runners.cuda_graphs import parse_batch_sizes
from serving_bench.serve.runtime_view import build_runtime_repo


def test_default_threads_fit_instances_into_cores():
    assert default_threads(1, cores=8) == 8
    assert default_threads(3, cores=8) == 2
    assert default_threads(16, cores=8) == 1  # oversubscribed: one thread each
    assert default_threads(0, cores=2) == 2


def test_view_links_package_sets_threads_and_keeps_configs(tmp_path):
    repo = tmp_path / "repo"
    write_sleep_entry(repo, "sleep_a", base_ms=1, per_item_ms=0, instances=1)
    write_sleep_entry(repo, "sleep_b", base_ms=1, per_item_ms=0, instances=1)
    view = tmp_path / "view"
    names = build_runtime_repo(repo, view, instances={"sleep_b": 3}, threads_per_instance=None)
    assert names == ["sleep_a", "sleep_b"]
    a, b = read_config(view / "sleep_a" / "config.pbtxt"), read_config(view / "sleep_b" / "config.pbtxt")
    assert [g.count for g in b.instance_group] == [3] and [g.count for g in a.instance_group] == [1]
    expected = str(default_threads(4))
    assert a.parameters["threads_per_instance"].string_value == b.parameters["threads_per_instance"].string_value \
        == expected
    assert a.parameters["base_ms"].string_value == "1.0"
    assert os.readlink(view / "sleep_a" / "serving_bench") == str(PACKAGE_DIR)
    assert (view / "sleep_a" / "1").resolve() == (repo / "sleep_a" / "1").resolve()
    assert read_config(repo / "sleep_b" / "config.pbtxt").instance_group[0].count == 1  # repository untouched


def test_default_threads_count_every_instance_triton_starts(tmp_path, monkeypatch):
    """A KIND_GPU group of count 2 over GPUs 0 and 1 starts four instances (Triton starts ``count`` on each listed
    GPU), so with a one-instance entry beside it a 16-core host gives each 16 // 5 = 3 threads, not 16 // 3 = 5. The
    view is only written, never served: the host's core count and torch's GPU check are set to a 16-core GPU host's."""
    from tritonclient.grpc import model_config_pb2 as mc

    from serving_bench.export.repository import write_config

    repo = tmp_path / "repo"
    write_sleep_entry(repo, "sleep_a", base_ms=1, per_item_ms=0, instances=1)
    gpu = write_sleep_entry(repo, "sleep_gpu", base_ms=1, per_item_ms=0, instances=1)
    config = read_config(gpu / "config.pbtxt")
    del config.instance_group[:]
    config.instance_group.add(count=2, kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0, 1])
    write_config(config, gpu / "config.pbtxt")
    monkeypatch.setattr("serving_bench.serving_config.cpu_cores", lambda: 16)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    build_runtime_repo(repo, tmp_path / "view", validate=False)
    for name in ("sleep_a", "sleep_gpu"):
        assert read_config(tmp_path / "view" / name / "config.pbtxt").parameters[
            "threads_per_instance"].string_value == "3"


def test_runner_shadowed_by_an_extension_module_is_renamed(tmp_path):
    """The stub imports ``model``: a ``model.so`` beside ``model.py`` (TVM's library) would win, so the view links
    the runner under another name and points ``default_model_filename`` at it."""
    repo = tmp_path / "repo"
    entry = write_sleep_entry(repo, "shadowed", base_ms=0, per_item_ms=0)
    (entry / "1" / "model.so").write_bytes(b"")  # only its name matters here; the real case is tests/test_serve.py
    view = tmp_path / "view"
    build_runtime_repo(repo, view, validate=False)
    served = read_config(view / "shadowed" / "config.pbtxt")
    assert served.default_model_filename == SAFE_RUNNER_NAME
    version = view / "shadowed" / "1"
    assert version.is_dir() and not version.is_symlink()
    assert sorted(p.name for p in version.iterdir()) == ["model.so", SAFE_RUNNER_NAME]
    assert (version / SAFE_RUNNER_NAME).resolve() == (entry / "1" / "model.py").resolve()


def test_parse_cuda_graph_batch_sizes():
    assert parse_batch_sizes("", 8) == [] and parse_batch_sizes("off", 8) == []
    assert parse_batch_sizes("all", 4) == [1, 2, 3, 4]
    assert parse_batch_sizes("8,1,2,2", 8) == [1, 2, 8]
    with pytest.raises(ValueError, match="batch sizes in 1..8"):
        parse_batch_sizes("16", 8)


def test_cuda_graph_predictor_matches_eager():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here: CUDA graphs run only on a GPU (scripts/gpu_check.sh exercises them)")
    from serving_bench.models import get_model
    from serving_bench.serve.runners.cuda_graphs import CudaGraphPredictor

    spec = get_model("tiny_cnn")
    module = torch.jit.trace(spec.create(0), torch.from_numpy(spec.make_inputs(2, 0)["input"])).cuda().eval()
    predictor = CudaGraphPredictor(module, "cuda:0", ["input"], ["output"], spec.make_inputs(1, 0), [1, 4])
    for batch in (1, 3, 4, 6):  # captured, padded, captured, eager
        x = spec.make_inputs(batch, seed=batch)
        with torch.inference_mode():
            want = module(torch.from_numpy(x["input"]).cuda()).cpu().numpy()
        np.testing.assert_allclose(predictor(x)["output"], want, rtol=1e-4, atol=1e-5)


FREED_BLOCKS = """
import sys
import numpy as np, psutil
from serving_bench.serve.malloc import fix_mmap_threshold
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold()
process = psutil.Process()
big = np.ones((8 << 20) // 8); del big  # a large mapped block freed: glibc's dynamic threshold rises past 1 MiB
base = process.memory_info().rss
blocks = [np.ones((1 << 20) // 8) for _ in range(64)]
keep = [np.ones(1000) for _ in range(100)]  # small blocks above them on the heap
del blocks
print((process.memory_info().rss - base) / 2 ** 20)
"""


def test_a_runner_with_the_threshold_fixed_gives_freed_blocks_back():
    """What each runner does when its instance starts (``serve.malloc.fix_mmap_threshold``): 64 blocks of 1 MiB,
    freed, leave the process as they found it; with glibc's dynamic threshold (raised by an 8 MiB block freed
    before) they stay resident, and an instance's memory depends on what it ran before."""
    def grown(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", FREED_BLOCKS, mode], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        return float(out.stdout)

    assert grown("fixed") < 8 and grown("dynamic") > 48
