"""Shared fixtures. Tests that need a server start the real tritonserver on 127.0.0.1 (free ports) and stop it."""

from __future__ import annotations

import os

import pytest

# Keep runners and test processes from oversubscribing the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def sleep_repo(tmp_path_factory):
    """A repository with two sleep entries: ``sleep_python`` (5 ms + 1 ms/item) and ``sleep_zero`` (no service time)."""
    from serving_bench.export.sleep import write_sleep_entry

    repo = tmp_path_factory.mktemp("sleep_repo")
    write_sleep_entry(repo, "sleep_python", base_ms=5.0, per_item_ms=1.0)
    write_sleep_entry(repo, "sleep_zero", base_ms=0.0, per_item_ms=0.0)
    return repo


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory):
    """tiny_cnn and tiny_mlp exported to every framework (max batch 4; TensorRT is skipped without a GPU), the sleep
    model, and the ensemble ``ens`` = tiny_cnn_onnxruntime + tiny_cnn_torchscript. Read-only: copy it to change it.
    Returns ``(repo, records)``."""
    from serving_bench.export.api import export_models
    from serving_bench.export.frameworks import ExportOptions

    repo = tmp_path_factory.mktemp("tiny_repo")
    records = export_models("tiny_cnn,tiny_mlp,sleep", "torchscript,onnxruntime,tvm,tensorrt", repo,
                            options=ExportOptions(max_batch_size=4),
                            ensembles=["ens=tiny_cnn_onnxruntime,tiny_cnn_torchscript"])
    return repo, records
