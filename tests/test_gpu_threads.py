"""The campaign's runs without Triton (``scripts/gpu_threads.py``) on the CPU: threads of one process running an
exported TorchScript entry closed loop — every thread's answers counted in the window, each thread's first call left
out, a thread whose call fails stops the run with that error instead of leaving the others waiting — and the GPU
activity sampler saying why it has nothing here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from serving_bench.export.api import export_models
from serving_bench.export.frameworks import ExportOptions

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str):
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    [record] = export_models(["tiny_mlp"], ["torchscript"], repo, options=ExportOptions(max_batch_size=4))
    assert record["status"] == "exported"
    return repo


def test_threads_of_one_entry_closed_loop(exported):
    threads = _load("gpu_threads")
    entry = threads.Entry("tiny_mlp_torchscript", "tiny_mlp", "torchscript", "fp32")
    windows = threads.Windows(0.05, 0.3, (2,), (1,))
    predictors = threads.Predictors(exported, "eager", "cpu", windows.sizes)
    work = [(entry, p, entry.inputs(1)) for p in predictors.get(entry, 2)]
    figures, raw = threads.run_threads(work, windows, "cpu")
    row = figures["models"]["tiny_mlp_torchscript"]
    assert row["requests"] == len(raw["tiny_mlp_torchscript"]) > 10 and row["throughput_rps"] > 10
    assert 0 < row["p50_ms"] <= row["p99_ms"] and np.all(raw["tiny_mlp_torchscript"] > 0)
    assert figures["gpu"]["available"] is False and figures["gpu"]["reason"].startswith("NVML unavailable")
    assert figures["gpu"]["busy_pct"] is None and figures["gpu"]["sm_active_pct"] is None
    assert [label for label, _, _ in threads.plan_runs([entry, entry], windows)] == [
        "tiny_mlp_torchscript b1", "tiny_mlp_torchscript b1", "tiny_mlp_torchscript x2", "tiny_mlp_torchscript x2",
        "pair tiny_mlp_torchscript + tiny_mlp_torchscript"]


def test_a_failing_thread_stops_the_run_with_its_error(exported):
    """Inputs of the wrong width: torch's own error comes back at once; the other thread is not left waiting."""
    threads = _load("gpu_threads")
    entry = threads.Entry("tiny_mlp_torchscript", "tiny_mlp", "torchscript", "fp32")
    predict = threads.Predictors(exported, "eager", "cpu", (1,)).get(entry, 1)[0]
    good, bad = entry.inputs(1), {"input": np.zeros((1, 3), np.float32)}
    with pytest.raises(RuntimeError):
        threads.run_threads([(entry, predict, good), (entry, predict, bad)], threads.Windows(0.05, 0.2, (), (1,)),
                            "cpu")
