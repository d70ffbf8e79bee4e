"""TVM exporter: ONNX -> Relax (``from_onnx``) -> ``tvm.compile`` for the host CPU -> ``model.so``.

Triton has no TVM backend, so the entry is ``backend: "python"`` with ``1/model.py`` = the runner
``serve/runners/tvm_model.py``, which loads ``model.so`` with :func:`load` (a ``relax.VirtualMachine``).

Dynamic batch: the batch axis stays symbolic through the ONNX import, so one compiled ``main`` serves every batch
size 1..max with no padding and one compile (one per batch size would multiply compile time by max_batch_size).

The target is the host's LLVM target in TVM's JSON-dict form (``{"kind": "llvm", "mcpu": ...}``, from
``Target.from_device(tvm.cpu())``); the library is built for this CPU and is recorded in the config's parameters.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from serving_bench.export.frameworks import ExportOptions, Predictor, outputs_dict
from serving_bench.export.onnx_file import write_onnx
from serving_bench.models import ModelSpec


def unavailable_reason() -> str | None:
    try:
        import tvm  # noqa: F401
        from tvm.relax.frontend.onnx import from_onnx  # noqa: F401
    except ImportError as err:
        return f"apache-tvm is not importable ({err})"
    return None


def host_target() -> dict:
    """The host CPU's LLVM target as TVM's JSON dict (kind, mtriple, mcpu)."""
    import tvm

    target = tvm.target.Target.from_device(tvm.cpu())
    fields = json.loads(str(target))
    return {k: v for k, v in fields.items() if v not in ("", [], None) and k not in ("keys", "tag")}


def import_onnx(module, spec: ModelSpec, max_batch_size: int, seed: int):
    """The model as a Relax IRModule with weights bound as constants and a symbolic batch axis."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    with tempfile.TemporaryDirectory(prefix="serving-bench-tvm-") as tmp:
        path = write_onnx(module, spec, Path(tmp) / "model.onnx", max_batch_size, seed)
        graph = onnx.load(str(path))
    return from_onnx(graph, keep_params_in_input=False)


def write(module, spec: ModelSpec, version_dir: Path, opts: ExportOptions) -> dict:
    import tvm

    mod = import_onnx(module, spec, opts.max_batch_size, opts.seed)
    target_dict = host_target()
    target = tvm.target.Target(target_dict)
    settings: dict = {"target": target_dict, "tvm": tvm.__version__, "tune_trials": opts.tvm_tune_trials}
    if opts.tvm_tune_trials > 0:
        from serving_bench.export.tvm_tune import tune

        mod, tune_settings = tune(mod, spec, target, opts)
        settings.update(tune_settings)
    executable = tvm.compile(mod, target=target)
    executable.export_library(str(version_dir / "model.so"))
    return settings


def load(version_dir: Path, input_names: list[str], output_names: list[str], *, device: str = "cpu",
         threads: int | None = None, **_settings) -> Predictor:
    import tvm
    from tvm import relax

    if threads:
        tvm.get_global_func("runtime.config_threadpool")(0, int(threads))
    dev = tvm.cpu()
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(version_dir / "model.so")), dev)
    main = vm["main"]

    def predict(inputs):
        out = main(*[tvm.runtime.tensor(inputs[n], dev) for n in input_names])
        values = [o.numpy() for o in out] if isinstance(out, (list, tuple)) or type(out).__name__ == "Array" \
            else out.numpy()
        return outputs_dict(values, output_names)

    return predict
