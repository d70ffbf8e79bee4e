"""Python-backend runners: the ``model.py`` files the embedded tritonserver runs for each kind of entry.

:func:`runtime_entry` turns one repository entry into its served form inside the runtime view:

- python-backend entries (the sleep model, TVM, ensemble combiners) and ensembles are linked unchanged, except that a
  runner an artifact would shadow on import (TVM's ``model.so`` beside ``model.py``) is linked under another name;
- native entries (``onnxruntime_onnx``, ``pytorch_libtorch``, ``tensorrt_plan``) become python-backend entries whose
  version folders hold a link to the same artifact and ``native_model.py`` as ``model.py``; ``max_batch_size``,
  ``dynamic_batching``, ``instance_group`` and I/O are kept, and parameters record ``original_platform`` and
  ``framework``.

Every runner-backed entry gets the parameter ``threads_per_instance`` (intra-op threads of each instance, for entries
whose variant states none: see :mod:`serving_bench.export.variants`; the runners read the entry's own settings from
the config fields Triton's native backends read), optionally ``execution_log`` (the folder its instances log executed batches to, :mod:`serving_bench.serve.execution_log`), and
a link to the ``serving_bench`` package (:func:`link_package`).
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
from pathlib import Path
from typing import Sequence

from tritonclient.grpc import model_config_pb2 as mc

from serving_bench.errors import InputError
from serving_bench.export.frameworks import PLATFORM_ARTIFACTS, PLATFORM_TO_FRAMEWORK, get_framework
from serving_bench.export.frameworks import native_platform as _native_platform
from serving_bench.export.repository import CONFIG_NAME, ModelConfig
from serving_bench.serve.execution_log import PARAMETER as EXECUTION_LOG

RUNNERS_DIR = Path(__file__).parent
PACKAGE_DIR = RUNNERS_DIR.parents[1]  # serving_bench/
SAFE_RUNNER_NAME = "serving_bench_runner.py"  # runner file name no artifact can shadow
NATIVE_RUNNER = RUNNERS_DIR / "native_model.py"


def native_platform(config: ModelConfig) -> str | None:
    """The native platform an entry uses (``platform`` or the platform its ``backend`` stands for), else None."""
    return _native_platform(config.platform, config.backend)


def check_servable(src: Path, config: ModelConfig) -> None:
    """Raise :class:`InputError` (one line naming the config field) if the embedded server cannot run entry ``src``:
    a platform without a runner, a ``tensorrt_plan`` entry where TensorRT or a GPU is missing, or KIND_GPU instances
    where torch sees no GPU. Ensembles and python-backend entries pass (their members / runners are checked on their
    own)."""
    source = Path(src) / CONFIG_NAME
    if config.platform == "ensemble":
        return
    if config.backend != "python":
        platform = native_platform(config)
        if platform is None:
            raise InputError(source, "platform" if config.platform else "backend",
                             f"{config.platform or config.backend or 'none'!r} has no python-backend runner in the "
                             f"embedded server; expected one of {', '.join(PLATFORM_TO_FRAMEWORK)}, ensemble, or backend "
                             f"python")
        if platform == "tensorrt_plan":
            reason = get_framework("tensorrt").impl().unavailable_reason()
            if reason:
                raise InputError(source, "platform", f"tensorrt_plan cannot be served here: {reason}")
    for i, group in enumerate(config.instance_group):
        if group.kind == mc.ModelInstanceGroup.KIND_GPU:
            import torch  # heavy (~1 s): only for an entry that asks for a GPU

            if not torch.cuda.is_available():
                raise InputError(source, f"instance_group[{i}].kind",
                                 "KIND_GPU but torch sees no CUDA GPU here; expected KIND_CPU on this machine "
                                 "(re-export here, or serve it on a GPU host)")


def runtime_entry(src: Path, config: ModelConfig, out: Path, *, threads_per_instance: int | None = None,
                  cuda_graphs: str | None = None, execution_log: str | Path | None = None) -> ModelConfig:
    """Fill ``out`` (an empty folder) with the served form of entry ``src``; return the config to serve it with.

    ``threads_per_instance`` is written into every runner-backed entry (``None``: keep what the config says, else
    1). ``cuda_graphs`` (``all`` or batch sizes ``1,2,4``) turns on CUDA graphs for TorchScript entries on KIND_GPU
    instances. ``execution_log``: the folder runner instances log their executed batches to (None: no log). Raises :class:`InputError` (one line naming the config field) for a platform that has no runner, a
    TensorRT entry where TensorRT or a GPU is missing (:func:`check_servable`), or a missing artifact.
    """
    src, out = Path(src), Path(out)
    served = ModelConfig()
    served.CopyFrom(config)
    if config.platform == "ensemble":
        link_tree(src, out)
        return served
    if config.backend == "python":
        runner = config.default_model_filename or "model.py"
        if any(_shadowed_versions(src, runner)):
            _link_with_renamed_runner(src, out, runner)
            served.default_model_filename = SAFE_RUNNER_NAME
        else:
            link_tree(src, out)
        link_package(out)
        _set_runner_parameters(served, threads_per_instance, execution_log)
        return served
    check_servable(src, config)
    platform = native_platform(config)
    framework = PLATFORM_TO_FRAMEWORK[platform]
    artifact = config.default_model_filename or PLATFORM_ARTIFACTS[platform]
    versions = sorted((p for p in src.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not versions:
        raise InputError(src, "version folder", "missing: expected a numeric version folder such as 1/")
    for version in versions:
        if not (version / artifact).is_file():
            raise InputError(version / artifact, None, f"missing: the {platform} entry needs its artifact {artifact}")
        target = out / version.name
        target.mkdir()
        for item in version.iterdir():
            if item.name != "model.py":
                os.symlink(item.resolve(), target / (PLATFORM_ARTIFACTS[platform] if item.name == artifact else item.name))
        shutil.copy2(NATIVE_RUNNER, target / "model.py")
    for name in os.listdir(src):  # anything beside the versions (labels files, ...) is linked too
        if name != CONFIG_NAME and not (src / name).is_dir() and not (out / name).exists():
            os.symlink((src / name).resolve(), out / name)
    link_package(out)
    served.ClearField("platform")
    served.backend = "python"
    served.ClearField("default_model_filename")
    served.parameters["original_platform"].string_value = platform
    served.parameters["framework"].string_value = framework
    served.parameters["artifact"].string_value = PLATFORM_ARTIFACTS[platform]
    if cuda_graphs and framework == "torchscript":
        served.parameters["cuda_graphs"].string_value = cuda_graphs
    _set_runner_parameters(served, threads_per_instance, execution_log)
    return served


def link_package(out: Path) -> None:
    """Link this ``serving_bench`` package into the entry folder ``out``: the python backend puts the entry folder on
    the stub's ``sys.path`` but starts its Python ignoring ``PYTHONPATH``, so a runner's ``from serving_bench...``
    would otherwise work only where the package is installed in the stub's site-packages."""
    if not (out / PACKAGE_DIR.name).exists():
        os.symlink(PACKAGE_DIR, out / PACKAGE_DIR.name)


