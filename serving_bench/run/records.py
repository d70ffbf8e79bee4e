"""Records: one row per scheduled request, the common output of every Target (real replay or simulation).

Columns (times are seconds since the start of the run, float64; NaN where it did not happen):
``request_id`` (position in the schedule), ``model``, ``batch`` (request batch size), ``intended_s`` (scheduled
arrival), ``sent_s`` (when the client handed it to the transport), ``done_s`` (response received), ``status`` (one of
:data:`STATUSES`), ``error`` (text, empty when ok), ``exec_batch`` (size of the executed batch it rode in, -1 if
unknown), ``instance`` (instance index that ran it, -1 if unknown).

Accounting invariant: every scheduled request has exactly one row, so
``scheduled = ok + error + timeout + rejected + not_sent`` and ``sent = scheduled - not_sent``.
``records.attrs['partial']`` is true when the run was cut short (Ctrl-C, server death).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from serving_bench.load.schedule import Schedule

STATUSES = ("ok", "error", "timeout", "rejected", "not_sent")
COLUMNS = ("request_id", "model", "batch", "intended_s", "sent_s", "done_s", "status", "error", "exec_batch",
           "instance")


def new_records(schedule: Schedule, target: str) -> pd.DataFrame:
    """A records table for ``schedule`` with every request ``not_sent``; the target fills in what happens."""
    n = len(schedule)
    records = pd.DataFrame({
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
    records.attrs.update(target=target, partial=False, meta=dict(schedule.meta))
    return records


def not_sent_records(schedule: Schedule, target: str, reason: str) -> pd.DataFrame:
    """The records of a run stopped before it sent anything: every request ``not_sent``, marked partial."""
    records = new_records(schedule, target)
    records.attrs.update(partial=True, stop_reason=reason)
    return records


def status_codes(statuses) -> np.ndarray:
    """int codes (index into :data:`STATUSES`) for an array of status strings."""
    lookup = {s: i for i, s in enumerate(STATUSES)}
    return np.fromiter((lookup[s] for s in statuses), dtype=np.int8, count=len(statuses))


def counts(records: pd.DataFrame) -> dict[str, int]:
    """Requests per status plus ``scheduled`` and ``sent``; satisfies the accounting invariant by construction."""
    by_status = records["status"].value_counts().reindex(STATUSES, fill_value=0)
    out = {s: int(by_status[s]) for s in STATUSES}
    out["scheduled"] = int(len(records))
    out["sent"] = out["scheduled"] - out["not_sent"]
    out["failed"] = out["error"] + out["rejected"]
    return out


def check_accounting(records: pd.DataFrame) -> None:
    """Raise AssertionError unless each request appears once with a consistent status and timestamps."""
    n = len(records)
    assert np.array_equal(records["request_id"].to_numpy(), np.arange(n)), "request ids are not 0..n-1 in order"
    status = records["status"].astype(str).to_numpy()
    sent = ~np.isnan(records["sent_s"].to_numpy())
    done = ~np.isnan(records["done_s"].to_numpy())
    assert np.all(sent[status != "not_sent"]), "a request with a status other than not_sent has no sent_s"
    assert not np.any(sent[status == "not_sent"]), "a not_sent request has a sent_s"
    assert np.all(done[status == "ok"]), "an ok request has no done_s"
    c = counts(records)
    assert c["sent"] == c["ok"] + c["failed"] + c["timeout"], "sent != ok + failed + timed out"


def save_records(records: pd.DataFrame, out_dir: str | Path) -> None:
    """Write ``records.parquet`` and ``records.csv`` (and ``records.json`` with attrs) into ``out_dir`` atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = records.copy()
    frame.attrs = {}
    for name, writer in (("records.parquet", lambda p: frame.to_parquet(p, index=False)),
                         ("records.csv", lambda p: frame.to_csv(p, index=False))):
        tmp = out_dir / f".{name}.tmp"
        writer(tmp)
        os.replace(tmp, out_dir / name)
    tmp = out_dir / ".records.json.tmp"
    tmp.write_text(json.dumps(records.attrs, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, out_dir / "records.json")


def load_records(out_dir: str | Path) -> pd.DataFrame:
    """Read records written by :func:`save_records`."""
    out_dir = Path(out_dir)
    records = pd.read_parquet(out_dir / "records.parquet")
    records["status"] = pd.Categorical(records["status"].astype(str), categories=list(STATUSES))
    attrs_path = out_dir / "records.json"
    if attrs_path.is_file():
        records.attrs.update(json.loads(attrs_path.read_text()))
    return records
