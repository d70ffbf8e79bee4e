"""TensorRT exporter: the shared ONNX file -> TensorRT's ONNX parser -> serialized engine ``model.plan``
(Triton ``tensorrt_plan``), with one optimisation profile over batch 1..max for every input.

Runs only where ``import tensorrt`` works and a CUDA GPU is visible; everywhere else :func:`unavailable_reason` says
why and the export is recorded as skipped. Nothing is written in that case (never a placeholder plan).
Written against the TensorRT 10 Python API (named I/O tensors, ``execute_async_v3``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from serving_bench.export.frameworks import ExportOptions, Predictor, gpu_available, outputs_dict
from serving_bench.export.onnx_file import write_onnx
from serving_bench.models import ModelSpec

WORKSPACE_BYTES = 4 << 30


def unavailable_reason() -> str | None:
    try:
        import tensorrt  # noqa: F401
    except Exception as err:  # the PyPI stubs raise more than ImportError when they cannot download
        detail = (str(err).splitlines() or [""])[0]
        return f"the tensorrt Python package cannot be imported ({type(err).__name__}: {detail})"
    if not gpu_available():
        return "no CUDA GPU is visible to torch (TensorRT engines are built on and for a GPU)"
    return None


def write(module, spec: ModelSpec, version_dir: Path, opts: ExportOptions) -> dict:
    import tensorrt as trt  # optional: GPU hosts only

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):  # implicit in TensorRT 10
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    with tempfile.TemporaryDirectory(prefix="serving-bench-trt-") as tmp:
        onnx_path = write_onnx(module, spec, Path(tmp) / "model.onnx", opts.max_batch_size, opts.seed)
        if not parser.parse(onnx_path.read_bytes()):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"TensorRT could not parse the ONNX graph: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    if opts.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    optimum = max(1, opts.max_batch_size // 2)
    for t in spec.inputs:
        profile.set_shape(t.name, (1, *t.shape), (optimum, *t.shape), (opts.max_batch_size, *t.shape))
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise RuntimeError("TensorRT failed to build the engine (see the TensorRT log above)")
    (version_dir / "model.plan").write_bytes(bytes(engine))
    return {"tensorrt": trt.__version__, "profile_batch": [1, optimum, opts.max_batch_size]}


def load(version_dir: Path, input_names: list[str], output_names: list[str], *, device: str = "cuda:0",
         threads: int | None = None, **_settings) -> Predictor:
    import tensorrt as trt  # optional: GPU hosts only
    import torch  # heavy: ~1 s to import

    if not device.startswith("cuda"):
        device = "cuda:0"
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine((version_dir / "model.plan").read_bytes())
    context = engine.create_execution_context()
    stream = torch.cuda.Stream(device=device)

    def predict(inputs):
        keep = []
        for name in input_names:
            tensor = torch.from_numpy(inputs[name]).to(device).contiguous()
            keep.append(tensor)
            context.set_input_shape(name, tuple(tensor.shape))
            context.set_tensor_address(name, tensor.data_ptr())
        outs = {}
        for name in output_names:
            dtype = torch.from_numpy(np.empty(0, trt.nptype(engine.get_tensor_dtype(name)))).dtype
            outs[name] = torch.empty(tuple(context.get_tensor_shape(name)), dtype=dtype, device=device)
            context.set_tensor_address(name, outs[name].data_ptr())
        if not context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        stream.synchronize()
        return outputs_dict([outs[n].cpu().numpy() for n in output_names], output_names)

    return predict