def _shadowed_versions(src: Path, runner: str):
    """Version folders where ``import <runner stem>`` (how the python backend stub loads the runner) would find
    something other than the runner: an extension module such as TVM's ``model.so`` comes first in Python's import
    order, and the stub then fails with an ``undefined symbol`` ImportError."""
    stem = Path(runner).stem
    shadows = {stem + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES} | {stem}
    for version in src.iterdir():
        if version.is_dir() and version.name.isdigit() and any((version / name).exists() for name in shadows):
            yield version


def _link_with_renamed_runner(src: Path, out: Path, runner: str) -> None:
    """Like ``link_tree`` but with real version folders whose runner is linked as :data:`SAFE_RUNNER_NAME`."""
    for item in src.iterdir():
        if item.name == CONFIG_NAME:
            continue
        if item.is_dir() and item.name.isdigit():
            (out / item.name).mkdir()
            for inner in item.iterdir():
                os.symlink(inner.resolve(), out / item.name / (SAFE_RUNNER_NAME if inner.name == runner else inner.name))
        else:
            os.symlink(item.resolve(), out / item.name)


def _set_runner_parameters(config: ModelConfig, threads: int | None, execution_log: str | Path | None) -> None:
    if execution_log is not None:
        config.parameters[EXECUTION_LOG].string_value = str(execution_log)
    if threads is not None:
        config.parameters["threads_per_instance"].string_value = str(int(threads))
    elif not config.parameters["threads_per_instance"].string_value:
        config.parameters["threads_per_instance"].string_value = "1"


def link_tree(src: Path, dest: Path, skip: Sequence[str] = (CONFIG_NAME,)) -> None:
    """Symlink each item of ``src`` into ``dest`` (except ``skip``), so the view costs no copies."""
    for item in src.iterdir():
        if item.name not in skip:
            os.symlink(item.resolve(), dest / item.name)
