"""Request payloads from model metadata: seeded samples, .npy files, dynamic shapes, batch checks (no server)."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from serving_bench.errors import InputError
from serving_bench.load.inputs import ModelSpec, SampleBank, TensorSpec, check_batch, infer_request

BERTISH = ModelSpec("bert_base_onnxruntime", (TensorSpec("input_ids", "INT64", (-1,)),
                                              TensorSpec("attention_mask", "INT64", (-1,))), 8)
IMAGE = ModelSpec("tiny_cnn_onnxruntime", (TensorSpec("input", "FP32", (3, 8, 8)),), 16)


def test_samples_are_seeded_per_index_and_batches_wrap():
    a = SampleBank(IMAGE, samples=4, seed=7)
    b = SampleBank(IMAGE, samples=4, seed=7)
    np.testing.assert_array_equal(a.items["input"], b.items["input"])
    assert not np.array_equal(a.items["input"], SampleBank(IMAGE, samples=4, seed=8).items["input"])
    batch = a.batch(3, 3)["input"]
    assert batch.shape == (3, 3, 8, 8) and batch.dtype == np.float32
    np.testing.assert_array_equal(batch[1], a.items["input"][0])  # sample 4 wraps to 0


def test_dynamic_shapes_need_sizes_and_masks_are_ones():
    with pytest.raises(InputError, match=r"p.yaml: models.bert_base_onnxruntime.shapes.input_ids: .*dynamic shape"):
        SampleBank(BERTISH, samples=2, seed=0, source="p.yaml")
    bank = SampleBank(BERTISH, samples=2, seed=0, shapes={"input_ids": [16], "attention_mask": [16]})
    assert bank.items["input_ids"].shape == (2, 16) and bank.items["input_ids"].dtype == np.int64
    assert (bank.items["attention_mask"] == 1).all()


def test_npy_inputs_and_their_errors(tmp_path):
    data = np.arange(5 * 3 * 8 * 8, dtype=np.float32).reshape(5, 3, 8, 8)
    np.save(tmp_path / "x.npy", data)
    bank = SampleBank(IMAGE, samples=2, seed=0, files={"input": str(tmp_path / "x.npy")})
    np.testing.assert_array_equal(bank.batch(4, 2)["input"], data[[4, 0]])
    np.save(tmp_path / "bad.npy", np.zeros((5, 3, 4, 4), np.float32))
    with pytest.raises(InputError, match=r"models.tiny_cnn_onnxruntime.inputs.input: .*expected \[N, 3, 8, 8\]"):
        SampleBank(IMAGE, samples=2, seed=0, files={"input": str(tmp_path / "bad.npy")}, source="p.yaml")
    with pytest.raises(InputError, match=r"inputs.pixels: not an input of the served model; inputs: input"):
        SampleBank(IMAGE, samples=2, seed=0, files={"pixels": str(tmp_path / "x.npy")}, source="p.yaml")


def test_serialized_request_round_trips():
    bank = SampleBank(IMAGE, samples=3, seed=1)
    payload = infer_request(IMAGE, bank.batch(1, 2))
    request = service_pb2.ModelInferRequest.FromString(payload)
    assert request.model_name == IMAGE.name and list(request.inputs[0].shape) == [2, 3, 8, 8]
    got = np.frombuffer(request.raw_input_contents[0], dtype=np.float32).reshape(2, 3, 8, 8)
    np.testing.assert_array_equal(got, bank.batch(1, 2)["input"])
    unbatched = ModelSpec("plain", (TensorSpec("input", "FP32", (4,)),), 0)
    request = service_pb2.ModelInferRequest.FromString(infer_request(unbatched, SampleBank(unbatched, samples=1,
                                                                                           seed=0).batch(0, 1)))
    assert list(request.inputs[0].shape) == [4]


def test_batch_limits():
    check_batch(IMAGE, 16, "p.yaml")
    with pytest.raises(InputError, match=r"models.tiny_cnn_onnxruntime.batch: expected <= the model's max_batch_size 16"):
        check_batch(IMAGE, 17, "p.yaml")
    with pytest.raises(InputError, match=r"does not batch"):
        check_batch(ModelSpec("plain", (), 0), 2, "p.yaml")
