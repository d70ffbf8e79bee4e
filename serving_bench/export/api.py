"""``export_models``: the Python API behind ``serving-bench export`` (other commands call it too).

    records = export_models(["tiny_cnn"], ["onnxruntime", "tvm"], "model_repo", max_batch_size=8)

Order of work: validate everything first (model and framework names, options, ensemble specs, existing entries
without ``overwrite``) so bad input changes nothing; then, per model, build the seeded torch module once and, per
framework, write the artifact into a staging folder, load it back in its own runtime, check parity at batch 1 and at
``max_batch_size``, write ``config.pbtxt`` and rename the folder into place; then the ensembles; then merge the
records into ``manifest.json``. A framework that cannot run here (TensorRT without a GPU) is recorded as skipped with
its reason; an entry whose export or parity check fails is reported as failed and leaves nothing on disk.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from serving_bench.errors import InputError, require_count
from serving_bench.export.config import entry_config
from serving_bench.export.ensemble import ENSEMBLE_FRAMEWORK, EnsembleSpec, write_ensemble
from serving_bench.export.frameworks import ExportOptions, Framework, get_framework, gpu_available
from serving_bench.export.parity import TOLERANCE, check_parity
from serving_bench.export.repository import (CONFIG_NAME, ModelConfig, entry_dir, file_sha256, read_config,
                                             staged_entry, update_manifest, write_config)
from serving_bench.export.sleep import write_sleep_entry
from serving_bench.models import MODEL_OPTIONS, PRECISIONS, ModelSpec, get_model

SLEEP_ENTRY = "sleep_python"
# Idle seconds to leave the machine after an export before measuring on it. Right after writing a repository (~300
# MB; a few GB of memory used and freed) this 2-core VM ran a replay's sends 1.2-7.1 ms late at p99 (four trials), a
# replay straight after that one still 3.0 ms; after 45 s idle 0.21-0.87 ms, as in a process that exported nothing
# (2026-12-01). An idle 1 ms sleep overslept 0.2-0.3 ms at p99 throughout, so no probe tells when it is over: wait.
SETTLE_AFTER_EXPORT_S = 45.0
# <framework>_model.py for each python-backend framework
RUNNERS_DIR = Path(__file__).resolve().parents[1] / "serve" / "runners"


@dataclass(frozen=True)
class PlannedEntry:
    """One entry to write: ``spec`` exported with ``framework`` (``None`` for the sleep model) as ``name``."""

    name: str
    spec: ModelSpec
    framework: Framework | None
    skip_reason: str | None = None


def entry_name(model: str, framework: str) -> str:
    return f"{model}_{framework}"


def _split(values: str | Iterable[str]) -> list[str]:
    items = values.split(",") if isinstance(values, str) else list(values)
    return [v.strip() for v in items if v and v.strip()]


def plan(models: Sequence[str], frameworks: Sequence[str], repo: Path, opts: ExportOptions, *, overwrite: bool,
         ensembles: Sequence[EnsembleSpec], model_options: Mapping[str, object]) -> list[PlannedEntry]:
    """Validate the request and list the entries to write; raises :class:`InputError` before anything is written."""
    if not models and not ensembles:
        raise InputError("--models", None, "expected at least one model name (or an --ensemble of existing entries)")
    if opts.precision not in PRECISIONS:
        raise InputError("--precision", opts.precision, f"expected one of {', '.join(PRECISIONS)}")
    require_count("--max-batch-size", opts.max_batch_size)
    require_count("--instances", opts.instances)
    require_count("--tvm-tune-trials", opts.tvm_tune_trials, minimum=0)
    bad = [b for b in opts.tvm_buckets if not 1 <= b <= opts.max_batch_size]
    if bad:
        raise InputError("--tvm-buckets", str(bad[0]), f"expected batch sizes in 1..{opts.max_batch_size}")
    fws = [get_framework(f) for f in dict.fromkeys(frameworks)]
    reasons = {fw.name: fw.unavailable_reason() for fw in fws}
    planned: list[PlannedEntry] = []
    for model in dict.fromkeys(models):
        options = {k: v for k, v in model_options.items() if k in MODEL_OPTIONS.get(model, ())}
        spec = get_model(model, **options)
        if spec.frameworks == ("python",):
            planned.append(PlannedEntry(SLEEP_ENTRY, spec, None))
            continue
        if not fws:
            raise InputError("--frameworks", None, "expected at least one framework")
        spec = spec.with_precision(opts.precision)
        planned += [PlannedEntry(entry_name(model, fw.name), spec, fw, reasons[fw.name]) for fw in fws]
    names = [p.name for p in planned if p.skip_reason is None]
    for ens in ensembles:
        names += [ens.name, ens.combiner]
        for member in ens.members:
            skipped = next((p for p in planned if p.name == member and p.skip_reason), None)
            if skipped:
                raise InputError("--ensemble", f"{ens.name}.{member}", f"member will be skipped: {skipped.skip_reason}")
            if member not in names and not (entry_dir(repo, member) / CONFIG_NAME).is_file():
                raise InputError("--ensemble", f"{ens.name}.{member}",
                                 f"no such entry in {repo} and not exported by this command; planned entries: "
                                 f"{', '.join(p.name for p in planned if p.skip_reason is None) or 'none'}")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InputError("--ensemble", duplicates[0], "entry name used twice in this command")
    if not overwrite:
        for name in names:
            if entry_dir(repo, name).exists():
                raise InputError(entry_dir(repo, name), None, "entry already exists; pass --overwrite to replace it "
                                                              "(nothing was written)")
    return planned


def _io_record(spec: ModelSpec) -> dict:
    return {"inputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in spec.inputs],
            "outputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in spec.outputs]}


def _artifact_record(entry: Path, artifact: str) -> dict:
    path = entry / "1" / artifact
    return {"artifact": f"1/{artifact}", "sha256": file_sha256(path), "size_bytes": path.stat().st_size}


def export_entry(item: PlannedEntry, module, reference, repo: Path, opts: ExportOptions, *, gpu: bool,
                 overwrite: bool) -> dict:
    """Export one planned entry (framework set, not skipped); returns its manifest record. Raises on failure, in
    which case the staging folder is removed and the repository is unchanged."""
    fw = item.framework
    record = {"model": item.spec.name, "framework": fw.name, "precision": opts.precision, "status": "exported",
              "platform": fw.platform or None, "backend": fw.backend or None,
              "max_batch_size": opts.max_batch_size, "instances": opts.instances, "seed": opts.seed}
    with staged_entry(repo, item.name, overwrite=overwrite) as staging:
        version = staging / "1"
        version.mkdir()
        start = time.perf_counter()
        settings = fw.impl().write(module, item.spec, version, opts)
        record["export_s"] = round(time.perf_counter() - start, 3)
        start = time.perf_counter()
        runtime = {k: str(v) for k, v in settings.pop("runtime", {}).items()}  # what load() needs besides the file
        predict = fw.load(version, item.spec.input_names, item.spec.output_names, **runtime)
        batches = sorted({1, opts.max_batch_size})
        errors = check_parity(predict, reference, item.spec, batches, seed=opts.seed)
        record["parity_s"] = round(time.perf_counter() - start, 3)
        params = {"framework": fw.name, "precision": opts.precision, **runtime}
        if fw.backend == "python":
            shutil.copy2(RUNNERS_DIR / f"{fw.name}_model.py", version / "model.py")
            params["artifact"] = fw.artifact
            if "target" in settings:
                params["target"] = json.dumps(settings["target"], sort_keys=True)
        config = entry_config(item.name, item.spec, fw, opts, gpu=gpu, parameters=params)
        write_config(config, staging / CONFIG_NAME)
        record.update(_artifact_record(staging, fw.artifact))
    record.update({"parity": {str(b): e for b, e in errors.items()}, "parity_error": max(errors.values()),
                   "tolerance": TOLERANCE[opts.precision], "settings": settings, **_io_record(item.spec)})
    return record


def _sleep_record(repo: Path, spec: ModelSpec, opts: ExportOptions, base_ms: float, per_item_ms: float) -> dict:
    return {"model": "sleep", "framework": "python", "precision": "fp32", "status": "exported",
            "platform": None, "backend": "python", "max_batch_size": opts.max_batch_size,
            "instances": opts.instances, "export_s": 0.0, "parity": None, "parity_error": None,
            "settings": {"base_ms": base_ms, "per_item_ms": per_item_ms},
            **_artifact_record(repo / SLEEP_ENTRY, "model.py"), **_io_record(spec)}


def export_models(models: str | Sequence[str], frameworks: str | Sequence[str] = (), repo: str | Path = "model_repo",
                  *, max_batch_size: int = 32, precision: str = "fp32", instances: int = 1, overwrite: bool = False,
                  ensembles: Sequence[str | EnsembleSpec] = (), seed: int = 0, tvm_tune_trials: int = 0,
                  tvm_buckets: Sequence[int] = (),
                  seq_len: int | None = None, sleep_base_ms: float = 5.0, sleep_per_item_ms: float = 1.0,
                  log: Callable[[str], None] | None = None) -> list[dict]:
    """Export zoo ``models`` with ``frameworks`` into ``repo``; returns one record per entry, each with ``name`` and
    ``status`` (``exported``, ``skipped`` or ``failed``, the latter two with ``reason``).

    Bad input raises :class:`InputError` before anything is written. Records of exported and skipped entries are
    merged into ``<repo>/manifest.json``.
    """
    log = log or (lambda line: None)
    repo = Path(repo)
    opts = ExportOptions(max_batch_size=int(max_batch_size), precision=precision, instances=int(instances),
                         seed=int(seed), tvm_tune_trials=int(tvm_tune_trials),
                         tvm_buckets=tuple(int(b) for b in tvm_buckets))
    ens_specs = [e if isinstance(e, EnsembleSpec) else EnsembleSpec.parse(e) for e in ensembles]
    planned = plan(_split(models), _split(frameworks), repo, opts, overwrite=overwrite, ensembles=ens_specs,
                   model_options={"seq_len": seq_len})
    repo.mkdir(parents=True, exist_ok=True)
    gpu = gpu_available()
    records: list[dict] = []
    manifest_records: dict[str, dict] = {}

    def done(name: str, record: dict) -> None:
        record = {"name": name, **record}
        records.append(record)
        if record["status"] != "failed":
            manifest_records[name] = {k: v for k, v in record.items() if k != "name"}
        log(_summary_line(record))

    by_model: dict[str, list[PlannedEntry]] = {}
    for item in planned:
        by_model.setdefault(item.spec.name, []).append(item)
    try:
        for model, items in by_model.items():
            if items[0].framework is None:  # the sleep model: a python runner, nothing to compare
                write_sleep_entry(repo, SLEEP_ENTRY, overwrite=overwrite, base_ms=sleep_base_ms,
                                  per_item_ms=sleep_per_item_ms, max_batch_size=opts.max_batch_size,
                                  instances=opts.instances)
                done(SLEEP_ENTRY, _sleep_record(repo, items[0].spec, opts, sleep_base_ms, sleep_per_item_ms))
                continue
            runnable = [i for i in items if i.skip_reason is None]
            module = items[0].spec.create(opts.seed) if runnable else None
            reference = items[0].spec.with_precision("fp32").create(opts.seed) if opts.precision != "fp32" and \
                runnable else module
            for item in items:
                if item.skip_reason:
                    if not entry_dir(repo, item.name).exists():  # keep a real earlier export's record
                        done(item.name, {"model": model, "framework": item.framework.name, "precision": precision,
                                         "status": "skipped", "reason": item.skip_reason})
                    else:
                        log(f"{item.name}: skipped ({item.skip_reason}); the existing entry is kept")
                    continue
                try:
                    done(item.name, export_entry(item, module, reference, repo, opts, gpu=gpu, overwrite=overwrite))
                except InputError:
                    raise
                except Exception as err:  # noqa: BLE001 - reported per entry; the others still export
                    reason = " ".join(f"{type(err).__name__}: {err}".split())
                    done(item.name, {"model": model, "framework": item.framework.name, "precision": precision,
                                     "status": "failed", "reason": reason})
        failed = {r["name"]: r["reason"] for r in records if r["status"] == "failed"}
        for ens in ens_specs:
            broken = [m for m in ens.members if m in failed]
            if broken:
                done(ens.name, {"model": ens.name, "framework": ENSEMBLE_FRAMEWORK, "status": "failed",
                                "reason": f"member {broken[0]} failed to export"})
                continue
            configs: dict[str, ModelConfig] = {m: read_config(entry_dir(repo, m) / CONFIG_NAME) for m in ens.members}
            write_ensemble(repo, ens, configs, instances=opts.instances, overwrite=overwrite)
            done(ens.combiner, {"model": ens.combiner, "framework": "python", "status": "exported",
                                "backend": "python", "members": list(ens.members),
                                **_artifact_record(repo / ens.combiner, "model.py")})
            done(ens.name, {"model": ens.name, "framework": ENSEMBLE_FRAMEWORK, "status": "exported",
                            "platform": "ensemble", "members": list(ens.members)})
    finally:
        if manifest_records:
            update_manifest(repo, manifest_records)
    return records


def _summary_line(record: dict) -> str:
    name, status = record["name"], record["status"]
    if status != "exported":
        return f"{name}: {status}: {record.get('reason', '')}"
    parts = []
    if record.get("parity"):
        parts.append("parity " + ", ".join(f"{e:.1e} @ batch {b}" for b, e in record["parity"].items()))
    if "export_s" in record:
        parts.append(f"export {record['export_s']:.1f} s")
    if "size_bytes" in record:
        parts.append(f"{record['size_bytes'] / 1e6:.2f} MB")
    if record.get("members"):
        parts.append("members " + ", ".join(record["members"]))
    return f"{name}: exported" + (f" ({'; '.join(parts)})" if parts else "")


def settle_after_export(exported_at: float, log: Callable[[str], None] | None = None) -> None:
    """Sleep until :data:`SETTLE_AFTER_EXPORT_S` seconds after ``exported_at`` (``time.perf_counter``), telling
    ``log`` once, before measuring anything on this machine."""
    left = SETTLE_AFTER_EXPORT_S - (time.perf_counter() - exported_at)
    if left > 0:
        if log is not None:
            log(f"letting the machine settle for {left:.0f} s after the export (measurements right after one run late)")
        time.sleep(left)
