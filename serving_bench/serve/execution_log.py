"""Execution logs: what each python-backend runner instance executed, one fixed-size record per batch.

The runners are ours (:mod:`serving_bench.serve.runners.base`), so they can say what occupied them without Triton's
request trace (which made the bundled tritonserver 2.51 abort, see
docs/serve.md#request-tracing-in-the-bundled-tritonserver-251). A server started with an execution
log folder (``TritonServer(..., execution_log=True)``) passes the folder to every runner-backed entry as the config
parameter ``execution_log``; each instance then appends to ``<folder>/<model>@<instance>.bin`` one :data:`RECORD` per
executed batch:

* ``start_s``, ``end_s``: ``time.perf_counter()`` when ``execute`` was entered and when its responses were built
  (seconds; ``CLOCK_MONOTONIC``, the clock of every process on the machine, so the load driver's send and completion
  times are directly comparable);
* ``cpu_s``: CPU seconds the runner's process used meanwhile (``time.process_time()``: every thread of it, the
  runtime's intra-op threads included) — the batch's demand on the cores is ``cpu_s / (end_s - start_s)``;
* ``rows``: rows of the batch (the sum over its requests); ``requests``: requests Triton's batcher merged into it.

A record is written with one ``write`` on an ``O_APPEND`` descriptor (32 bytes: atomic, ~2 us), so a reader sees whole
records at any time, also while the server runs and after it died. What the runner cannot see is the hop between
Triton's instance thread and the stub (shared-memory IPC on both sides): Triton's own compute time per batch is that
much longer; the profile's estimators add the difference back (:mod:`serving_bench.calibrate.estimators`).
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PARAMETER = "execution_log"  # the config parameter naming the folder
RECORD = np.dtype([("start_s", "<f8"), ("end_s", "<f8"), ("cpu_s", "<f8"), ("rows", "<i4"), ("requests", "<i4")])
_PACK = struct.Struct("<dddii")
SUFFIX = ".bin"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def log_path(folder: str | Path, model: str, instance: str) -> Path:
    """The file of one model instance (names reduced to letters, digits, ``_.-``: nothing escapes ``folder``, and
    the ``@`` that separates them appears in neither)."""
    return Path(folder) / f"{_UNSAFE.sub('_', model)}@{_UNSAFE.sub('_', instance)}{SUFFIX}"


class ExecutionLogWriter:
    """Appends one record per executed batch to a model instance's file (inside the runner)."""

    def __init__(self, folder: str | Path, model: str, instance: str):
        self.fd = os.open(log_path(folder, model, instance), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, start_s: float, end_s: float, cpu_s: float, rows: int, requests: int) -> None:
        os.write(self.fd, _PACK.pack(start_s, end_s, cpu_s, rows, requests))

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Executions:
    """Executed batches of one model, by start time: ``start_s``, ``end_s`` (seconds, ``perf_counter``'s clock),
    ``cpu_s`` (the runner process's CPU seconds meanwhile), ``rows``, ``requests`` and ``instance`` (index into
    ``instances``, the instance names) per batch."""

    start_s: np.ndarray
    end_s: np.ndarray
    cpu_s: np.ndarray
    rows: np.ndarray
    requests: np.ndarray
    instance: np.ndarray
    instances: tuple[str, ...] = ()

    @classmethod
    def empty(cls) -> "Executions":
        return cls(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, np.int32), np.zeros(0, np.int32),
                   np.zeros(0, np.int32))

    def __len__(self) -> int:
        return len(self.start_s)

    @property
    def duration_s(self) -> np.ndarray:
        return self.end_s - self.start_s

    @property
    def demand(self) -> np.ndarray:
        """Cores each batch kept busy: CPU seconds over wall seconds (0 for a zero-length batch)."""
        return np.divide(self.cpu_s, self.duration_s, out=np.zeros(len(self)), where=self.duration_s > 0)

    def running_at(self, t: np.ndarray) -> np.ndarray:
        """Whether, at each time (s), the last batch that started before it was still running."""
        k = np.searchsorted(self.start_s, t) - 1
        return (k >= 0) & (t < self.end_s[np.maximum(k, 0)])

    def select(self, mask: np.ndarray) -> "Executions":
        return Executions(self.start_s[mask], self.end_s[mask], self.cpu_s[mask], self.rows[mask],
                          self.requests[mask], self.instance[mask], self.instances)

    def window(self, lo_s: float, hi_s: float) -> "Executions":
        """The batches that started inside ``[lo_s, hi_s]``."""
        return self.select((self.start_s >= lo_s) & (self.start_s <= hi_s))


def read_execution_logs(folder: str | Path) -> dict[str, Executions]:
    """Every model's executed batches in ``folder`` (all its instances merged, by start time). A trailing partial
    record (a runner killed mid-write) is ignored."""
    per_model: dict[str, list[tuple[str, np.ndarray]]] = {}
    for path in sorted(Path(folder).glob(f"*{SUFFIX}")):
        model, _, instance = path.name[:-len(SUFFIX)].partition("@")
        data = path.read_bytes()
        usable = len(data) - len(data) % RECORD.itemsize
        per_model.setdefault(model, []).append((instance, np.frombuffer(data[:usable], dtype=RECORD)))
    out = {}
    for model, parts in per_model.items():
        records = np.concatenate([p for _, p in parts])
        instance = np.concatenate([np.full(len(p), i, np.int32) for i, (_, p) in enumerate(parts)])
        order = np.argsort(records["start_s"], kind="stable")
        records, instance = records[order], instance[order]
        out[model] = Executions(records["start_s"].copy(), records["end_s"].copy(), records["cpu_s"].copy(),
                                records["rows"].copy(), records["requests"].copy(), instance,
                                tuple(name for name, _ in parts))
    return out


def assign_requests(sent_s: np.ndarray, executions: Executions) -> np.ndarray:
    """For one model's requests (send times, any order) the index of the batch that served each, or -1: Triton's
    batcher takes requests in arrival order and batches leave in the order they were formed, so the requests sorted
    by send time fill the batches sorted by start, ``requests`` at a time. A request the log does not cover (it
    failed, or the log ended) is -1. Exact while requests reach Triton in the order they were sent (one sender)."""
    order = np.argsort(sent_s, kind="stable")
    per_batch = np.repeat(np.arange(len(executions)), executions.requests)
    out = np.full(len(sent_s), -1, dtype=np.int64)
    n = min(len(order), len(per_batch))
    out[order[:n]] = per_batch[:n]
    return out
