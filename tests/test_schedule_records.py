"""Schedule round trip, records accounting and the summary's coordinated-omission-safe latency."""

from __future__ import annotations

import numpy as np
import pytest

from serving_bench.errors import InputError
from serving_bench.run.schedule import Schedule
from serving_bench.run.metrics import summarize
from serving_bench.run.records import check_accounting, counts, load_records, new_records, save_records


def _schedule(n=100):
    rng = np.random.default_rng(0)
    return Schedule(np.cumsum(rng.exponential(0.01, n)), rng.integers(0, 2, n), ("a", "b"), rng.integers(0, 5, n),
                    np.ones(n), {"seed": 0, "duration_s": 1.0})


def test_schedule_save_load_is_exact(tmp_path):
    schedule = _schedule()
    loaded = Schedule.load(schedule.save(tmp_path / "s.npz"))
    assert loaded.equals(schedule)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="bad.npz"):
        Schedule.load(tmp_path / "bad.npz")


def test_schedule_rejects_unsorted_arrivals():
    with pytest.raises(ValueError, match="non-decreasing"):
        Schedule([0.2, 0.1], [0, 0], ("a",), [0, 0], [1, 1])


def test_records_accounting_and_latency_from_intended_time(tmp_path):
    schedule = _schedule()
    records = new_records(schedule, target="test")
    table = records.table
    rows = np.arange(len(schedule))
    sent = rows < 90
    table.loc[sent, "sent_s"] = table.loc[sent, "intended_s"] + 0.5  # a client that stalled 0.5 s
    table.loc[sent, "done_s"] = table.loc[sent, "sent_s"] + 0.001
    table.loc[sent, "status"] = "ok"
    table.loc[rows == 0, "status"] = "error"
    check_accounting(table)
    c = counts(table)
    assert (c["scheduled"], c["sent"], c["ok"], c["error"], c["not_sent"]) == (100, 90, 89, 1, 10)
    summary = summarize(records, duration_s=2.0)
    assert summary["overall"]["p50_s"] == pytest.approx(0.501)       # intended -> done
    assert summary["overall"]["service_p50_s"] == pytest.approx(0.001)  # sent -> done hides the stall
    save_records(records, tmp_path)
    again = load_records(tmp_path)
    assert counts(again.table) == c and again.info.target == "test"
