"""ONNX Runtime exporter: single-file ``model.onnx`` with a dynamic batch axis (Triton ``onnxruntime_onnx``).

:func:`load` takes the variant's session settings (``serving_bench.export.variants``): intra- and inter-op threads,
graph optimisation level, execution mode. The int8 variant's graph is written by :mod:`.quantize`."""

from __future__ import annotations

import tempfile
from pathlib import Path

from serving_bench.export.frameworks import ExportOptions, Predictor, outputs_dict
from serving_bench.export.onnx_file import OPSET, write_onnx
from serving_bench.export.quantize import quantize_int8
from serving_bench.models import ModelSpec

# graph optimisation level name -> onnxruntime.GraphOptimizationLevel attribute
GRAPH_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                "all": "ORT_ENABLE_ALL"}


def unavailable_reason() -> str | None:
    try:
        import onnxruntime  # noqa: F401
    except ImportError as err:
        return f"onnxruntime is not importable ({err})"
    return None


def write(module, spec: ModelSpec, version_dir: Path, opts: ExportOptions) -> dict:
    """``model.onnx``; for ``precision`` int8, the fp32 graph quantised by :func:`quantize.quantize_int8`."""
    import onnxruntime  # heavy: ~0.3 s to import

    settings = {"opset": OPSET, "onnxruntime": onnxruntime.__version__}
    if opts.precision != "int8":
        write_onnx(module, spec, version_dir / "model.onnx", opts.max_batch_size, opts.seed)
        return settings
    with tempfile.TemporaryDirectory(prefix="serving-bench-int8-") as tmp:
        fp32 = write_onnx(module, spec, Path(tmp) / "model.onnx", opts.max_batch_size, opts.seed)
        settings["quantization"] = quantize_int8(fp32, version_dir / "model.onnx")
    return settings


def session_options(threads: int | None = None, inter_threads: int | None = None, graph_optimization_level: str = "all",
                    execution_mode: str = "seq"):
    """``onnxruntime.SessionOptions`` for these settings (None threads: ORT's default, all cores)."""
    import onnxruntime as ort  # heavy: ~0.3 s to import

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = int(threads)
    if inter_threads:
        options.inter_op_num_threads = int(inter_threads)
    elif threads:
        options.inter_op_num_threads = 1
    # The session's threads must not spin between runs: on a shared host (the cores of co-located models, the server's
    # and the client's threads) a spinning pool took both cores of the 2-core VM at 30 req/s
    # (2026-12-02, docs/notes/sim-history.md#benchmarks)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, GRAPH_LEVELS[graph_optimization_level])
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if execution_mode == "par" else \
        ort.ExecutionMode.ORT_SEQUENTIAL
    return options


SESSION_SETTINGS = ("threads", "inter_threads", "graph_optimization_level", "execution_mode")  # session_options'


def load(version_dir: Path, input_names: list[str], output_names: list[str], *, device: str = "cpu",
         **settings) -> Predictor:
    """The ONNX Runtime session of ``version_dir/model.onnx``; ``settings``: :func:`session_options`' keywords (other
    frameworks' settings are ignored)."""
    import onnxruntime as ort  # heavy: ~0.3 s to import

    options = session_options(**{k: v for k, v in settings.items() if k in SESSION_SETTINGS})
    providers = ["CPUExecutionProvider"]
    if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(device.partition(":")[2] or 0)}))
    session = ort.InferenceSession(str(version_dir / "model.onnx"), options, providers=providers)

    def predict(inputs):
        return outputs_dict(session.run(output_names, {n: inputs[n] for n in input_names}), output_names)

    predict.session = session  # what the settings made of it, for a caller that checks them
    return predict
