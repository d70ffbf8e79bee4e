"""Writing one planned entry: its artifact (or a link to one already written), the check, the config.

Variants of a model that need the same artifact (:meth:`Variant.artifact_variant`: the same framework, precision and
TVM trials) share it: the first writes it, the others get a hard link to the published file (a copy where the
file system cannot link), so a runtime variant costs a config, not a re-export. The check runs per entry with the
settings the exporter can apply (:meth:`Variant.parity_settings`); entries whose artifact and settings are those of
one checked before reuse its figures (``parity_reused_from``).

The check: parity against the fp32 torch module (:mod:`.parity`); for int8, the accuracy gate (:mod:`.quantize`),
whose failure raises :class:`~serving_bench.export.quantize.GateRejected` and leaves nothing on disk.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from serving_bench.export.config import entry_config
from serving_bench.export.frameworks import ExportOptions, Framework, get_framework
from serving_bench.export.parity import TOLERANCE, check_parity
from serving_bench.export.quantize import GateRejected, int8_gate
from serving_bench.export.repository import CONFIG_NAME, entry_dir, file_sha256, staged_entry, write_config
from serving_bench.export.variants import Variant
from serving_bench.models import ModelSpec

# <framework>_model.py for each python-backend framework
RUNNERS_DIR = Path(__file__).resolve().parents[1] / "serve" / "runners"


@dataclass(frozen=True)
class PlannedEntry:
    """One entry to write: ``spec`` exported as ``variant`` (``None`` for the sleep model) under ``name``."""

    name: str
    spec: ModelSpec
    variant: Variant | None
    skip_reason: str | None = None

    @property
    def framework(self) -> Framework | None:
        return get_framework(self.variant.framework) if self.variant else None


@dataclass
class ExportRun:
    """One export into ``repo`` (``gpu``: a CUDA GPU is visible; ``overwrite``: replace existing entries), and what
    its entries wrote so far: artifact key -> (entry, artifact path, writer's settings); check key -> (entry,
    figures)."""

    repo: Path
    gpu: bool
    overwrite: bool
    artifacts: dict[Variant, tuple[str, Path, dict]] = field(default_factory=dict)
    checks: dict[tuple, tuple[str, dict]] = field(default_factory=dict)


def entry_options(opts: ExportOptions, variant: Variant) -> ExportOptions:
    """The export options of one variant's artifact (its precision and TVM trial budget)."""
    return dataclasses.replace(opts, precision=variant.precision, tvm_tune_trials=variant.tune_trials)


def io_record(spec: ModelSpec) -> dict:
    return {"inputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in spec.inputs],
            "outputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in spec.outputs]}


def artifact_record(entry: Path, artifact: str) -> dict:
    path = entry / "1" / artifact
    return {"artifact": f"1/{artifact}", "sha256": file_sha256(path), "size_bytes": path.stat().st_size}


def _write_artifact(item: PlannedEntry, module, version: Path, opts: ExportOptions, run: ExportRun) -> tuple[dict,
                                                                                                              dict]:
    """Write (or link) the artifact into ``version``; returns (settings, record fields)."""
    fw, key = item.framework, item.variant.artifact_variant()
    if key in run.artifacts:
        owner, path, settings = run.artifacts[key]
        try:
            os.link(path, version / fw.artifact)
        except OSError:  # another file system, or links not allowed: a copy
            shutil.copy2(path, version / fw.artifact)
        return json.loads(json.dumps(settings)), {"artifact_shared_with": owner}
    start = time.perf_counter()
    settings = fw.impl().write(module, item.spec, version, opts)
    return settings, {"export_s": round(time.perf_counter() - start, 3)}


def _check(item: PlannedEntry, version: Path, runtime: dict, reference, opts: ExportOptions, run: ExportRun) -> dict:
    """Parity (or the int8 gate) of the artifact in ``version`` with the variant's session settings; record fields.
    Raises :class:`ParityError` or :class:`GateRejected`."""
    variant, spec = item.variant, item.spec
    settings = {**runtime, **variant.parity_settings()}
    key = (variant.artifact_variant(), tuple(sorted(settings.items())))
    if key in run.checks:
        owner, figures = run.checks[key]
        return {**figures, "parity_reused_from": owner}
    start = time.perf_counter()
    predict = item.framework.load(version, spec.input_names, spec.output_names, **settings)
    if variant.precision == "int8":
        gate = int8_gate(predict, reference, spec, opts.max_batch_size, seed=opts.seed)
        if not gate.passed:
            raise GateRejected(gate)
        figures = {"gate": gate.record(), "parity": None, "parity_error": None, "tolerance": None}  # its own metric
    else:
        errors = check_parity(predict, reference, spec, sorted({1, opts.max_batch_size}), seed=opts.seed)
        figures = {"parity": {str(b): e for b, e in errors.items()}, "parity_error": max(errors.values()),
                   "tolerance": TOLERANCE[spec.precision]}
    run.checks[key] = (item.name, figures)
    return {**figures, "parity_s": round(time.perf_counter() - start, 3)}


def export_entry(item: PlannedEntry, module, reference, opts: ExportOptions, run: ExportRun) -> dict:
    """Export one planned entry (variant set, not skipped); returns its manifest record. Raises on failure (a gate
    rejection included), in which case the staging folder is removed and the repository is unchanged."""
    fw, variant = item.framework, item.variant
    opts = entry_options(opts, variant)
    record = {"model": item.spec.name, "framework": fw.name, "variant": variant.id, "precision": variant.precision,
              "status": "exported", "platform": fw.platform or None, "backend": fw.backend or None,
              "max_batch_size": opts.max_batch_size, "instances": opts.instances, "seed": opts.seed}
    with staged_entry(run.repo, item.name, overwrite=run.overwrite) as staging:
        version = staging / "1"
        version.mkdir()
        settings, fields = _write_artifact(item, module, version, opts, run)
        record.update(fields)
        runtime = {k: str(v) for k, v in settings.pop("runtime", {}).items()}  # what load() needs besides the file
        record.update(_check(item, version, runtime, reference, opts, run))
        params = {"framework": fw.name, "precision": variant.precision, **runtime}
        if fw.backend == "python":
            shutil.copy2(RUNNERS_DIR / f"{fw.name}_model.py", version / "model.py")
            params["artifact"] = fw.artifact
            if "target" in settings:
                params["target"] = json.dumps(settings["target"], sort_keys=True)
        config = entry_config(item.name, item.spec, fw, opts, gpu=run.gpu, parameters=params)
        variant.apply_to_config(config)
        write_config(config, staging / CONFIG_NAME)
        record.update(artifact_record(staging, fw.artifact))
    run.artifacts.setdefault(variant.artifact_variant(), (item.name, entry_dir(run.repo, item.name) / "1" / fw.artifact,
                                                          {**settings, "runtime": runtime}))
    record.update({"settings": settings, **io_record(item.spec)})
    return record
