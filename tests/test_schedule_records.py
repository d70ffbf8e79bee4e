"""Schedule round trip, records accounting, the summary's coordinated-omission-safe latency and its percentiles'
confidence intervals."""

from __future__ import annotations

import numpy as np
import pytest

from serving_bench.errors import InputError
from serving_bench.run.schedule import Schedule
from serving_bench.run.metrics import quantile_intervals, simulated_inside, summarize
from serving_bench.run.records import check_accounting, counts, load_records, new_records, save_records


def quantile_interval(values, q):
    """One quantile's interval (``quantile_intervals`` of a single ``q``)."""
    return quantile_intervals(values, [q])[0]


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


def test_a_closed_loops_pool_holds_each_entrys_requests_in_order():
    pool = Schedule.closed_loop({"b": 4, "a": 1}, 3, {"duration_s": 2.0})
    assert pool.models == ("b", "a") and pool.duration_s == 2.0
    assert pool.model.tolist() == [0, 0, 0, 1, 1, 1] and pool.batch.tolist() == [4, 4, 4, 1, 1, 1]
    assert not pool.arrival_s.any() and not pool.sample.any()


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


def test_a_percentiles_interval_is_the_binomial_order_statistics():
    """Worked by hand: of 100 values the median's 95 % interval is the 40th to the 61st (the textbook pair: a
    Binomial(100, 0.5) count falls below 40 with probability 0.018 and above 60 with 0.018); a p99 needs n with
    1 - 0.99^n >= 0.975, i.e. n >= 367.04: 368 values, for an upper end (the largest); nothing for no values."""
    values = np.arange(1.0, 101.0)[::-1]  # unsorted on purpose
    assert quantile_interval(values, 0.5) == (40.0, 61.0)
    assert quantile_interval(np.arange(1.0, 368.0), 0.99)[1] is None
    assert quantile_interval(np.arange(1.0, 369.0), 0.99)[1] == 368.0
    assert quantile_interval(np.array([]), 0.5) == (None, None)
    assert quantile_interval(np.arange(1.0, 4.0), 0.5) == (None, None)  # three values bound no median at 95 %


def test_a_percentiles_interval_covers_the_true_quantile_as_often_as_it_says():
    rng = np.random.default_rng(7)
    true_p90 = np.log(10.0)  # of the unit exponential
    covered = [lo <= true_p90 <= hi for lo, hi in (quantile_interval(rng.exponential(size=200), 0.9)
                                                   for _ in range(1000))]
    assert 0.94 <= np.mean(covered) <= 0.99  # at least 95 % (order statistics are conservative), and not vacuous


def test_the_summary_gives_each_percentile_its_interval_on_request():
    records = new_records(_schedule(), target="test")
    table = records.table
    table["sent_s"] = table["intended_s"]
    table["done_s"] = table["intended_s"] + np.linspace(0.001, 0.1, len(table))
    table["status"] = "ok"
    assert "intervals_s" not in summarize(records, duration_s=2.0)["models"]["a"]
    model = summarize(records, duration_s=2.0, intervals=True)["models"]["a"]
    low, high = model["intervals_s"]["p50"]
    assert low < model["p50_s"] < high and model["intervals_s"]["p99"][1] is None  # ~50 requests bound no p99
    assert simulated_inside({"simulated": model["p50_s"], "measured_low": low, "measured_high": high})
    assert not simulated_inside({"simulated": high * 1.01, "measured_low": low, "measured_high": high})
    assert simulated_inside({"simulated": 1e9, "measured_low": low, "measured_high": None})  # an open end
    assert simulated_inside({"simulated": 1.0, "measured_low": None, "measured_high": None}) is None
