"""Python-backend runners: the ``model.py`` files the embedded tritonserver runs for each kind of entry.

:func:`runtime_entry` turns one repository entry into its served form inside the runtime view.
"""

from __future__ import annotations

from pathlib import Path

from serving_bench.errors import InputError
from serving_bench.export.repository import ModelConfig

RUNNERS_DIR = Path(__file__).parent


def runtime_entry(src: Path, config: ModelConfig, out: Path, *, threads_per_instance: int | None = None) -> ModelConfig:
    """Fill ``out`` with the served form of entry ``src`` and return the config to serve it with.

    Python-backend entries and ensembles are linked unchanged. Native platforms get a runner (see the per-platform
    modules); a platform without a runner is an error naming the entry.
    """
    from serving_bench.serve.runtime_view import link_tree

    if config.backend == "python" or config.platform == "ensemble":
        link_tree(src, out)
        return config
    raise InputError(src / "config.pbtxt", "platform",
                     f"{config.platform or config.backend!r} has no python-backend runner in the embedded server")
