"""The model zoo: registry, torchvision-identical parameter counts, seeded weights and inputs, declared shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from serving_bench.errors import InputError
from serving_bench.models import MODELS, get_model


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_registry_names_and_unknown_model_lists_valid_names():
    assert {"tiny_cnn", "tiny_mlp", "resnet50", "mobilenet_v3_large", "bert_base", "sleep"} <= set(MODELS)
    with pytest.raises(InputError) as err:
        get_model("resnet51")
    line = err.value.line()
    assert line.startswith("--models: resnet51: unknown model; valid names:")
    assert all(name in line for name in MODELS)


def test_resnet50_has_torchvision_parameter_count():
    assert n_params(get_model("resnet50").create()) == 25_557_032


def test_mobilenet_v3_large_has_torchvision_parameter_count():
    assert n_params(get_model("mobilenet_v3_large").create()) == 5_483_032


def test_bert_base_encoder_parameter_count_and_sequence_length():
    spec = get_model("bert_base", seq_len=8)
    module = spec.create()
    assert n_params(module) == 108_891_648  # BERT-base without the pooler
    assert [t.name for t in spec.inputs] == ["input_ids", "attention_mask"]
    inputs = spec.make_inputs(2, seed=3)
    assert inputs["input_ids"].shape == (2, 8) and inputs["input_ids"].dtype == np.int64
    assert set(np.unique(inputs["attention_mask"])) <= {0, 1} and inputs["attention_mask"][:, 0].all()
    with torch.inference_mode():
        out = module(*(torch.from_numpy(inputs[n]) for n in spec.input_names))
    assert tuple(out.shape) == (2, *spec.outputs[0].shape) == (2, 8, 768)
    with pytest.raises(InputError, match="seq-len"):
        get_model("bert_base", seq_len=1000)
    with pytest.raises(InputError, match="does not take option 'seq_len'"):
        get_model("tiny_cnn", seq_len=8)


@pytest.mark.parametrize("name", ["tiny_cnn", "tiny_mlp", "mobilenet_v3_large"])
def test_declared_shapes_match_the_module(name):
    spec = get_model(name)
    inputs = spec.make_inputs(2, seed=0)
    for t in spec.inputs:
        assert inputs[t.name].shape == (2, *t.shape) and inputs[t.name].dtype == np.dtype(t.dtype)
    with torch.inference_mode():
        out = spec.create(seed=0)(*(torch.from_numpy(inputs[n]) for n in spec.input_names))
    assert tuple(out.shape) == (2, *spec.outputs[0].shape)
    assert torch.isfinite(out).all()


def test_weights_and_inputs_are_seeded():
    spec = get_model("tiny_cnn")
    a, b, c = spec.create(seed=0), spec.create(seed=0), spec.create(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    before = torch.random.get_rng_state()
    spec.create(seed=5)
    assert torch.equal(before, torch.random.get_rng_state())  # the global RNG is left alone
    x0, x1 = spec.make_inputs(3, seed=0)["input"], spec.make_inputs(3, seed=0)["input"]
    assert np.array_equal(x0, x1) and not np.array_equal(x0, spec.make_inputs(3, seed=1)["input"])


def test_fp16_spec_retypes_floats_only():
    spec = get_model("bert_base", seq_len=4).with_precision("fp16")
    assert [t.dtype for t in spec.inputs] == ["int64", "int64"] and spec.outputs[0].dtype == "float16"
    assert get_model("tiny_mlp").with_precision("fp16").make_inputs(1)["input"].dtype == np.float16


def test_sleep_is_a_python_only_model():
    spec = get_model("sleep")
    assert spec.frameworks == ("python",) and spec.build is None
    with pytest.raises(ValueError, match="python-backend"):
        spec.create()
