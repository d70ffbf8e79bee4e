"""Profiles from measurements taken elsewhere: a plain ``batch_size, latency`` CSV, and the H200 eager table.

``import_csv(path, CsvImport(model=..., device=...))``: a CSV with a header naming a batch-size column (``batch_size``
or ``batch``) and latency columns. Latency columns are in milliseconds when named ``*_ms`` and seconds when named
``*_s``; recognised names: ``latency_ms``/``latency_s`` (one sample per row; several rows per batch size become that
size's samples), ``min``, ``p50``, ``p90``, ``p99``, ``max`` and ``mean`` (quantiles). Optional columns ``model`` and
``precision`` split one file into several models.

From quantiles the service-time distribution is the piecewise-linear quantile function through the given points;
when ``max`` is missing but ``mean`` is given, the top point (q = 1) is placed so that the distribution's mean equals
``mean`` (never below the highest given quantile); with neither, the highest given quantile is also the maximum.

``import_h200_eager()``: the bundled ``data/h200_torch_eager_solo_2026-11-29.csv`` (torch eager on one H200; see
``data/README.md``) as a profile with device ``gpu0`` and entries ``<model>_<precision>`` (``resnet50_fp16``, ...),
``execution_mode: eager``.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from serving_bench.errors import InputError
from serving_bench.profiles.distributions import Dist
from serving_bench.profiles.entries import ModelOnDevice, ModelProfile
from serving_bench.profiles.schema import DeviceInfo, Profile

H200_CSV = Path(__file__).resolve().parent / "data" / "h200_torch_eager_solo_2026-11-29.csv"
QUANTILE_COLUMNS = {"min": 0.0, "p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "max": 1.0}


def _unit(column: str) -> tuple[str, float] | None:
    for suffix, scale in (("_ms", 1e-3), ("_us", 1e-6), ("_s", 1.0)):
        if column.endswith(suffix):
            return column[: -len(suffix)], scale
    return None


def dist_from_row_quantiles(points: dict[float, float], mean: float | None, source: str, where: str) -> Dist:
    """The documented quantile rule (module docstring) for one batch size."""
    if 0.0 not in points:
        points[0.0] = min(points.values())
    if 1.0 not in points:
        top_q = max(points)
        top = points[top_q]
        qs = sorted(points)
        if mean is not None:
            partial = sum((qs[i + 1] - qs[i]) * (points[qs[i]] + points[qs[i + 1]]) / 2 for i in range(len(qs) - 1))
            width = 1.0 - top_q
            x = 2 * (mean - partial) / width - top
            points[1.0] = max(x, top)
        else:
            points[1.0] = top
    qs = sorted(points)
    values = [points[q] for q in qs]
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise InputError(source, where, f"quantiles decrease ({values[i - 1]:g} then {values[i]:g} s)")
    return Dist(tuple(qs), tuple(values))


def read_latency_csv(text: str, source: str) -> dict[tuple[str, str], dict[int, Dist]]:
    """(model, precision) -> batch size -> Dist, from CSV text (see the module docstring)."""
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise InputError(source, "header", "expected a header row with batch_size and latency columns")
    fields = [f.strip() for f in reader.fieldnames]
    batch_col = next((f for f in fields if f in ("batch_size", "batch")), None)
    if batch_col is None:
        raise InputError(source, "header", "expected a batch_size (or batch) column")
    latency_cols = {}
    for f in fields:
        parsed = _unit(f)
        if parsed and (parsed[0] in QUANTILE_COLUMNS or parsed[0] in ("latency", "mean")):
            latency_cols[f] = parsed
    if not latency_cols:
        raise InputError(source, "header", "expected latency columns such as latency_ms, p50_ms, p90_ms, mean_ms")
    samples: dict[tuple[str, str], dict[int, list[float]]] = {}
    quantiles: dict[tuple[str, str], dict[int, tuple[dict, float | None]]] = {}
    for line, row in enumerate(reader, start=2):
        row = {k.strip(): (v or "").strip() for k, v in row.items() if k}
        try:
            batch = int(row[batch_col])
            if batch < 1:
                raise ValueError
        except ValueError:
            raise InputError(source, f"line {line}: {batch_col}", f"expected a batch size >= 1, got {row[batch_col]!r}")
        key = (row.get("model") or "model", row.get("precision") or "")
        points: dict[float, float] = {}
        mean = None
        for col, (name, scale) in latency_cols.items():
            if row.get(col, "") == "":
                continue
            try:
                value = float(row[col]) * scale
                if value < 0:
                    raise ValueError
            except ValueError:
                raise InputError(source, f"line {line}: {col}", f"expected a non-negative number, got {row[col]!r}")
            if name == "latency":
                samples.setdefault(key, {}).setdefault(batch, []).append(value)
            elif name == "mean":
                mean = value
            else:
                points[QUANTILE_COLUMNS[name]] = value
        if points:
            if batch in quantiles.get(key, {}):
                raise InputError(source, f"line {line}", f"batch size {batch} appears twice for {key[0]}")
            quantiles.setdefault(key, {})[batch] = (points, mean)
        elif mean is not None and key not in samples:
            quantiles.setdefault(key, {})[batch] = ({0.5: mean}, None)
    out: dict[tuple[str, str], dict[int, Dist]] = {}
    for key, per in samples.items():
        out.setdefault(key, {}).update({b: Dist.from_samples(v) for b, v in per.items()})
    for key, per in quantiles.items():
        for b, (points, mean) in per.items():
            out.setdefault(key, {})[b] = dist_from_row_quantiles(points, mean, source, f"batch_size {b}")
    if not out:
        raise InputError(source, None, "no latency rows")
    return out


@dataclass(frozen=True)
class CsvImport:
    """What a latency CSV does not say: ``model`` names the entry when the CSV has no model column (with one,
    entries are ``<model>_<precision>`` unless the CSV holds a single model); the ``device`` it was measured on
    (``device_kind`` by default ``cpu`` for the device ``cpu``, else ``gpu``; ``cores`` for a cpu), the entries'
    ``framework``, ``precision`` and ``execution_mode``, a constant per-request ``overhead_s`` and a ``note``."""

    model: str | None = None
    device: str = "gpu0"
    device_kind: str | None = None
    device_name: str = ""
    cores: int | None = None
    framework: str = ""
    precision: str = ""
    execution_mode: str = "n/a"
    overhead_s: float = 0.0
    note: str | None = None


def import_csv(path: str | Path, options: CsvImport = CsvImport()) -> Profile:
    """A profile from a latency CSV (module docstring), with what the CSV does not say from ``options``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(path, None, f"cannot read: {err.strerror or err}") from None
    table = read_latency_csv(text, str(path))
    o, device = options, options.device
    kind = o.device_kind or ("cpu" if device == "cpu" else "gpu")
    if kind == "cpu" and o.cores is None:
        raise InputError("--cores", None, "a cpu device needs its core count")
    models = {}
    for (name, prec), batches in sorted(table.items()):
        entry = o.model if (o.model and len(table) == 1) else (f"{name}_{prec}" if prec else name)
        md = ModelOnDevice(o.execution_mode, batches, ())
        models[entry] = ModelProfile(entry, o.framework, prec or o.precision, {device: md})
    notes = [f"imported from {path.name}"] + ([o.note] if o.note else [])
    return Profile({device: DeviceInfo(device, kind, o.device_name, cores=o.cores)}, models,
                   Dist.constant(o.overhead_s), source=f"csv:{path.name}",
                   created=datetime.now(timezone.utc).isoformat(timespec="seconds"), notes=tuple(notes))


def import_h200_eager(path: str | Path = H200_CSV) -> Profile:
    """The bundled H200 torch-eager table as a profile (device ``gpu0``, entries ``<model>_<precision>``)."""
    profile = import_csv(path, CsvImport(
        device="gpu0", device_kind="gpu", device_name="NVIDIA H200", framework="pytorch", execution_mode="eager",
        note="torch EAGER mode (inference_mode, one stream), not CUDA graphs or TensorRT: small batches are "
             "CPU-launch-bound; solo timings only (no co-location curve measured; the simulator's default GPU curve "
             "applies); 20 timed passes per row, noisy"))
    return Profile(profile.devices, profile.models, profile.overhead, profile.pairs,
                   {"hostname": "h200 host (not recorded)", "gpu": "NVIDIA H200 (132 SMs, 140 GB)",
                    "torch": "2.11+cu130"}, profile.source, "2026-11-29", profile.ensemble_step_s, profile.notes)
