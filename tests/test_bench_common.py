"""The machinery the peer benchmarks share (no server): the sustain criterion and search, trials, spreads,
plausibility and the ratio line."""

from __future__ import annotations

import json
import os
import time

import pytest

from serving_bench.peers import report
from serving_bench.peers.perf_analyzer import Unstable, parse_measurement, span_s
from serving_bench.peers.report import Figure, Spread, compare, figure, interleave, ratio_line, write_result
from serving_bench.peers.sustain import Delivery, allowance, judge, max_sustained


# -- the criterion ---------------------------------------------------------------------------------------------------

def test_count_noise_of_a_short_poisson_window_is_allowed():
    # issue 14: 488 of 500 req/s over a 3 s window (97.6 %) failed a flat 98 % bar; it is 1.3 sd of Poisson noise
    assert judge(Delivery(500, 3.0, 1464, None))["sustained"]
    assert allowance(500, 3.0) == pytest.approx(3 * (1500 ** 0.5))
    short = judge(Delivery(500, 3.0, 1300, None))
    assert not short["sustained"] and "delivered 1300 of 1500" in short["why"]


def test_lateness_and_failures_fail_a_step_and_clear_misses_are_marked():
    assert judge(Delivery(2000, 2.88, 5760, 1.0))["sustained"]  # exactly 1 % late: perf_analyzer does not warn
    late = judge(Delivery(2000, 2.88, 5760, 1.5))
    assert not late["sustained"] and not late["clear_miss"]
    assert judge(Delivery(2000, 2.88, 5760, 6.0))["clear_miss"]
    assert not judge(Delivery(2000, 2.88, 5760, None, failed=1))["sustained"]
    assert judge(Delivery(2000, 2.88, 5760 - 2 * int(allowance(2000, 2.88)) - 5, None))["clear_miss"]


def test_the_span_is_perf_analyzers_three_windows():
    assert span_s(0.8) == pytest.approx(3 * 1.2 * 0.8)


# -- the search ------------------------------------------------------------------------------------------------------

def threshold_probe(limit: float, misses: tuple = ()):
    """A side that sustains every rate up to ``limit``; the ``misses``-th measurements (0-based) fail anyway."""
    calls = []

    def probe(rate: float) -> dict:
        calls.append(rate)
        ok = rate <= limit and len(calls) - 1 not in misses
        return {"rate": rate, "sustained": ok, "clear_miss": rate > 2 * limit}
    return probe, calls


def test_search_brackets_the_threshold_within_tolerance():
    probe, _ = threshold_probe(2300)
    found = max_sustained(probe, 2000, step=1.25, tolerance=0.05)
    assert found.converged and found.rate <= 2300 < found.failed_at
    assert found.failed_at / found.rate - 1 <= 0.05


def test_one_noisy_miss_does_not_walk_the_search_down():
    probe, calls = threshold_probe(2300, misses=(0,))  # the very first measurement (2000 req/s) misses
    found = max_sustained(probe, 2000, step=1.25, tolerance=0.05)
    assert calls[:2] == [2000, 2000] and found.steps[1]["repeat"]
    assert 2000 <= found.rate <= 2300


def test_a_confirmed_failure_walks_down_and_a_far_start_gallops():
    probe, calls = threshold_probe(300)
    found = max_sustained(probe, 2000, step=1.05, tolerance=0.05)
    assert found.rate <= 300 < found.failed_at and found.converged
    assert len(calls) < 20  # 5 % steps all the way down would take ~40 measurements (and their repeats)


def test_search_reports_when_nothing_is_sustained_or_the_budget_runs_out():
    probe, _ = threshold_probe(10)
    assert max_sustained(probe, 500, step=2.0, tolerance=0.05, floor=50).rate is None
    probe, _ = threshold_probe(2300)
    found = max_sustained(probe, 500, step=1.05, tolerance=0.01, max_steps=4)
    assert not found.converged and len(found.steps) == 4


# -- trials, spreads, plausibility, the ratio ------------------------------------------------------------------------

def test_interleave_alternates_the_order_and_records_unstable_points():
    order = []

    def side(name):
        def run(k):
            order.append((k, name))
            if name == "peer" and k == 1:
                raise Unstable("Failed to obtain stable measurement within 10 measurement windows")
            return k
        return run

    runs = interleave(3, {"ours": side("ours"), "peer": side("peer")}, log=lambda _: None)
    assert order == [(0, "ours"), (0, "peer"), (1, "peer"), (1, "ours"), (2, "ours"), (2, "peer")]
    assert runs["ours"] == [0, 1, 2] and runs["peer"][0] == 0 and runs["peer"][2] == 2
    assert "stable measurement" in runs["peer"][1]["unstable"]


def test_spread_is_median_and_range():
    assert Spread.of([3.0, 1.0, 2.0, 10.0]) == Spread(2.5, 1.0, 10.0, 4)
    assert Spread.of([]).text() == "none"


