"""Records: one row per scheduled request (the table) and the facts of the run (:class:`RunInfo`), side by side.

Every target returns :class:`Records`. The table's columns (times are seconds since the start of the run, float64;
NaN where it did not happen): ``request_id`` (position in the schedule), ``model``, ``batch`` (request batch size),
``intended_s`` (scheduled arrival), ``sent_s`` (when the client handed it to the transport), ``done_s`` (response
received), ``status`` (one of :data:`STATUSES`), ``error`` (text, empty when ok), ``exec_batch`` (size of the
executed batch it rode in, -1 if unknown), ``instance`` (instance index that ran it, -1 if unknown).

Accounting invariant: every scheduled request has exactly one row, so
``scheduled = ok + error + timeout + rejected + not_sent`` and ``sent = scheduled - not_sent``.

:class:`RunInfo` is typed and frozen: what a reader of a run needs besides the rows (was it cut short and why, the
mode, the server's own statistics, the simulator's facts). It travels beside the table — not in
``DataFrame.attrs``, which pandas may drop or copy at any operation — and is saved with it as ``records.json``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from serving_bench.files import atomic_write, atomic_write_json, read_json
from serving_bench.run.schedule import Schedule

STATUSES = ("ok", "error", "timeout", "rejected", "not_sent")
COLUMNS = ("request_id", "model", "batch", "intended_s", "sent_s", "done_s", "status", "error", "exec_batch",
           "instance")


@dataclass(frozen=True)
class SimFacts:
    """What only a simulator knows about its run (per model, by entry name): busy instance-seconds, executed
    batches, items per executed batch (Triton's ``inference_count / execution_count``), mean time inside the server
    per answered request (Triton's ``success`` time: no client/network overhead), utilisation (busy
    instance-seconds / (instances x ``duration_s``)); per device: busy seconds. ``duration_s``: the later of the
    schedule's end and the last answer."""

    engine: str
    seed: int
    profile: str | None
    duration_s: float
    busy_s: Mapping[str, float]
    executions: Mapping[str, int]
    server_mean_s: Mapping[str, float | None]
    items_per_execution: Mapping[str, float | None]
    utilisation: Mapping[str, float]
    device_busy_s: Mapping[str, float]


@dataclass(frozen=True)
class RunInfo:
    """The facts of one run, beside its table. Times in seconds.

    Every target: ``target`` (its name), ``meta`` (the schedule's meta, plus what the target learned: ``ensembles``
    name -> members, ``platforms``, ``instances``, ``queue_policies``), ``partial`` (cut short: Ctrl-C, server or
    instance death, ``stop()``) with ``stop_reason``, ``mode`` (``open``/``closed``), ``concurrency`` (closed loop,
    per model). The real target:
    ``senders`` (sender processes), ``sender`` (``native`` or ``python``: which sender ran), ``url``, ``timeout_s``
    (per-request deadline), ``elapsed_s`` (wall time of the run), ``t0_s`` (the run's start on
    ``time.perf_counter``), ``t0_unix`` (the same instant on the wall clock), ``sender_cpu_s`` (CPU time of the
    senders), ``dropped`` (requests not sent at the open-loop cap), ``server_stats`` (Triton's statistics during the
    run, per model), ``batch_busy_s`` (Triton's busy time per model from its per-batch-size statistics, set by
    ``validate``), ``restarts`` (replays repeated on a new server), ``queue_policy_collapse`` (per model, the
    bundled Triton's queue-policy stall seen in the run: :mod:`serving_bench.load.collapse`). The simulator:
    ``sim``."""

    target: str
    meta: Mapping[str, Any] = field(default_factory=dict)
    partial: bool = False
    stop_reason: str | None = None
    mode: str | None = None
    concurrency: Mapping[str, int] | None = None
    senders: int | None = None
    sender: str | None = None
    url: str | None = None
    timeout_s: float | None = None
    elapsed_s: float | None = None
    t0_s: float | None = None
    t0_unix: float | None = None
    sender_cpu_s: float | None = None
    dropped: int | None = None
    server_stats: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    batch_busy_s: Mapping[str, float] | None = None
    restarts: tuple[str, ...] = ()
    queue_policy_collapse: Mapping[str, Mapping[str, Any]] | None = None
    sim: SimFacts | None = None

    def to_json(self) -> dict:
        """Plain JSON data (``records.json``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RunInfo":
        """The inverse of :meth:`to_json`; keys it does not know (a newer or older writer) are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if values.get("sim") is not None:
            sim_known = {f.name for f in dataclasses.fields(SimFacts)}
            values["sim"] = SimFacts(**{k: v for k, v in values["sim"].items() if k in sim_known})
        values["restarts"] = tuple(values.get("restarts") or ())
        return cls(**values)


@dataclass(frozen=True)
class Records:
    """A run's outcome: ``table`` (one row per request, :data:`COLUMNS`) and ``info`` (:class:`RunInfo`).

    ``len(records)`` is the number of rows. The binding is frozen; the table is a DataFrame the target fills."""

    table: pd.DataFrame
    info: RunInfo

    def __len__(self) -> int:
        return len(self.table)

    def with_info(self, **changes: Any) -> "Records":
        """The same table with some :class:`RunInfo` fields changed."""
        return Records(self.table, dataclasses.replace(self.info, **changes))


def new_table(schedule: Schedule) -> pd.DataFrame:
    """A records table for ``schedule`` with every request ``not_sent``; the target fills in what happens."""
    n = len(schedule)
    return pd.DataFrame({
        "request_id": np.arange(n, dtype=np.int64),
        "model": pd.Categorical.from_codes(schedule.model, categories=list(schedule.models)),
        "batch": schedule.batch.astype(np.int32),
        "intended_s": schedule.arrival_s.copy(),
        "sent_s": np.full(n, np.nan),
        "done_s": np.full(n, np.nan),
        "status": pd.Categorical.from_codes(np.full(n, STATUSES.index("not_sent")), categories=list(STATUSES)),
        "error": np.full(n, "", dtype=object),
        "exec_batch": np.full(n, -1, dtype=np.int32),
        "instance": np.full(n, -1, dtype=np.int32),
    })


def new_records(schedule: Schedule, target: str) -> Records:
    """:func:`new_table` with the run's facts so far: the target's name and the schedule's meta."""
    return Records(new_table(schedule), RunInfo(target=target, meta=dict(schedule.meta)))


def not_sent_records(schedule: Schedule, target: str, reason: str) -> Records:
    """The records of a run stopped before it sent anything: every request ``not_sent``, marked partial."""
    return new_records(schedule, target).with_info(partial=True, stop_reason=reason)


def status_column_codes(status: pd.Series) -> np.ndarray:
    """The int codes (index into :data:`STATUSES`) of a table's status column, categorical or text."""
    if not (hasattr(status, "cat") and tuple(status.cat.categories) == STATUSES):
        status = pd.Categorical(status, categories=list(STATUSES))
        if (status.codes < 0).any():
            raise ValueError(f"unknown status; expected one of {', '.join(STATUSES)}")
        return status.codes
    return status.cat.codes.to_numpy()


def counts_of_codes(codes: np.ndarray) -> dict[str, int]:
    """Requests per status plus ``scheduled``, ``sent`` and ``failed`` (error + rejected) from status codes;
    satisfies the accounting invariant by construction."""
    by_status = np.bincount(codes, minlength=len(STATUSES))
    out = {s: int(by_status[i]) for i, s in enumerate(STATUSES)}
    out["scheduled"] = int(len(codes))
    out["sent"] = out["scheduled"] - out["not_sent"]
    out["failed"] = out["error"] + out["rejected"]
    return out


def counts(table: pd.DataFrame) -> dict[str, int]:
    """:func:`counts_of_codes` of a records table (or a part of one)."""
    return counts_of_codes(status_column_codes(table["status"]))


def check_accounting(table: pd.DataFrame) -> None:
    """Raise AssertionError unless each request appears once with a consistent status and timestamps."""
    n = len(table)
    assert np.array_equal(table["request_id"].to_numpy(), np.arange(n)), "request ids are not 0..n-1 in order"
    status = table["status"].astype(str).to_numpy()
    sent = ~np.isnan(table["sent_s"].to_numpy())
    done = ~np.isnan(table["done_s"].to_numpy())
    assert np.all(sent[status != "not_sent"]), "a request with a status other than not_sent has no sent_s"
    assert not np.any(sent[status == "not_sent"]), "a not_sent request has a sent_s"
    assert np.all(done[status == "ok"]), "an ok request has no done_s"
    c = counts(table)
    assert c["sent"] == c["ok"] + c["failed"] + c["timeout"], "sent != ok + failed + timed out"


def save_records(records: Records, out_dir: str | Path) -> None:
    """Write ``records.parquet``, ``records.csv`` (the table) and ``records.json`` (the :class:`RunInfo`) into
    ``out_dir``, each atomically."""
    out_dir = Path(out_dir)
    table = records.table
    atomic_write(out_dir / "records.parquet", lambda p: table.to_parquet(p, index=False))
    atomic_write(out_dir / "records.csv", lambda p: table.to_csv(p, index=False))
    atomic_write_json(out_dir / "records.json", records.info.to_json())


def load_records(out_dir: str | Path) -> Records:
    """Read records written by :func:`save_records` (a folder without ``records.json``: only the target is unknown)."""
    out_dir = Path(out_dir)
    table = pd.read_parquet(out_dir / "records.parquet")
    table["status"] = pd.Categorical(table["status"].astype(str), categories=list(STATUSES))
    info_path = out_dir / "records.json"
    info = RunInfo.from_json(read_json(info_path, "records.json")) if info_path.is_file() else RunInfo("unknown")
    return Records(table, info)
