"""The runtime view of a model repository: what the embedded (python-backend-only) tritonserver actually loads.

The exported repository stays native (``onnxruntime_onnx``, ``pytorch_libtorch``, ``tensorrt_plan``) for a full
Triton. The bundled server has only the python backend, so each native entry is served here by a python-backend
runner executing the same artifact with the same runtime; ``max_batch_size``, ``dynamic_batching``,
``instance_group`` and the I/O of the original config are kept (see :mod:`serving_bench.serve.runners`). Entries that
are already python-backend or ensembles are linked as they are. Instance counts can be overridden per entry, and
intra-op threads per instance default to what fits the cores.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from serving_bench.errors import InputError, require_count
from serving_bench.export.check import check_repo
from serving_bench.export.repository import (CONFIG_NAME, MANIFEST_NAME, entry_dir, read_config,
                                             resolve_models, write_config)
from serving_bench.serve.runners import check_servable, runtime_entry
from serving_bench.serving_config import default_threads, model_serving_from_config


def check_served_entries(repo: Path, names: Sequence[str]) -> None:
    """Raise the first problem ``serving-bench check-repo`` finds in a served entry (one line naming file and field),
    so a malformed config or a missing artifact is reported before launch, not as a load failure in the server log."""
    problems, _ = check_repo(repo)
    root = Path(repo).resolve()
    served = [str(entry_dir(root, name)) for name in names]

    def concerns_served(problem: InputError) -> bool:
        source = str(Path(problem.source).resolve()) if problem.source else ""
        return any(source == folder or source.startswith(folder + os.sep) for folder in served) or \
            (source == str(root / MANIFEST_NAME) and any(f"entries.{n}" == problem.field for n in names))

    mine = [p for p in problems if concerns_served(p)]
    if mine:
        first = mine[0]
        more = f" ({len(mine) - 1} more: run serving-bench check-repo {repo})" if len(mine) > 1 else ""
        raise InputError(first.source, first.field, first.expected + more)


def build_runtime_repo(repo: str | Path, dest: str | Path, *, models: Sequence[str] | None = None,
                       instances: Mapping[str, int] | None = None, threads_per_instance: int | None = None,
                       cuda_graphs: str | None = None, validate: bool = True,
                       execution_log: str | Path | None = None) -> list[str]:
    """Write the runtime view of ``repo`` into ``dest`` (a new folder); return the entry names it holds.

    ``threads_per_instance`` (None: cores // all served instances, at least 1) goes to every runner-backed entry;
    ``cuda_graphs`` to TorchScript entries on KIND_GPU instances; ``execution_log`` (a folder) to every runner-backed
    entry. With ``validate`` the served entries are checked
    first (:func:`check_served_entries`). Bad input raises :class:`InputError` before ``dest`` is created.
    """
    repo, dest = Path(repo), Path(dest)
    instances = dict(instances or {})
    names = resolve_models(repo, models)
    unknown = sorted(set(instances) - set(names))
    if unknown:
        raise InputError("--instances", unknown[0], f"not a served model; served: {', '.join(names)}")
    configs = {name: read_config(entry_dir(repo, name) / CONFIG_NAME) for name in names}
    for name, config in configs.items():
        check_servable(entry_dir(repo, name), config)
    if validate:
        check_served_entries(repo, names)
    for name, config in configs.items():
        if name in instances:
            count = int(instances[name])
            if count < 1:
                raise InputError("--instances", name, f"instance count must be >= 1, got {count}")
            if config.platform == "ensemble":
                raise InputError("--instances", name, "an ensemble has no instances of its own; set its members'")
            if not config.instance_group:
                config.instance_group.add()
            for group in config.instance_group:
                group.count = count
    require_count("--threads-per-instance", threads_per_instance)
    if threads_per_instance is None:
        total = sum(model_serving_from_config(c, name).instance_count for name, c in configs.items()
                    if c.platform != "ensemble")
        threads_per_instance = default_threads(total)
    dest.mkdir(parents=True)
    for name, config in configs.items():
        out = dest / name
        out.mkdir()
        served_config = runtime_entry(entry_dir(repo, name), config, out, threads_per_instance=threads_per_instance,
                                      cuda_graphs=cuda_graphs, execution_log=execution_log)
        write_config(served_config, out / CONFIG_NAME)
    return names
