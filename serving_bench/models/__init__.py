"""The model zoo: a registry of :class:`ModelSpec` keyed by name, plain torch, seeded, no weight downloads.

    spec = get_model("tiny_cnn")                  # or get_model("bert_base", seq_len=64)
    module = spec.create(seed=0)                  # torch module, eval mode, deterministic weights
    inputs = spec.make_inputs(batch=8, seed=0)    # {"input": float32 array (8, 3, 32, 32)}

Names: ``tiny_cnn``, ``tiny_mlp`` (tests), ``resnet50``, ``mobilenet_v3_large``, ``bert_base`` and ``sleep`` (a
python-backend model with a deterministic service time; it exports only as the entry ``sleep_python``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from serving_bench.errors import InputError
from serving_bench.models.spec import PRECISIONS, ModelSpec, TensorSpec

__all__ = ["MODELS", "MODEL_OPTIONS", "ModelSpec", "TensorSpec", "PRECISIONS", "SLEEP_FEATURES", "get_model",
           "model_names"]

SLEEP_FEATURES = 4  # width of the sleep model's echoed float32 input


def _tiny_cnn() -> ModelSpec:
    from serving_bench.models.tiny import TinyCNN  # heavy: imports torch
    return ModelSpec("tiny_cnn", "3x32x32 -> 10 logits; two convs, batch norm, pooling, linear (tests)",
                     inputs=(TensorSpec("input", "float32", (3, 32, 32)),),
                     outputs=(TensorSpec("output", "float32", (10,)),), build=TinyCNN)


def _tiny_mlp() -> ModelSpec:
    from serving_bench.models.tiny import TinyMLP  # heavy: imports torch
    return ModelSpec("tiny_mlp", "16 -> 8; Linear, GELU, Linear (tests)",
                     inputs=(TensorSpec("input", "float32", (16,)),),
                     outputs=(TensorSpec("output", "float32", (8,)),), build=TinyMLP)


def _resnet50() -> ModelSpec:
    from serving_bench.models.resnet import resnet50  # heavy: imports torch
    return ModelSpec("resnet50", "ResNet-50, torchvision architecture, 3x224x224 -> 1000 logits (25.6 M parameters)",
                     inputs=(TensorSpec("input", "float32", (3, 224, 224)),),
                     outputs=(TensorSpec("output", "float32", (1000,)),), build=resnet50)


def _mobilenet_v3_large() -> ModelSpec:
    from serving_bench.models.mobilenet import mobilenet_v3_large  # heavy: imports torch
    return ModelSpec("mobilenet_v3_large",
                     "MobileNetV3-Large, torchvision architecture, 3x224x224 -> 1000 logits (5.5 M parameters)",
                     inputs=(TensorSpec("input", "float32", (3, 224, 224)),),
                     outputs=(TensorSpec("output", "float32", (1000,)),), build=mobilenet_v3_large)


def _bert_sample(batch: int, rng: np.random.Generator, spec: ModelSpec) -> dict[str, np.ndarray]:
    """Random token ids; each row has a random real length in [seq_len/4, seq_len], the rest is padding."""
    seq_len = spec.inputs[0].shape[0]
    ids = rng.integers(spec.inputs[0].low, spec.inputs[0].high, size=(batch, seq_len))
    lengths = rng.integers(max(1, seq_len // 4), seq_len + 1, size=batch)
    mask = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int64)
    return {"input_ids": ids * mask, "attention_mask": mask}


def _bert_base(seq_len: int = 128) -> ModelSpec:
    from serving_bench.models.bert import BertConfig, BertEncoder  # heavy: imports torch
    seq_len = int(seq_len)
    cfg = BertConfig()
    if not 1 <= seq_len <= cfg.max_positions:
        raise InputError("--seq-len", None, f"sequence length must be in 1..{cfg.max_positions}, got {seq_len}")
    return ModelSpec("bert_base",
                     f"BERT-base encoder, sequence length {seq_len}; last hidden state (108.9 M parameters)",
                     inputs=(TensorSpec("input_ids", "int64", (seq_len,), 0, cfg.vocab_size),
                             TensorSpec("attention_mask", "int64", (seq_len,), 0, 2)),
                     outputs=(TensorSpec("output", "float32", (seq_len, cfg.hidden)),),
                     build=lambda: BertEncoder(cfg, seq_len), sample=_bert_sample)


def _sleep() -> ModelSpec:
    return ModelSpec("sleep", "deterministic service time base_ms + per_item_ms * items; echoes its input "
                              "(python backend, exported as sleep_python)",
                     inputs=(TensorSpec("input", "float32", (SLEEP_FEATURES,)),),
                     outputs=(TensorSpec("output", "float32", (SLEEP_FEATURES,)),), frameworks=("python",))


# name -> factory(**options) -> ModelSpec. Options: bert_base takes seq_len.
MODELS: dict[str, Callable[..., ModelSpec]] = {
    "tiny_cnn": _tiny_cnn,
    "tiny_mlp": _tiny_mlp,
    "resnet50": _resnet50,
    "mobilenet_v3_large": _mobilenet_v3_large,
    "bert_base": _bert_base,
    "sleep": _sleep,
}
MODEL_OPTIONS = {"bert_base": ("seq_len",)}


def model_names() -> list[str]:
    return list(MODELS)


def get_model(name: str, source: str = "--models", **options) -> ModelSpec:
    """The spec of zoo model ``name``; unknown names raise :class:`InputError` listing the valid ones.

    ``options`` the model does not take (everything but ``seq_len`` for ``bert_base``) are ignored when None and an
    error otherwise.
    """
    if name not in MODELS:
        raise InputError(source, name, f"unknown model; valid names: {', '.join(MODELS)}")
    accepted = MODEL_OPTIONS.get(name, ())
    given = {k: v for k, v in options.items() if v is not None}
    extra = sorted(set(given) - set(accepted))
    if extra:
        raise InputError(source, name, f"does not take option {extra[0]!r}")
    return MODELS[name](**given)
