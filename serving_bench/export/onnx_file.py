"""Write a zoo model as one ONNX file with a dynamic batch axis (shared by the ONNX Runtime, TVM and TensorRT
exporters, so all three start from the same graph)."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

from serving_bench.models import ModelSpec

OPSET = 18


def write_onnx(module, spec: ModelSpec, path: Path, max_batch_size: int, seed: int = 0) -> Path:
    """Export ``module`` to ``path`` (single file, weights inside) with ``torch.onnx.export(dynamo=True)``.

    The batch axis of every input and output is the symbolic dimension ``batch`` (1..max); names are the spec's.
    """
    import torch  # heavy: ~1 s to import

    example_batch = 2  # a batch of 1 would be specialised away by torch.export
    inputs = tuple(torch.from_numpy(a) for a in spec.make_inputs(example_batch, seed).values())
    batch = torch.export.Dim("batch", min=1, max=max(2, max_batch_size))
    dynamic_shapes = {name: {0: batch} for name in spec.input_names}
    quiet = io.StringIO()
    previous = logging.getLogger("torch").level
    logging.getLogger("torch").setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(quiet), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, inputs, str(path), input_names=spec.input_names, output_names=spec.output_names,
                              dynamo=True, dynamic_shapes=dynamic_shapes, external_data=False, opset_version=OPSET,
                              verbose=False)
    finally:
        logging.getLogger("torch").setLevel(previous)
    return path
