"""MetaSchedule tuning for the TVM exporter, with records cached and reused.

Tuning needs static shapes, so a tuned entry holds, beside the dynamic ``main``, one static-batch copy of it per
*bucket* (``main_b1``, ``main_b2``, ``main_b4``, ... ``main_b<max>``: the powers of two up to the maximum batch, plus
the maximum), made with ``bind_symbolic_vars`` on the imported Relax function. Every convolution and matmul kernel of
the static copies is a tuning task; the budget of ``trials`` measurements is split evenly over them (round robin, at
least one each); the other kernels keep TVM's default lowering. At run time a batch goes to the smallest bucket that
holds it, padded with zeros; the padding rows are dropped from the outputs (six buckets instead of one function per
batch size keep tuning cost and library size bounded, at the price of at most 2x padded work). ``--tvm-buckets``
chooses other bucket sizes.

Records live in ``cache_dir()/tvm-tuning/<key>/`` (a MetaSchedule JSON database); the key covers the model, its
precision and tensor shapes, the buckets, the target with the core count the schedules were measured on, the trial
budget and the TVM version. A complete folder is reused without measuring anything; tuning writes to a temporary
folder renamed into place when done (a concurrent export that finished first keeps its records). Reuse is safe
even where the key misses a change (a zoo model's architecture edited under the same name): MetaSchedule applies a
record only to a kernel structurally equal to the one it was tuned on, so a stale record is unused, never wrong.

Search settings: ``replay-trace`` sampling of each task's design space with MetaSchedule's random cost model
(xgboost, which its learned model needs, is not installed), seeded, measured by local builder and runner processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from serving_bench.export.frameworks import ExportOptions
from serving_bench.files import cache_dir, publish_folder
from serving_bench.models import ModelSpec

DONE_MARKER = "complete.json"
# kernels worth measuring (fused names contain the anchor op); reshapes, means and adds stay with TVM's default lowering
HEAVY_KERNELS = ("conv2d", "matmul", "dense")


def buckets(max_batch_size: int) -> list[int]:
    """Powers of two below ``max_batch_size``, then ``max_batch_size``."""
    out, b = [], 1
    while b < max_batch_size:
        out.append(b)
        b *= 2
    return out + [max_batch_size]


def bucket_for(batch: int, available: list[int]) -> int:
    """The smallest bucket holding ``batch`` rows."""
    for b in sorted(available):
        if b >= batch:
            return b
    raise ValueError(f"batch {batch} is larger than the largest compiled batch {max(available)}")


def add_static_buckets(mod, sizes: list[int], batch_var: str = "batch"):
    """Return ``mod`` with ``main_b<N>`` = ``main`` with its batch axis bound to N, for every N in ``sizes``
    (TVM raises if ``main`` has no symbolic ``batch_var``)."""
    main = mod["main"]
    for n in sizes:
        mod[f"main_b{n}"] = main.bind_symbolic_vars({batch_var: n}).with_attr("global_symbol", f"main_b{n}")
    return mod


def cache_key(spec: ModelSpec, target: dict, sizes: list[int], trials: int) -> str:
    import tvm  # heavy: ~1 s to import

    payload = {"model": spec.name, "precision": spec.precision,
               "inputs": [(t.name, t.dtype, t.shape) for t in spec.inputs], "buckets": sizes, "target": target,
               "trials": trials, "tvm": tvm.__version__, "v": 2}
    return f"{spec.name}-{hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]}"


def _prepare(mod, target):
    """The fusion passes ``compile_relax`` runs before applying the database (so task keys match)."""
    import tvm  # heavy: ~1 s to import
    from tvm import relax  # heavy: ~1 s to import
    from tvm.relax import pipeline  # heavy: ~1 s to import

    try:
        dispatch = pipeline.library_dispatch_passes(target)
    except (ValueError, AttributeError):
        dispatch = []
    passes = [*dispatch, relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
              relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
    with target:
        return tvm.transform.Sequential(passes)(mod)


def _prim_func(task):
    mod = task.dispatched[0]
    return mod["main"] if hasattr(mod, "functions") else mod


def _is_static(prim_func) -> bool:
    from tvm import tirx  # heavy: ~1 s to import

    for param in prim_func.params:
        try:
            shape = param.shape
        except AttributeError:  # a scalar parameter (a symbolic size passed in)
            return False
        if not all(isinstance(d, tirx.IntImm) for d in shape):
            return False
    return True


def build_candidate(mod, target, _params):
    """MetaSchedule's default candidate build without its ``import tvm.s_tir.tensor_intrin``: that import takes
    40-60 s and the local builder pays it in fresh worker processes for every batch of candidates, so every trial
    timed out. Tensor intrinsics only matter for int8/tensor-core schedules, which fp32/fp16 on the CPU do not use."""
    from tvm.driver import build as tvm_build  # heavy: ~1 s to import
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # heavy: ~1 s to import

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


def tune(mod, spec: ModelSpec, target_dict: dict, opts: ExportOptions, log=None) -> tuple[object, dict]:
    """Tune the static buckets of ``mod`` (or reuse cached records); returns ``(executable, settings)``."""
    import tvm  # heavy: ~1 s to import
    from tvm.s_tir import meta_schedule as ms  # heavy: ~1 s to import

    sizes = sorted(set(opts.tvm_buckets) | {opts.max_batch_size}) if opts.tvm_buckets else buckets(opts.max_batch_size)
    mod = add_static_buckets(mod, sizes)
    tuned_for = {**target_dict, "num-cores": max(1, os.cpu_count() or 1)}  # schedules are measured on these cores
    target = tvm.target.Target(tuned_for)
    key = cache_key(spec, tuned_for, sizes, opts.tvm_tune_trials)
    folder = cache_dir() / "tvm-tuning" / key
    settings = {"buckets": sizes, "tuning_records": str(folder), "tune_trials": opts.tvm_tune_trials}
    if (folder / DONE_MARKER).is_file():
        settings.update(json.loads((folder / DONE_MARKER).read_text()), reused=True)
    else:
        folder.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{key}-"))
        try:
            start = time.perf_counter()
            tasks = [t for t in ms.relax_integration.extract_tasks(_prepare(mod, target), target)
                     if _is_static(_prim_func(t)) and any(k in t.task_name for k in HEAVY_KERNELS)]
            if not tasks:
                raise RuntimeError("MetaSchedule found no static convolution or matmul kernels to tune")
            per_task = max(1, opts.tvm_tune_trials // len(tasks))
            contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                tasks, str(work), space="post-order-apply", strategy="replay-trace", seed=opts.seed,
                num_threads=max(1, os.cpu_count() or 1))
            ms.tune.tune_tasks(tasks=contexts, task_weights=weights, work_dir=str(work),
                               max_trials_global=per_task * len(tasks), max_trials_per_task=per_task,
                               num_trials_per_iter=min(per_task, 16), task_scheduler="round-robin",
                               cost_model="random", database=ms.database.JSONDatabase(work_dir=str(work)),
                               builder=ms.builder.LocalBuilder(f_build=build_candidate, timeout_sec=120),
                               runner=ms.runner.LocalRunner(timeout_sec=60))
            info = {"tasks": len(tasks), "tune_s": round(time.perf_counter() - start, 1)}
            (work / DONE_MARKER).write_text(json.dumps(info))
            publish_folder(work, folder, replace=False)  # a concurrent export that finished first keeps its records
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        settings.update(info, reused=False)
    database = ms.database.JSONDatabase(work_dir=str(folder))
    executable = ms.relax_integration.compile_relax(database, mod, target, None)
    return executable, settings
