"""Trace files: per-request CSV logs and the Azure Functions 2019 invocation counts, read (checked) and written.

* **Request CSV** — a header naming ``timestamp_s`` and ``model`` (and optionally ``batch``), then one row per
  request: seconds since any origin (shifted so the first request is at 0), the model (a served entry name, or a name
  mapped with ``model_map``), the request batch size (default 1). Timestamps that go backwards are **sorted with a
  warning** by default (logs merged from several front ends are often slightly out of order); ``strict: true``
  rejects them instead, naming the first offending line.
* **Azure Functions 2019** (``invocations_per_function_md.anon.d*.csv``) — a header ``HashOwner, HashApp,
  HashFunction, Trigger, 1, 2, ..., 1440``, then one row per function with its invocation count in each minute of the
  day.

Errors name the file, the line and the field. How a trace becomes arrivals: :mod:`serving_bench.load.traces`.
"""

from __future__ import annotations

import csv
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from serving_bench.errors import InputError
from serving_bench.files import atomic_write

AZURE_FIXED = ("HashOwner", "HashApp", "HashFunction", "Trigger")
MINUTES_PER_DAY = 1440


class TraceOrderWarning(UserWarning):
    """A request trace had timestamps out of order and was sorted."""


@dataclass(frozen=True, eq=False)
class RequestTrace:
    """A per-request trace: ``times_s`` (sorted, first at 0), ``model`` index into ``models``, ``batch`` sizes."""

    times_s: np.ndarray
    model: np.ndarray
    models: tuple[str, ...]
    batch: np.ndarray


@dataclass(frozen=True, eq=False)
class AzureTrace:
    """Azure Functions invocation counts: ``counts[f, m]`` invocations of function ``f`` in minute ``m``."""

    functions: tuple[tuple[str, str, str, str], ...]
    counts: np.ndarray


def open_trace(path: Path):
    """``path`` opened for reading as CSV text; an :class:`InputError` naming it when it cannot be read."""
    try:
        handle = open(path, newline="", encoding="utf-8")
    except OSError as err:
        raise InputError(path, None, f"cannot read the trace: {err.strerror or err}") from None
    return handle


def read_request_csv(path: str | Path, *, strict: bool = False,
                     model_map: Mapping[str, str] | None = None) -> RequestTrace:
    """Read a request CSV (see the module doc). ``model_map`` renames trace models to served entries."""
    path = Path(path)
    model_map = dict(model_map or {})
    with open_trace(path) as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise InputError(path, "line 1", "empty file; expected a header 'timestamp_s,model[,batch]'")
        header = [h.strip() for h in header]
        for name in ("timestamp_s", "model"):
            if name not in header:
                raise InputError(path, "line 1", f"header lacks '{name}'; expected 'timestamp_s,model[,batch]', "
                                                 f"got {','.join(header)!r}")
        unknown = [h for h in header if h not in ("timestamp_s", "model", "batch")]
        if unknown:
            raise InputError(path, f"line 1: {unknown[0]}", "unknown column; expected timestamp_s, model, batch")
        col_t, col_m = header.index("timestamp_s"), header.index("model")
        col_b = header.index("batch") if "batch" in header else None
        times: list[float] = []
        names: list[str] = []
        batches: list[int] = []
        for lineno, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise InputError(path, f"line {lineno}", f"expected {len(header)} fields ({','.join(header)}), "
                                                         f"got {len(row)}")
            try:
                t = float(row[col_t])
            except ValueError:
                t = math.nan
            if not math.isfinite(t):
                raise InputError(path, f"line {lineno}: timestamp_s", f"expected a number of seconds, got {row[col_t]!r}")
            model = row[col_m].strip()
            if not model:
                raise InputError(path, f"line {lineno}: model", "expected a model name, got an empty field")
            b = 1
            if col_b is not None:
                try:
                    b = int(row[col_b])
                except ValueError:
                    b = 0
                if b < 1:
                    raise InputError(path, f"line {lineno}: batch", f"expected an integer >= 1, got {row[col_b]!r}")
            times.append(t)
            names.append(model_map.get(model, model))
            batches.append(b)
    if not times:
        raise InputError(path, "line 2", "no requests; expected at least one row after the header")
    t = np.asarray(times, dtype=np.float64)
    backwards = np.flatnonzero(np.diff(t) < 0)
    order = np.arange(len(t))
    if len(backwards):
        first = int(backwards[0]) + 3  # +1 for the diff, +1 for the header, +1 for 1-based lines
        if strict:
            raise InputError(path, f"line {first}: timestamp_s",
                             f"timestamps must not go backwards ({t[backwards[0] + 1]!r} after {t[backwards[0]]!r}); "
                             "sort the file or set strict: false to sort on read")
        warnings.warn(f"{path}: line {first}: timestamp_s goes backwards ({len(backwards)} places); "
                      "sorted the requests by time", TraceOrderWarning, stacklevel=2)
        order = np.argsort(t, kind="stable")
    t = t[order] - t[order][0]
    models = tuple(dict.fromkeys(names[i] for i in order))
    index = {m: k for k, m in enumerate(models)}
    return RequestTrace(t, np.array([index[names[i]] for i in order], dtype=np.int32), models,
                        np.asarray(batches, dtype=np.int32)[order])


