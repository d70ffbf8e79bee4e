"""The step graph of ensembles, read from a repository: step i needs step j when it reads a tensor j writes."""

from __future__ import annotations

from pathlib import Path

from serving_bench.export.repository import CONFIG_NAME, entry_dir, read_config


def ensemble_graphs(repo: str | Path, config) -> dict[str, tuple[tuple[int, ...], ...]]:
    """``{ensemble name: deps per step}`` for every ensemble of ``config`` (steps in config order)."""
    graphs = {}
    for name, _members in config.ensembles:
        steps = read_config(entry_dir(repo, name) / CONFIG_NAME).ensemble_scheduling.step
        writers = {}
        for j, step in enumerate(steps):
            for tensor in step.output_map.values():
                writers[tensor] = j
        graphs[name] = tuple(tuple(sorted({writers[t] for t in step.input_map.values() if t in writers} - {i}))
                             for i, step in enumerate(steps))
    return graphs
