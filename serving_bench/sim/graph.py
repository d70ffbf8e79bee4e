"""The step graph of ensembles, read from a repository: step i needs step j when it reads a tensor j writes."""

from __future__ import annotations

from pathlib import Path

from serving_bench.export.repository import CONFIG_NAME, ensemble_deps, entry_dir, read_config


def ensemble_graphs(repo: str | Path, config) -> dict[str, tuple[tuple[int, ...], ...]]:
    """``{ensemble name: deps per step}`` for every ensemble of ``config`` (steps in config order)."""
    return {name: ensemble_deps(read_config(entry_dir(repo, name) / CONFIG_NAME))
            for name, _members in config.ensembles}