def read_azure(path: str | Path) -> AzureTrace:
    """Read an Azure Functions 2019 invocations file (any number of minute columns, normally 1440)."""
    path = Path(path)
    with open_trace(path) as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:4]) != AZURE_FIXED or len(header) < 5:
            raise InputError(path, "line 1", f"expected the Azure Functions header {','.join(AZURE_FIXED)},1,...,1440")
        minutes = [h.strip() for h in header[4:]]
        for k, name in enumerate(minutes, start=1):
            if name != str(k):
                raise InputError(path, f"line 1: column {k + 4}", f"expected minute '{k}', got {name!r}")
        functions, rows = [], []
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise InputError(path, f"line {lineno}", f"expected {len(header)} fields (4 ids + {len(minutes)} "
                                                         f"minutes), got {len(row)}")
            try:
                counts = [int(c) for c in row[4:]]
            except ValueError:
                bad = next(k for k, c in enumerate(row[4:], start=1) if not c.strip().isdigit())
                raise InputError(path, f"line {lineno}: minute {bad}",
                                 f"expected a count (integer >= 0), got {row[4 + bad - 1]!r}") from None
            if min(counts) < 0:
                bad = counts.index(min(counts)) + 1
                raise InputError(path, f"line {lineno}: minute {bad}", f"expected a count >= 0, got {counts[bad - 1]}")
            functions.append(tuple(row[:4]))
            rows.append(counts)
    if not rows:
        raise InputError(path, "line 2", "no functions; expected at least one row after the header")
    return AzureTrace(tuple(functions), np.asarray(rows, dtype=np.int64))


def synthetic_azure(path: str | Path, *, functions: int = 12, seed: int = 0, minutes: int = MINUTES_PER_DAY) -> Path:
    """Write a small synthetic trace in the Azure Functions 2019 format: Zipf-like popularity, a diurnal swing and
    Poisson noise per minute (the real data set is not shipped; this has its shape)."""
    rng = np.random.default_rng(seed)
    popularity = 40.0 / np.arange(1, functions + 1) ** 1.2
    t = np.arange(minutes)
    day = 1.0 + 0.6 * np.sin(2 * np.pi * (t / MINUTES_PER_DAY - 0.3))
    counts = rng.poisson(popularity[:, None] * day[None, :])
    triggers = ("http", "queue", "timer", "event")

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow([*AZURE_FIXED, *range(1, minutes + 1)])
            for f in range(functions):
                ids = [f"{rng.integers(2**63):016x}" for _ in range(3)]
                writer.writerow([*ids, triggers[f % len(triggers)], *counts[f]])

    return atomic_write(path, write)


def write_request_csv(path: str | Path, times_s: np.ndarray, models: Sequence[str], batch: np.ndarray | None = None) -> Path:
    """Write a request CSV (``timestamp_s,model,batch``) atomically."""
    batch = np.ones(len(times_s), dtype=np.int64) if batch is None else batch

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["timestamp_s", "model", "batch"])
            for t, m, b in zip(times_s, models, batch):
                writer.writerow([f"{t:.6f}", m, int(b)])

    return atomic_write(path, write)
