"""What a zoo model declares: its tensors (names, dtypes, shapes without batch), how to build it, how to sample inputs.

A :class:`ModelSpec` is a small frozen description; building the torch module and making inputs are explicit calls
that take a seed, so the same seed always gives the same weights and the same inputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

PRECISIONS = ("fp32", "fp16")
_FLOAT_FOR_PRECISION = {"fp32": "float32", "fp16": "float16"}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: ``shape`` excludes the batch dimension; ``dtype`` is a numpy dtype name.

    ``low``/``high`` bound the values of sampled integer inputs (``high`` exclusive).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    low: int = 0
    high: int = 2

    @property
    def is_float(self) -> bool:
        return np.dtype(self.dtype).kind == "f"


# build() -> torch module; sample(batch, rng) -> {input name: array with batch first}
Builder = Callable[[], "object"]
Sampler = Callable[[int, np.random.Generator, "ModelSpec"], dict]


def default_sampler(batch: int, rng: np.random.Generator, spec: "ModelSpec") -> dict[str, np.ndarray]:
    """Standard-normal floats and uniform integers in ``[low, high)`` for every input."""
    out = {}
    for t in spec.inputs:
        if t.is_float:
            out[t.name] = rng.standard_normal((batch, *t.shape)).astype(t.dtype)
        else:
            out[t.name] = rng.integers(t.low, t.high, size=(batch, *t.shape)).astype(t.dtype)
    return out


@dataclass(frozen=True)
class ModelSpec:
    """A zoo model.

    ``build`` makes the torch module (``None`` for models that only exist as a python-backend runner, like
    ``sleep``); ``frameworks`` limits the frameworks it exports to (``None``: all); ``precision`` is the float
    precision the tensors and weights use (``fp32`` unless :meth:`with_precision` changed it).
    """

    name: str
    description: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    build: Builder | None = None
    sample: Sampler = default_sampler
    frameworks: tuple[str, ...] | None = None
    precision: str = "fp32"

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def with_precision(self, precision: str) -> "ModelSpec":
        """The same model with float tensors in ``precision`` (``fp32`` or ``fp16``)."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        dtype = _FLOAT_FOR_PRECISION[precision]

        def retype(tensors: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
            return tuple(dataclasses.replace(t, dtype=dtype) if t.is_float else t for t in tensors)

        return dataclasses.replace(self, inputs=retype(self.inputs), outputs=retype(self.outputs), precision=precision)

    def create(self, seed: int = 0):
        """The torch module in eval mode with weights drawn from ``seed`` (the global RNG is left as it was)."""
        import torch  # heavy: ~1 s to import

        if self.build is None:
            raise ValueError(f"model {self.name!r} has no torch module (it is a python-backend runner)")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = self.build()
        module.eval()
        if self.precision == "fp16":
            module.half()
        for p in module.parameters():
            p.requires_grad_(False)
        return module

    def make_inputs(self, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded sample inputs: input name -> array of shape ``(batch, *shape)`` in the declared dtype."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        arrays = self.sample(batch, np.random.default_rng(seed), self)
        return {t.name: np.ascontiguousarray(arrays[t.name], dtype=t.dtype) for t in self.inputs}
