"""TVM exporter: ONNX -> Relax (``from_onnx``) -> ``tvm.compile`` for the host CPU -> ``model.so``.

Triton has no TVM backend, so the entry is ``backend: "python"`` with ``1/model.py`` = the runner
``serve/runners/tvm_model.py``, which loads ``model.so`` with :func:`load` (a ``relax.VirtualMachine``).

Dynamic batch: the batch axis stays symbolic through the ONNX import, so one compiled ``main`` serves every batch
size 1..max with no padding and one compile (one per batch size would multiply compile time by max_batch_size).
Tuning (``--tvm-tune-trials N``) needs static shapes: see ``tvm_tune`` for the static batch buckets it adds.

The target is the host's LLVM target in TVM's JSON-dict form (``{"kind": "llvm", "mcpu": ...}``, from
``Target.from_device(tvm.cpu())``); the library is built for this CPU and is recorded in the config's parameters.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from serving_bench.export.frameworks import ExportOptions, Predictor, outputs_dict
from serving_bench.export.onnx_file import write_onnx
from serving_bench.export.tvm_tune import bucket_for, tune
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
    import tvm  # heavy: ~1 s to import

    target = tvm.target.Target.from_device(tvm.cpu())
    fields = json.loads(str(target))
    return {k: v for k, v in fields.items() if v not in ("", [], None) and k not in ("keys", "tag")}


def import_onnx(module, spec: ModelSpec, max_batch_size: int, seed: int):
    """The model as a Relax IRModule with weights bound as constants and a symbolic batch axis."""
    import onnx  # heavy: ~0.5 s to import
    from tvm.relax.frontend.onnx import from_onnx  # heavy: ~1 s to import

    with tempfile.TemporaryDirectory(prefix="serving-bench-tvm-") as tmp:
        path = write_onnx(module, spec, Path(tmp) / "model.onnx", max_batch_size, seed)
        graph = onnx.load(str(path))
    return from_onnx(graph, keep_params_in_input=False)


def write(module, spec: ModelSpec, version_dir: Path, opts: ExportOptions) -> dict:
    """Compile (untuned: one dynamic-batch ``main``; tuned: plus static buckets, see ``tvm_tune``) and export.

    The returned settings' ``runtime`` dict is what :func:`load` needs besides the file (written to the config's
    parameters, so the runner gets it too)."""
    import tvm  # heavy: ~1 s to import

    mod = import_onnx(module, spec, opts.max_batch_size, opts.seed)
    target_dict = host_target()
    settings: dict = {"target": target_dict, "tvm": tvm.__version__, "tune_trials": opts.tvm_tune_trials,
                      "runtime": {}}
    start = time.perf_counter()
    if opts.tvm_tune_trials > 0:
        executable, tune_settings = tune(mod, spec, target_dict, opts)
        settings.update(tune_settings)
        settings["runtime"]["buckets"] = ",".join(map(str, tune_settings["buckets"]))
    else:
        executable = tvm.compile(mod, target=tvm.target.Target(target_dict))
    settings["compile_s"] = round(time.perf_counter() - start, 3)
    executable.export_library(str(version_dir / "model.so"))
    return settings


def set_threads(threads: int) -> None:
    """Size TVM's (process-wide) thread pool. ``config_threadpool`` alone is capped at TVM's default concurrency
    (``TVM_NUM_THREADS``, else half the logical cores on x86: one thread on a 2-vCPU host), so the variable is set
    first; raises if the pool did not take the size. Untuned kernels have no parallel loops: the count matters for
    tuned entries."""
    import tvm  # heavy: ~1 s to import

    os.environ["TVM_NUM_THREADS"] = str(threads)
    tvm.get_global_func("runtime.config_threadpool")(0, threads)
    running = int(tvm.get_global_func("runtime.NumThreads")())
    if running != threads:
        raise RuntimeError(f"TVM runs {running} threads after asking for {threads}")


def load(version_dir: Path, input_names: list[str], output_names: list[str], *, device: str = "cpu",
         threads: int | None = None, buckets: str | None = None, **_settings) -> Predictor:
    """A predictor over ``model.so``. With ``buckets`` (``"1,2,4,8"``, from a tuned export) a batch runs in the
    smallest static bucket that holds it, zero-padded, and the padding rows are dropped from the outputs."""
    import tvm  # heavy: ~1 s to import
    from tvm import relax  # heavy: ~1 s to import

    if threads:
        set_threads(int(threads))
    dev = tvm.cpu()
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(version_dir / "model.so")), dev)
    sizes = sorted(int(b) for b in str(buckets).split(",") if b.strip()) if buckets else []
    functions = {b: vm[f"main_b{b}"] for b in sizes}
    main = vm["main"]

    def run(function, arrays):
        out = function(*[tvm.runtime.tensor(a, dev) for a in arrays])
        if isinstance(out, (list, tuple)) or type(out).__name__ == "Array":
            return [o.numpy() for o in out]
        return [out.numpy()]

    def predict(inputs):
        arrays = [np.ascontiguousarray(inputs[n]) for n in input_names]
        rows = len(arrays[0])
        if not sizes:
            return outputs_dict(run(main, arrays), output_names)
        size = bucket_for(rows, sizes)
        if size != rows:
            arrays = [np.concatenate([a, np.zeros((size - rows, *a.shape[1:]), a.dtype)]) for a in arrays]
        return outputs_dict([o[:rows] for o in run(functions[size], arrays)], output_names)

    return predict
