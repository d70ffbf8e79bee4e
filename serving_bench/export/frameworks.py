"""The exporter registry: framework name -> :class:`Framework` (a small frozen description).

Each framework's work lives in its own module (imported only when used, so ``--help`` stays fast) with three
functions:

- ``unavailable_reason() -> str | None``: why this framework cannot export on this machine (``None``: it can);
- ``write(module, spec, version_dir, opts) -> dict``: write the artifact into ``version_dir`` (the entry's ``1/``)
  and return the settings worth recording in the manifest;
- ``load(version_dir, input_names, output_names, *, device="cpu", threads=None, **settings) -> Predictor``: load the
  artifact back in its own runtime. The exporter's parity check and the python-backend runners both use it, so what
  is checked is what is served.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Mapping

import numpy as np

from serving_bench.errors import InputError

Predictor = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class ExportOptions:
    """How to export. ``max_batch_size`` >= 1 (the batch dimension is dynamic over 1..max); ``precision`` is
    ``fp32``, ``fp16`` or ``int8`` (ONNX Runtime's quantised graph); ``instances`` is the instance count written to
    ``instance_group``; ``seed`` draws the weights and the parity inputs; ``tvm_tune_trials`` > 0 turns on
    MetaSchedule tuning for TVM over the static batch ``tvm_buckets`` (default: powers of two up to the maximum; the
    maximum is always added); ``seq_len``: a transformer's token count (None: the zoo's default); ``sleep_base_ms``
    and ``sleep_per_item_ms``: the sleep model's time per batch and per row."""

    max_batch_size: int = 32
    precision: str = "fp32"
    instances: int = 1
    seed: int = 0
    tvm_tune_trials: int = 0
    tvm_buckets: tuple[int, ...] = ()
    seq_len: int | None = None
    sleep_base_ms: float = 5.0
    sleep_per_item_ms: float = 1.0


@dataclass(frozen=True)
class Framework:
    """One export target. Exactly one of ``platform`` (a native Triton platform) and ``backend`` is set;
    ``artifact`` is the file name inside the version folder; ``native_backend`` is the Triton backend that serves a
    native platform (a config may name it instead of the platform); ``gpu_capable`` says whether a GPU instance group
    is written when a GPU is present (TVM compiles for the host CPU, so its instances stay on the CPU)."""

    name: str
    platform: str
    backend: str
    artifact: str
    module: str
    native_backend: str = ""
    gpu_capable: bool = True

    def impl(self) -> ModuleType:
        return importlib.import_module(self.module)

    def unavailable_reason(self) -> str | None:
        return self.impl().unavailable_reason()

    def load(self, version_dir: str | Path, input_names, output_names, **kwargs) -> Predictor:
        return self.impl().load(Path(version_dir), list(input_names), list(output_names), **kwargs)


FRAMEWORKS: dict[str, Framework] = {
    "torchscript": Framework("torchscript", "pytorch_libtorch", "", "model.pt", "serving_bench.export.torchscript",
                             native_backend="pytorch"),
    "onnxruntime": Framework("onnxruntime", "onnxruntime_onnx", "", "model.onnx", "serving_bench.export.ort",
                             native_backend="onnxruntime"),
    "tvm": Framework("tvm", "", "python", "model.so", "serving_bench.export.tvm_export", gpu_capable=False),
    "tensorrt": Framework("tensorrt", "tensorrt_plan", "", "model.plan", "serving_bench.export.tensorrt",
                          native_backend="tensorrt"),
}
# The platform <-> artifact facts, all derived from the registry above (check-repo and the runners read them here).
# Triton platform -> framework, for reading a repository back (python-backend TVM entries say so in a parameter).
PLATFORM_TO_FRAMEWORK = {f.platform: f.name for f in FRAMEWORKS.values() if f.platform}
# native platform -> its artifact file in the version folder
PLATFORM_ARTIFACTS = {f.platform: f.artifact for f in FRAMEWORKS.values() if f.platform}
# Triton backend name -> the native platform it serves
NATIVE_BACKENDS = {f.native_backend: f.platform for f in FRAMEWORKS.values() if f.native_backend}
PYTHON_ARTIFACT = "model.py"  # a python-backend entry's model file


def native_platform(platform: str, backend: str) -> str | None:
    """The native platform a config uses (its ``platform``, or the platform its ``backend`` stands for), else None."""
    if platform in PLATFORM_TO_FRAMEWORK:
        return platform
    return NATIVE_BACKENDS.get(backend)


def get_framework(name: str, source: str = "--frameworks") -> Framework:
    """The framework called ``name``; unknown names raise :class:`InputError` listing the valid ones."""
    if name not in FRAMEWORKS:
        raise InputError(source, name, f"unknown framework; valid names: {', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[name]


def load_predictor(framework: str, version_dir: str | Path, input_names, output_names, **kwargs) -> Predictor:
    """Load an exported artifact in its own runtime: ``predictor({name: array}) -> {name: array}``.

    ``kwargs``: ``device`` (``"cpu"`` or ``"cuda:N"``), ``threads`` (intra-op threads; ``None`` leaves the runtime's
    default) and framework settings (``graph_optimization_level`` for ONNX Runtime).
    """
    return get_framework(framework, "framework").load(version_dir, input_names, output_names, **kwargs)


def gpu_available() -> bool:
    """Whether torch sees a CUDA GPU (decides ``KIND_GPU`` vs ``KIND_CPU``)."""
    import torch  # heavy: ~1 s to import

    return bool(torch.cuda.is_available())


def outputs_dict(values, output_names: list[str]) -> dict[str, np.ndarray]:
    """Name a runtime's outputs (one array or a sequence, in declaration order)."""
    if not isinstance(values, (list, tuple)):
        values = [values]
    if len(values) != len(output_names):
        raise RuntimeError(f"model returned {len(values)} outputs, config declares {len(output_names)}")
    return {name: np.asarray(v) for name, v in zip(output_names, values)}
