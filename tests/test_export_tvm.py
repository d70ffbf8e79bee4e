"""TVM specifics: static batch buckets with zero padding (the tuned runtime path) and MetaSchedule record reuse."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from serving_bench.export.frameworks import load_predictor
from serving_bench.export.parity import torch_outputs
from serving_bench.export.tvm_tune import bucket_for, buckets
from serving_bench.models import get_model


def test_buckets_cover_every_batch_size():
    assert buckets(32) == [1, 2, 4, 8, 16, 32]
    assert buckets(6) == [1, 2, 4, 6] and buckets(1) == [1]
    assert [bucket_for(b, buckets(6)) for b in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    with pytest.raises(ValueError, match="larger than the largest"):
        bucket_for(7, buckets(6))


def test_static_buckets_pad_and_trim(tmp_path):
    """The tuned entry's runtime path without the (slow) tuning: static bucket functions compiled untuned."""
    import tvm

    from serving_bench.export.tvm_export import host_target, import_onnx
    from serving_bench.export.tvm_tune import add_static_buckets

    spec = get_model("tiny_mlp")
    module = spec.create(seed=0)
    mod = add_static_buckets(import_onnx(module, spec, 4, 0), buckets(4))
    tvm.compile(mod, target=tvm.target.Target(host_target())).export_library(str(tmp_path / "model.so"))
    predict = load_predictor("tvm", tmp_path, spec.input_names, spec.output_names, buckets="1,2,4")
    for batch in (1, 3, 4):  # 3 runs in bucket 4 with one padding row
        inputs = spec.make_inputs(batch, seed=batch)
        got = predict(inputs)["output"]
        assert got.shape == (batch, 8)
        np.testing.assert_allclose(got, torch_outputs(module, spec, inputs)["output"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SERVING_BENCH_SLOW") != "1",
                    reason="MetaSchedule tuning takes minutes on 2 cores (set SERVING_BENCH_SLOW=1 to run it)")
def test_tuning_records_are_cached_and_reused(tmp_path, monkeypatch):
    from serving_bench.export.api import export_models
    from serving_bench.export.frameworks import ExportOptions
    from serving_bench.export.repository import load_manifest, read_config

    monkeypatch.setenv("SERVING_BENCH_CACHE", str(tmp_path / "cache"))
    first = export_models("tiny_mlp", "tvm", tmp_path / "a",
                          options=ExportOptions(max_batch_size=2, tvm_tune_trials=2))[0]
    assert first["status"] == "exported" and first["settings"]["reused"] is False
    assert first["settings"]["tasks"] >= 1 and first["settings"]["buckets"] == [1, 2]
    records = list((tmp_path / "cache" / "tvm-tuning").glob("tiny_mlp-*/database_tuning_record.json"))
    assert len(records) == 1 and records[0].read_text().strip()
    second = export_models("tiny_mlp", "tvm", tmp_path / "b",
                           options=ExportOptions(max_batch_size=2, tvm_tune_trials=2))[0]
    assert second["settings"]["reused"] is True and second["parity_error"] <= 1e-4
    assert read_config(tmp_path / "b" / "tiny_mlp_tvm" / "config.pbtxt").parameters["buckets"].string_value == "1,2"
    assert json.loads(json.dumps(load_manifest(tmp_path / "b")["entries"]["tiny_mlp_tvm"]["settings"]))["reused"]
