"""Parity: an exported artifact, run in its own runtime, must compute what the torch module computes.

The error of one output is ``max |artifact - torch| / max |torch|`` (relative to the output's largest magnitude, so it
is meaningful for logits and hidden states alike); the entry's error at a batch size is the largest over its outputs.
The reference is always the fp32 torch module with the same seed; an fp16 artifact gets the same inputs cast to fp16.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from serving_bench.models import ModelSpec

TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}


class ParityError(RuntimeError):
    """The artifact's outputs differ from torch's by more than the tolerance."""


def relative_error(actual: np.ndarray, reference: np.ndarray) -> float:
    actual = np.asarray(actual, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if actual.shape != reference.shape:
        return float("inf")
    if not np.all(np.isfinite(actual)):
        return float("inf")
    scale = max(float(np.max(np.abs(reference))) if reference.size else 0.0, np.finfo(np.float32).tiny)
    return float(np.max(np.abs(actual - reference))) / scale if reference.size else 0.0


def torch_outputs(module, spec: ModelSpec, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the torch module on numpy inputs; outputs named as in ``spec``."""
    import torch  # heavy: ~1 s to import

    with torch.inference_mode():
        out = module(*[torch.from_numpy(inputs[n]) for n in spec.input_names])
    values = out if isinstance(out, (list, tuple)) else [out]
    return {n: v.float().numpy() for n, v in zip(spec.output_names, values)}


def check_parity(predict, reference_module, spec: ModelSpec, batches: list[int], seed: int = 0) -> dict[int, float]:
    """Relative error per batch size; raises :class:`ParityError` above ``TOLERANCE[spec.precision]``.

    ``reference_module`` is the fp32 torch module; ``spec`` carries the artifact's precision.
    """
    tolerance = TOLERANCE[spec.precision]
    fp32 = spec.with_precision("fp32")
    errors: dict[int, float] = {}
    for batch in batches:
        inputs32 = fp32.make_inputs(batch, seed)
        reference = torch_outputs(reference_module, fp32, inputs32)
        inputs = {t.name: inputs32[t.name].astype(t.dtype) for t in spec.inputs}
        got = predict(inputs)
        errors[batch] = max(relative_error(got[n], reference[n]) for n in spec.output_names)
        if not errors[batch] <= tolerance:
            raise ParityError(f"batch {batch}: relative error {errors[batch]:.3g} above the {spec.precision} "
                              f"tolerance {tolerance:g}")
    return errors
