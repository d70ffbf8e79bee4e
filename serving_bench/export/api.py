"""``export_models``: the Python API behind ``serving-bench export`` (other commands call it too).

    records = export_models(["tiny_cnn"], ["onnxruntime", "tvm"], "model_repo", options=ExportOptions(max_batch_size=8))

    records = export_models(["resnet50"], repo="model_repo", variants="onnxruntime,onnxruntime:int8,tvm:intra=2")

Order of work: validate everything first (model, framework and variant names, options, ensemble specs, existing
entries without ``overwrite``) so bad input changes nothing; then, per model, build the seeded torch module once and,
per variant (``--frameworks`` gives each framework's default variant), write the artifact into a staging folder (or
link the one an earlier variant wrote, :mod:`.entry`), load it back in its own runtime, check parity at batch 1 and
at ``max_batch_size`` (int8: the accuracy gate), write ``config.pbtxt`` and rename the folder into place; then the
ensembles; then merge the records into ``manifest.json``. A framework or variant that cannot run here (TensorRT
without a GPU, fp16 without one) is recorded as skipped with its reason; an int8 variant that fails its gate as
rejected; an entry whose export or parity check fails is reported as failed. Neither leaves anything on disk.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from serving_bench.errors import InputError, require_count
from serving_bench.export.ensemble import ENSEMBLE_FRAMEWORK, EnsembleSpec, write_ensemble
from serving_bench.export.entry import ExportRun, PlannedEntry, artifact_record, export_entry, io_record
from serving_bench.export.frameworks import FRAMEWORKS, ExportOptions, get_framework, gpu_available
from serving_bench.export.quantize import GateRejected
from serving_bench.export.repository import (CONFIG_NAME, ModelConfig, entry_dir, read_config, update_manifest)
from serving_bench.export.sleep import write_sleep_entry
from serving_bench.export.variants import Variant, auto_variants, parse_variants
from serving_bench.models import MODEL_OPTIONS, PRECISIONS, ModelSpec, get_model

SLEEP_ENTRY = "sleep_python"
# Idle seconds to leave the machine after an export before measuring on it. Right after writing a repository (~300
# MB; a few GB of memory used and freed) this 2-core VM ran a replay's sends 1.2-7.1 ms late at p99 (four trials), a
# replay straight after that one still 3.0 ms; after 45 s idle 0.21-0.87 ms, as in a process that exported nothing
# (2026-12-01). An idle 1 ms sleep overslept 0.2-0.3 ms at p99 throughout, so no probe tells when it is over: wait.
SETTLE_AFTER_EXPORT_S = 45.0
STATUSES = ("exported", "skipped", "rejected", "failed")


def entry_name(model: str, framework: str) -> str:
    return f"{model}_{framework}"


def _split(values: str | Iterable[str]) -> list[str]:
    items = values.split(",") if isinstance(values, str) else list(values)
    return [v.strip() for v in items if v and v.strip()]


def framework_variants(frameworks: Sequence[str], opts: ExportOptions) -> list[Variant]:
    """``--frameworks`` as variants: each framework's default variant in ``--precision``, TVM with
    ``--tvm-tune-trials`` (their entries keep the names ``<model>_<framework>``)."""
    return [Variant(get_framework(f).name, precision=opts.precision,
                    tune_trials=opts.tvm_tune_trials if f == "tvm" else 0) for f in dict.fromkeys(frameworks)]


def _check_options(opts: ExportOptions) -> None:
    if opts.precision not in PRECISIONS:
        raise InputError("--precision", opts.precision, f"expected one of {', '.join(PRECISIONS)}")
    require_count("--max-batch-size", opts.max_batch_size)
    require_count("--instances", opts.instances)
    require_count("--tvm-tune-trials", opts.tvm_tune_trials, minimum=0)
    bad = [b for b in opts.tvm_buckets if not 1 <= b <= opts.max_batch_size]
    if bad:
        raise InputError("--tvm-buckets", str(bad[0]), f"expected batch sizes in 1..{opts.max_batch_size}")


def plan(models: Sequence[str], variants: Sequence[Variant], repo: Path, opts: ExportOptions, *, overwrite: bool,
         ensembles: Sequence[EnsembleSpec], model_options: Mapping[str, object],
         by_framework: bool = True) -> list[PlannedEntry]:
    """Validate the request and list the entries to write; raises :class:`InputError` before anything is written.
    ``by_framework``: the variants came from ``--frameworks`` (entries named ``<model>_<framework>``); else each is
    named by :meth:`Variant.entry_name` and skipped where it cannot run here (fp16 without a GPU, ...)."""
    if not models and not ensembles:
        raise InputError("--models", None, "expected at least one model name (or an --ensemble of existing entries)")
    _check_options(opts)
    reasons = {v.framework: get_framework(v.framework).unavailable_reason() for v in variants}
    gpu = not by_framework and gpu_available()
    planned: list[PlannedEntry] = []
    for model in dict.fromkeys(models):
        options = {k: v for k, v in model_options.items() if k in MODEL_OPTIONS.get(model, ())}
        spec = get_model(model, **options)
        if spec.frameworks == ("python",):
            planned.append(PlannedEntry(SLEEP_ENTRY, spec, None))
            continue
        if not variants:
            raise InputError("--frameworks", None, "expected at least one framework")
        for v in variants:
            name = entry_name(model, v.framework) if by_framework else v.entry_name(model)
            reason = reasons[v.framework] or (None if by_framework else v.unavailable_reason(gpu))
            planned.append(PlannedEntry(name, spec.with_precision(opts.precision if by_framework else v.io_precision),
                                        v, reason))
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


def _sleep_record(repo: Path, spec: ModelSpec, opts: ExportOptions) -> dict:
    return {"model": "sleep", "framework": "python", "precision": "fp32", "status": "exported",
            "platform": None, "backend": "python", "max_batch_size": opts.max_batch_size,
            "instances": opts.instances, "export_s": 0.0, "parity": None, "parity_error": None,
            "settings": {"base_ms": opts.sleep_base_ms, "per_item_ms": opts.sleep_per_item_ms},
            **artifact_record(repo / SLEEP_ENTRY, "model.py"), **io_record(spec)}


def _resolve_variants(frameworks: str | Sequence[str], variants: str | Sequence[str] | None, opts: ExportOptions,
                      gpu: bool) -> tuple[list[Variant], bool]:
    """(the variants to export, whether they came from ``frameworks``)."""
    if variants is None or (isinstance(variants, str) and not variants.strip()):
        return framework_variants(_split(frameworks), opts), True
    if _split(frameworks):
        raise InputError("--variants", None, "give either --frameworks or --variants (a variant names its framework)")
    if opts.precision != "fp32":
        raise InputError("--precision", opts.precision, "with --variants, give the precision in each variant "
                                                        "(onnxruntime:int8, torchscript:fp16)")
    if _split(variants) == ["auto"]:
        return auto_variants(FRAMEWORKS, gpu=gpu, tvm_trials=opts.tvm_tune_trials), False
    if opts.tvm_tune_trials:
        raise InputError("--tvm-tune-trials", str(opts.tvm_tune_trials), "with --variants, give the trials in the "
                                                                          "variant (tvm:trials=64)")
    return parse_variants(variants), False


def export_models(models: str | Sequence[str], frameworks: str | Sequence[str] = (), repo: str | Path = "model_repo",
                  *, options: ExportOptions = ExportOptions(), variants: str | Sequence[str] | None = None,
                  overwrite: bool = False, ensembles: Sequence[str | EnsembleSpec] = (),
                  log: Callable[[str], None] | None = None) -> list[dict]:
    """Export zoo ``models`` with ``frameworks`` (or as ``variants``: a list as :func:`parse_variants` reads it, or
    ``auto``) into ``repo``, as ``options`` say (batch size, precision, seeds, TVM tuning, ...: :class:`ExportOptions`);
    returns one record per entry, each with ``name`` and ``status`` (``exported``, ``skipped``, ``rejected`` (an int8
    variant that failed its accuracy gate) or ``failed``, the last three with ``reason``).

    Bad input raises :class:`InputError` before anything is written. Records of all but failed entries are merged
    into ``<repo>/manifest.json``.
    """
    log = log or (lambda line: None)
    repo = Path(repo)
    opts = dataclasses.replace(options, max_batch_size=int(options.max_batch_size), instances=int(options.instances),
                               seed=int(options.seed), tvm_tune_trials=int(options.tvm_tune_trials),
                               tvm_buckets=tuple(int(b) for b in options.tvm_buckets))
    ens_specs = [e if isinstance(e, EnsembleSpec) else EnsembleSpec.parse(e) for e in ensembles]
    _check_options(opts)
    gpu = gpu_available()
    chosen, by_framework = _resolve_variants(frameworks, variants, opts, gpu)
    planned = plan(_split(models), chosen, repo, opts, overwrite=overwrite, ensembles=ens_specs,
                   model_options={"seq_len": opts.seq_len}, by_framework=by_framework)
    repo.mkdir(parents=True, exist_ok=True)
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
            if items[0].variant is None:  # the sleep model: a python runner, nothing to compare
                write_sleep_entry(repo, SLEEP_ENTRY, overwrite=overwrite, base_ms=opts.sleep_base_ms,
                                  per_item_ms=opts.sleep_per_item_ms, max_batch_size=opts.max_batch_size,
                                  instances=opts.instances)
                done(SLEEP_ENTRY, _sleep_record(repo, items[0].spec, opts))
                continue
            _export_model(items, opts, ExportRun(repo, gpu, overwrite), done=done, log=log)
        _export_ensembles(ens_specs, records, repo, opts, overwrite=overwrite, done=done)
    finally:
        if manifest_records:
            update_manifest(repo, manifest_records)
    return records


def _export_model(items: list[PlannedEntry], opts: ExportOptions, run: ExportRun, *,
                  done: Callable[[str, dict], None], log: Callable[[str], None]) -> None:
    """Every planned entry of one model: the torch module is built once (and its fp32 reference, once)."""
    runnable = [i for i in items if i.skip_reason is None]
    spec = items[0].spec
    module = {p: spec.with_precision(p).create(opts.seed) for p in sorted({i.spec.precision for i in runnable})}
    reference = module["fp32"] if "fp32" in module else \
        spec.with_precision("fp32").create(opts.seed) if runnable else None
    repo = run.repo
    for item in items:
        failure = {"model": spec.name, "framework": item.variant.framework, "variant": item.variant.id,
                   "precision": item.variant.precision}
        if item.skip_reason:
            if not entry_dir(repo, item.name).exists():  # keep a real earlier export's record
                done(item.name, {**failure, "status": "skipped", "reason": item.skip_reason})
            else:
                log(f"{item.name}: skipped ({item.skip_reason}); the existing entry is kept")
            continue
        try:
            done(item.name, export_entry(item, module[item.spec.precision], reference, opts, run))
        except InputError:
            raise
        except GateRejected as err:  # reported, and never served: an older entry of that name goes too
            if entry_dir(repo, item.name).exists():
                shutil.rmtree(entry_dir(repo, item.name))
            done(item.name, {**failure, "status": "rejected", "reason": str(err), "gate": err.result.record()})
        except Exception as err:  # noqa: BLE001 - reported per entry; the others still export
            reason = " ".join(f"{type(err).__name__}: {err}".split())
            done(item.name, {**failure, "status": "failed", "reason": reason})


def _export_ensembles(ens_specs: Sequence[EnsembleSpec], records: list[dict], repo: Path, opts: ExportOptions, *,
                      overwrite: bool, done: Callable[[str, dict], None]) -> None:
    failed = {r["name"]: r["reason"] for r in records if r["status"] in ("failed", "rejected")}
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
                            **artifact_record(repo / ens.combiner, "model.py")})
        done(ens.name, {"model": ens.name, "framework": ENSEMBLE_FRAMEWORK, "status": "exported",
                        "platform": "ensemble", "members": list(ens.members)})


def _summary_line(record: dict) -> str:
    name, status = record["name"], record["status"]
    if status != "exported":
        return f"{name}: {status}: {record.get('reason', '')}"
    parts = []
    if record.get("parity"):
        parts.append("parity " + ", ".join(f"{e:.1e} @ batch {b}" for b, e in record["parity"].items()))
    if record.get("gate"):
        gate = record["gate"]
        top1 = f", top-1 agreement {gate['top1_agreement']:.2f}" if gate["top1_agreement"] is not None else ""
        parts.append(f"int8 gate passed: range error {gate['range_error']:.2g}{top1}")
    if record.get("artifact_shared_with"):
        parts.append(f"artifact shared with {record['artifact_shared_with']}")
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
