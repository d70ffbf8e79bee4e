"""The runtime view of a model repository: what the embedded (python-backend-only) tritonserver actually loads.

The exported repository stays native (``onnxruntime_onnx``, ``pytorch_libtorch``, ``tensorrt_plan``) for a full
Triton. The bundled server has only the python backend, so each native entry is served here by a python-backend
runner executing the same artifact with the same runtime; ``max_batch_size``, ``dynamic_batching``,
``instance_group`` and the I/O of the original config are kept. Entries that are already python-backend or ensembles
are linked as they are. Instance counts can be overridden per entry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from serving_bench.errors import InputError
from serving_bench.export.repository import (CONFIG_NAME, ModelConfig, entry_dir, list_entries, read_config,
                                             write_config)


def ensemble_members(config: ModelConfig) -> list[str]:
    """Model names an ensemble's steps call, in step order (empty for a non-ensemble)."""
    return [step.model_name for step in config.ensemble_scheduling.step]


def resolve_models(repo: Path, models: Sequence[str] | None) -> list[str]:
    """The entries to serve: ``models`` (all entries when None) plus, transitively, every ensemble member."""
    available = list_entries(repo)
    wanted = list(models) if models else list(available)
    resolved: list[str] = []
    while wanted:
        name = wanted.pop(0)
        if name in resolved:
            continue
        if name not in available:
            raise InputError(repo, name, f"no such model in the repository; available: {', '.join(available) or 'none'}")
        resolved.append(name)
        wanted += ensemble_members(read_config(entry_dir(repo, name) / CONFIG_NAME))
    return resolved


def build_runtime_repo(repo: str | Path, dest: str | Path, *, models: Sequence[str] | None = None,
                       instances: Mapping[str, int] | None = None,
                       threads_per_instance: int | None = None) -> list[str]:
    """Write the runtime view of ``repo`` into ``dest`` (a new folder); return the entry names it holds."""
    from serving_bench.serve.runners import runtime_entry

    repo, dest = Path(repo), Path(dest)
    instances = dict(instances or {})
    names = resolve_models(repo, models)
    unknown = sorted(set(instances) - set(names))
    if unknown:
        raise InputError("--instances", unknown[0], f"not a served model; served: {', '.join(names)}")
    dest.mkdir(parents=True)
    for name in names:
        src = entry_dir(repo, name)
        config = read_config(src / CONFIG_NAME)
        if name in instances:
            count = int(instances[name])
            if count < 1:
                raise InputError("--instances", name, f"instance count must be >= 1, got {count}")
            if not config.instance_group:
                config.instance_group.add()
            for group in config.instance_group:
                group.count = count
        out = dest / name
        out.mkdir()
        served_config = runtime_entry(src, config, out, threads_per_instance=threads_per_instance)
        write_config(served_config, out / CONFIG_NAME)
    return names


def link_tree(src: Path, dest: Path, skip: Sequence[str] = (CONFIG_NAME,)) -> None:
    """Symlink each item of ``src`` into ``dest`` (except ``skip``), so the view costs no copies."""
    for item in src.iterdir():
        if item.name not in skip:
            os.symlink(item.resolve(), dest / item.name)
