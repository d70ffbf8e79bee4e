"""int8 for ONNX Runtime on the CPU: dynamic quantisation, and the accuracy gate an int8 variant must pass.

Quantisation: ``onnxruntime.quantization.quantize_dynamic`` on the fp32 graph: weights of the operators it supports
(MatMul, Gemm, Conv, ...) stored as int8 with one scale per tensor; activations quantised to uint8 at run time from
each batch's own range; inputs and outputs stay fp32.

The gate (:func:`int8_gate`): the quantised artifact and the fp32 torch module run on the zoo's seeded inputs
(:data:`GATE_ROWS` rows from the export's seed, in batches of at most ``max_batch_size``). It passes when, for every
output,

- the **range error** ``max |int8 - fp32| / (max fp32 - min fp32)`` is at most :data:`RANGE_TOLERANCE`, and
- for a classifier output (``[batch, classes]``) the **top-1 agreement** (share of rows whose arg-max class is the
  same) is at least :data:`TOP1_MINIMUM`.

Measured on the zoo (seed 0, 32 rows, 2026-12): range error 0.003-0.005 (tiny_cnn, tiny_mlp), 0.015 (resnet50),
0.016 (bert_base at 32 tokens), 0.022 (mobilenet_v3_large); top-1 agreement 1.0. The thresholds leave twice that
room; a quantisation whose scales are wrong lands far outside (tests/test_variants.py).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from serving_bench.export.parity import torch_outputs
from serving_bench.models import ModelSpec

GATE_ROWS = 32
RANGE_TOLERANCE = 0.05
TOP1_MINIMUM = 0.9
METRIC = "max |int8 - fp32| / (max fp32 - min fp32); top-1 agreement for [batch, classes] outputs"


@dataclass(frozen=True)
class GateResult:
    """The gate's figures: the worst ``range_error`` over outputs, the lowest ``top1_agreement`` over classifier
    outputs (None: no classifier output), the thresholds, the rows compared, and whether it ``passed``."""

    range_error: float
    top1_agreement: float | None
    rows: int
    passed: bool
    range_tolerance: float = RANGE_TOLERANCE
    top1_minimum: float = TOP1_MINIMUM
    metric: str = METRIC

    def reason(self) -> str:
        """One line saying why the gate failed (empty when it passed)."""
        parts = []
        if not self.range_error <= self.range_tolerance:
            parts.append(f"range error {self.range_error:.3g} above {self.range_tolerance:g}")
        if self.top1_agreement is not None and self.top1_agreement < self.top1_minimum:
            parts.append(f"top-1 agreement {self.top1_agreement:.2f} below {self.top1_minimum:g}")
        return "int8 accuracy gate failed: " + "; ".join(parts) if parts else ""

    def record(self) -> dict:
        return asdict(self)


class GateRejected(RuntimeError):
    """An int8 artifact failed :func:`int8_gate`: it is reported and never served."""

    def __init__(self, result: GateResult):
        super().__init__(result.reason())
        self.result = result


def quantize_int8(fp32_path: Path, int8_path: Path) -> dict:
    """Write the dynamically quantised ``fp32_path`` to ``int8_path``; returns the settings for the manifest."""
    from onnxruntime.quantization import QuantType, quantize_dynamic  # heavy: ~0.5 s to import

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # it logs a suggestion to pre-process the graph, as a warning, on every call
    try:
        quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=False)
    finally:
        root.setLevel(level)
    return {"method": "onnxruntime.quantization.quantize_dynamic", "weights": "int8, one scale per tensor",
            "activations": "uint8, scaled per batch at run time"}


def int8_gate(predict, reference_module, spec: ModelSpec, max_batch_size: int, seed: int = 0,
              rows: int = GATE_ROWS) -> GateResult:
    """Compare the int8 ``predict`` with the fp32 torch ``reference_module`` on ``rows`` seeded rows."""
    inputs = spec.make_inputs(rows, seed)
    got: dict[str, list[np.ndarray]] = {n: [] for n in spec.output_names}
    want: dict[str, list[np.ndarray]] = {n: [] for n in spec.output_names}
    for start in range(0, rows, max(1, max_batch_size)):
        chunk = {n: a[start:start + max_batch_size] for n, a in inputs.items()}
        for name, value in predict(chunk).items():
            got[name].append(np.asarray(value, dtype=np.float64))
        for name, value in torch_outputs(reference_module, spec, chunk).items():
            want[name].append(np.asarray(value, dtype=np.float64))
    range_errors, agreements = [], []
    for name in spec.output_names:
        q, f = np.concatenate(got[name]), np.concatenate(want[name])
        if q.shape != f.shape or not np.all(np.isfinite(q)):
            range_errors.append(float("inf"))
            continue
        span = max(float(f.max() - f.min()), float(np.finfo(np.float32).tiny))
        range_errors.append(float(np.max(np.abs(q - f))) / span)
        if f.ndim == 2 and f.shape[1] > 1:
            agreements.append(float(np.mean(q.argmax(axis=1) == f.argmax(axis=1))))
    range_error = max(range_errors) if range_errors else float("inf")
    top1 = min(agreements) if agreements else None
    passed = range_error <= RANGE_TOLERANCE and (top1 is None or top1 >= TOP1_MINIMUM)
    return GateResult(range_error=range_error, top1_agreement=top1, rows=rows, passed=passed)