def test_implausible_figures_give_no_ratio_and_say_why():
    floor = {"floor": 2000.0, "why_floor": " req/s, sustained earlier"}
    ours = [figure(2300, **floor), figure(2400, **floor), figure(2200, **floor)]
    peer = [figure(2500, **floor), figure(66, **floor), figure(None, missing="unstable")]
    assert peer[1] == Figure(66, "66 is below 2000 req/s, sustained earlier")
    cmp = compare(ours, peer)
    assert cmp["ratio"]["n"] == 1 and cmp["ratio"]["median"] == pytest.approx(2300 / 2500)
    assert [(u["trial"], u["side"]) for u in cmp["unreliable"]] == [(2, "peer"), (3, "peer")]
    line = ratio_line("max rate", cmp, unit="req/s", target=">= 1.0")
    assert "ratio 0.920" in line and "66 is below 2000" in line
    none = compare([figure(100)], [figure(5, floor=50)])
    assert "ratio: none" in ratio_line("x", none, unit="/s", target=">= 1")
    assert figure(10, ceiling=5).unreliable.startswith("10 is above 5")


def test_request_count_is_read_from_the_console():
    row = {"Inferences/Second": "1000", "p50 latency": "800", "p90 latency": "900", "p95 latency": "950",
           "p99 latency": "1200"}
    text = ("  Client: \n    Request count: 2880\n    Throughput: 1000 infer/sec\n  Server: \n"
            "    Inference count: 2880\n    Successful request count: 2880\n")
    m = parse_measurement(row, text, "request_rate", 1000.0)
    assert m.request_count == 2880 and m.p99_s == pytest.approx(0.0012) and m.delayed_pct is None


def test_a_second_result_of_the_day_does_not_overwrite_the_first(tmp_path):
    first = write_result("bench", {"run": 1}, quick=True, out_dir=tmp_path)
    second = write_result("bench", {"run": 2}, quick=True, out_dir=tmp_path)
    assert second.name == first.name.replace(".json", "_2.json")
    assert '"run": 1' in first.read_text() and '"run": 2' in second.read_text()


def test_a_result_takes_the_suffix_of_the_measurements_it_was_computed_from(tmp_path):
    for _ in range(3):  # data, data_2, data_3 ...
        data = write_result("bench_data", {}, quick=True, out_dir=tmp_path)
    write_result("bench", {}, quick=True, out_dir=tmp_path)  # ... and one result of an earlier run
    paired = write_result("bench", {}, quick=True, out_dir=tmp_path, same_suffix_as=data)
    assert data.name.endswith("_3.json") and paired.name == data.name.replace("bench_data", "bench")
    taken = write_result("bench", {}, quick=True, out_dir=tmp_path, same_suffix_as=data)  # taken: the next free one
    assert taken.name == data.name.replace("bench_data", "bench").replace("_3.json", "_2.json")


def test_saved_measurements_are_compressed_and_read_back_and_their_results_pair_with_them(tmp_path):
    from serving_bench.errors import InputError
    from serving_bench.files import read_json

    first = write_result("bench_data", {"x": [1.5, 2.0]}, quick=True, out_dir=tmp_path, compressed=True)
    data = write_result("bench_data", {"x": [3.0]}, quick=True, out_dir=tmp_path, compressed=True, markdown="# m")
    assert first.name.endswith(".json.xz") and data.name == first.name.replace(".json.xz", "_2.json.xz")
    assert read_json(data)["x"] == [3.0] and read_json(first)["x"] == [1.5, 2.0]
    assert (tmp_path / data.name.replace(".json.xz", ".md")).read_text() == "# m\n"
    assert len(data.read_bytes()) < len(json.dumps(read_json(data), indent=2))  # compressed on disk
    paired = write_result("bench", {}, quick=True, out_dir=tmp_path, same_suffix_as=data)
    assert paired.name == data.name.replace("bench_data", "bench").replace(".json.xz", ".json")
    broken = tmp_path / "broken.json.xz"
    broken.write_bytes(b"{not xz}")
    with pytest.raises(InputError, match="broken.json.xz: cannot read the saved measurements: not xz-compressed"):
        read_json(broken, "saved measurements")


def test_a_result_records_the_hypervisors_steal_and_says_when_the_machine_was_disturbed(tmp_path, monkeypatch, capsys):
    quiet = write_result("bench", {"run": 1}, quick=True, out_dir=tmp_path)
    facts = json.loads(quiet.read_text())
    assert facts["steal_s"] >= 0.0 and 0.0 <= facts["steal_share"] <= 1.0
    clock = report._STEAL
    started = time.monotonic() - 60.0  # as if the benchmark had started a minute ago ...
    monkeypatch.setattr(clock, "started", started)
    # ... and the hypervisor had taken a tenth of the machine's CPU time since
    monkeypatch.setattr(clock, "stolen", clock.stolen - 0.1 * 60.0 * (os.cpu_count() or 1))
    capsys.readouterr()
    disturbed = write_result("bench", {"run": 2}, quick=True, out_dir=tmp_path)
    assert json.loads(disturbed.read_text())["steal_share"] >= 0.09
    assert f"figures measured in it are not comparable ({disturbed.name})" in capsys.readouterr().out
    # figures computed from saved measurements time nothing: their steal is recorded, nothing said
    computed = write_result("bench", {"run": 3}, quick=True, out_dir=tmp_path, timed=False)
    assert json.loads(computed.read_text())["steal_share"] >= 0.09
    assert "not comparable" not in capsys.readouterr().out
