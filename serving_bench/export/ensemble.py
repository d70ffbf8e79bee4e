"""Ensembles (deep ensembles): one ``platform: "ensemble"`` entry that sends its input to every member and a
python-backend combiner ``<name>_combiner`` that averages the members' outputs.

Members are repository entries of any framework, so one ensemble can mix frameworks. They must agree on input and
output names, dtypes and dims and all batch (``max_batch_size`` > 0); the ensemble's ``max_batch_size`` is the
members' smallest. Tensor names inside the ensemble: member ``m``'s output ``o`` is ``m.o``; the combiner's inputs are
``o__0``, ``o__1``, ... (one per member) and its outputs are the members' output names.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from serving_bench.errors import InputError
from serving_bench.export.repository import (CONFIG_NAME, TRITON_TO_NUMPY, ModelConfig, check_entry_name, staged_entry,
                                             write_config)

COMBINER_RUNNER = Path(__file__).resolve().parents[1] / "serve" / "runners" / "ensemble_combiner.py"
ENSEMBLE_FRAMEWORK = "ensemble"


@dataclass(frozen=True)
class EnsembleSpec:
    """``--ensemble NAME=entryA,entryB``: the ensemble's entry name and its members (entry names, in order)."""

    name: str
    members: tuple[str, ...]

    @property
    def combiner(self) -> str:
        return f"{self.name}_combiner"

    @classmethod
    def parse(cls, text: str, source: str = "--ensemble") -> "EnsembleSpec":
        name, sep, rest = text.partition("=")
        members = tuple(m.strip() for m in rest.split(",") if m.strip())
        if not sep or not name.strip():
            raise InputError(source, text, "expected NAME=entryA,entryB (repository entry names)")
        name = check_entry_name(name.strip(), source, "NAME")
        check_entry_name(f"{name}_combiner", source, "NAME")
        for m in members:
            check_entry_name(m, source, name)
        if len(members) < 2 or len(set(members)) != len(members):
            raise InputError(source, name, f"expected at least two distinct member entries, got {', '.join(members)}")
        return cls(name, members)


def _io_signature(config: ModelConfig, which: str) -> list[tuple[str, int, tuple[int, ...]]]:
    return [(t.name, t.data_type, tuple(t.dims)) for t in getattr(config, which)]


def _describe(signature) -> str:
    return ", ".join(f"{n} {TRITON_TO_NUMPY.get(d, d)}{list(dims)}" for n, d, dims in signature) or "none"


def check_members(spec: EnsembleSpec, configs: dict[str, ModelConfig], source: str = "--ensemble") -> None:
    """Raise :class:`InputError` unless every member batches and shares the first member's inputs and outputs."""
    first = spec.members[0]
    for member in spec.members:
        config = configs[member]
        if config.max_batch_size < 1:
            raise InputError(source, f"{spec.name}.{member}", "members must batch (max_batch_size >= 1)")
        for which in ("input", "output"):
            ours, theirs = _io_signature(config, which), _io_signature(configs[first], which)
            if ours != theirs:
                raise InputError(source, f"{spec.name}.{member}",
                                 f"{which}s {_describe(ours)} differ from {first}'s {_describe(theirs)}; "
                                 f"ensemble members must share input and output names, dtypes and shapes")


def ensemble_configs(spec: EnsembleSpec, configs: dict[str, ModelConfig], *, instances: int = 1
                     ) -> tuple[ModelConfig, ModelConfig]:
    """The ensemble's config and its combiner's config, from the members' configs (checked first)."""
    check_members(spec, configs)
    first = configs[spec.members[0]]
    max_batch = min(configs[m].max_batch_size for m in spec.members)

    combiner = ModelConfig(name=spec.combiner, backend="python", max_batch_size=max_batch)
    for out in first.output:
        for i in range(len(spec.members)):
            combiner.input.add(name=f"{out.name}__{i}", data_type=out.data_type, dims=list(out.dims))
    combiner.output.extend(first.output)
    combiner.dynamic_batching.SetInParent()
    combiner.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)
    combiner.parameters["members"].string_value = str(len(spec.members))

    ensemble = ModelConfig(name=spec.name, platform="ensemble", max_batch_size=max_batch)
    ensemble.input.extend(first.input)
    ensemble.output.extend(first.output)
    combine = mc.ModelEnsembling.Step(model_name=spec.combiner, model_version=-1)
    for i, member in enumerate(spec.members):
        step = ensemble.ensemble_scheduling.step.add(model_name=member, model_version=-1)
        for t in first.input:
            step.input_map[t.name] = t.name
        for t in first.output:
            step.output_map[t.name] = f"{member}.{t.name}"
            combine.input_map[f"{t.name}__{i}"] = f"{member}.{t.name}"
    for t in first.output:
        combine.output_map[t.name] = t.name
    ensemble.ensemble_scheduling.step.append(combine)
    return ensemble, combiner


def write_ensemble(repo: str | Path, spec: EnsembleSpec, configs: dict[str, ModelConfig], *, instances: int = 1,
                   overwrite: bool = False) -> tuple[Path, Path]:
    """Write the combiner entry (config + ``1/model.py``) and the ensemble entry (config + empty ``1/``)."""
    ensemble, combiner = ensemble_configs(spec, configs, instances=instances)
    with staged_entry(repo, spec.combiner, overwrite=overwrite) as staging:
        write_config(combiner, staging / CONFIG_NAME)
        (staging / "1").mkdir()
        shutil.copy2(COMBINER_RUNNER, staging / "1" / "model.py")
    with staged_entry(repo, spec.name, overwrite=overwrite) as staging:
        write_config(ensemble, staging / CONFIG_NAME)
        (staging / "1").mkdir()  # Triton wants a version folder for ensembles too
    return Path(repo) / spec.name, Path(repo) / spec.combiner
