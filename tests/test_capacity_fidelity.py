"""``benchmarks/capacity_fidelity.py``: its scores worked by hand (Kendall's tau, regret, errors, the last line and
the targets), and its ``--smoke`` run on the real server — measured, saved, and evaluated again from the saved
measurements to the same last line."""

from __future__ import annotations

import importlib.util
import json
import lzma
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
FIGURE = r"([0-9.]+|n/a)"
TAU = r"(-?[0-9.]+|n/a)"
LAST_LINE = re.compile(rf"^capacity error: median {FIGURE} %, worst {FIGURE} %; ranking tau {TAU}; regret {FIGURE} % "
                       rf"\(baseline: median {FIGURE} %, worst {FIGURE} %, tau {TAU}, regret {FIGURE} %\)$")


def _benchmark(name: str = "capacity_scores"):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _row(name: str, measured: float, full: float, baseline: float, group: str = "grid", held_out: str = "") -> dict:
    return {"name": name, "group": group, "held_out": held_out, "measured": {"rps": measured},
            "full": {"rps": full, "error": full / measured - 1}, "baseline": {"rps": baseline,
                                                                            "error": baseline / measured - 1}}


def test_scores_worked_by_hand():
    bench = _benchmark()
    rows = [_row("a", 100, 104, 150), _row("b", 200, 190, 160), _row("c", 300, 330, 155, held_out="new"),
            _row("mix", 50, 40, 90, group="mix", held_out="new")]
    found = bench.scores(rows)
    full, base = found["full"], found["baseline"]
    assert full["errors"] == {"median": pytest.approx(0.075), "worst": pytest.approx(0.2), "rows": 4}
    assert full["held_out_errors"]["rows"] == 2 and full["held_out_errors"]["worst"] == pytest.approx(0.2)
    # the grid: full orders a < b < c as measured (tau 1) and picks c, the best; the baseline orders a, c, b and
    # picks b's 160 over c's 155 (tau 1/3) and loses a third of the best capacity
    assert full["grid_ranking"] == {"tau": pytest.approx(1.0), "regret": pytest.approx(0.0), "pick": "c",
                                    "best": "c"}
    assert base["grid_ranking"]["tau"] == pytest.approx(1 / 3) and base["grid_ranking"]["pick"] == "b"
    assert base["grid_ranking"]["regret"] == pytest.approx(1 / 3)
    assert full["ranking"]["tau"] == pytest.approx(1.0)  # all four: mix's 40 is the lowest, as measured
    line = bench.last_line(found)
    assert LAST_LINE.match(line)
    assert line == ("capacity error: median 7.5 %, worst 20.0 %; ranking tau 1.00; regret 0.0 % (baseline: median "
                    "49.2 %, worst 80.0 %, tau 0.33, regret 33.3 %)")
    assert bench.verdicts(found) == {"median": False, "worst": False, "regret": True, "tau": True}


def test_coverage_and_width_of_the_intervals_worked_by_hand():
    """Three rows: the measured capacity inside its interval (half-width 10 %), outside (20 %), and capped at the
    ladder's top with the interval open above it (as wide as can be); repeat spreads 8 and 12 % (one row has none)."""
    bench = _benchmark()
    rows = [_row("a", 100, 104, 150), _row("b", 250, 190, 160), _row("c", 400, 330, 155)]
    spreads = [0.08, 0.12, None]
    for row, spread, (low, high) in zip(rows, spreads, [(90.0, 110.0), (160.0, 240.0), (350.0, math.inf)]):
        row["measured"]["spread"] = spread
        row["full"]["interval"] = bench.interval_figures(low, high, row["measured"])
    assert [r["full"]["interval"]["covered"] for r in rows] == [True, False, True]
    assert rows[1]["full"]["interval"]["half_width"] == pytest.approx(0.2)
    assert rows[2]["full"]["interval"] == {"low_rps": 350.0, "high_rps": None, "open_above": True, "covered": True,
                                           "half_width": None}
    rows[0]["full"]["interval"]["extrapolated"] = True  # its low end lowered to the profile's busiest run
    cover = bench.coverage(rows)
    assert cover == {"rows": 3, "covered": 2, "coverage": pytest.approx(2 / 3), "half_width": pytest.approx(0.2),
                     "spread": pytest.approx(0.10),  # the median of 10 %, 20 % and the open row's infinity
                     "extrapolated": 1, "extrapolated_covered": 1}
    assert bench.interval_text(rows[0]["full"]["interval"]) == "90.0..110.0* in"
    met = bench.verdicts(bench.scores(rows))
    assert met["coverage"] is False and met["width"] is False  # 67 % < 85 %; 20 % > 1.5 x 10 %
    assert bench.interval_figures(None, math.inf, rows[0]["measured"])["covered"] is False
    assert bench.interval_text(rows[2]["full"]["interval"]) == "350.0.. in"


def test_no_ranking_from_a_single_row_or_nothing_measured():
    bench = _benchmark()
    assert bench.ranking([_row("a", 100, 104, 150)], "full") == {"tau": None, "regret": None}
    nothing = [{**_row("a", 1, 1, 1), "measured": {"rps": 0.0}}, {**_row("b", 1, 1, 1), "measured": {"rps": 0.0}}]
    assert bench.ranking(nothing, "full") == {"tau": None, "regret": None}


def test_data_that_is_not_saved_measurements_is_one_line_and_exit_2(tmp_path):
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"mode": "full", "cases": []}))
    run = subprocess.run([sys.executable, str(BENCHMARKS / "capacity_fidelity.py"), "--data", str(wrong), "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        f"error: {wrong}: profile: missing; expected the measurements capacity_fidelity.py saves (its _data JSON)"]
    assert not list(tmp_path.glob("capacity_fidelity_*"))


@pytest.mark.server
@pytest.mark.slow
def test_smoke_run_measures_saves_and_evaluates_again(tmp_path):
    script = str(BENCHMARKS / "capacity_fidelity.py")
    run = subprocess.run([sys.executable, script, "--smoke", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    last = run.stdout.strip().splitlines()[-1]
    assert LAST_LINE.match(last), last
    (data,) = tmp_path.glob("capacity_fidelity_smoke_data_*.json.xz")
    (result,) = tmp_path.glob("capacity_fidelity_smoke_2*.json")
    rows = json.loads(result.read_text())["rows"]
    assert [r["name"] for r in rows] == ["tiny_cnn 1x mb1 d0", "tiny_cnn 2x mb8 d2"]
    assert [bool(r["held_out"]) for r in rows] == [False, True]
    for r in rows:
        assert r["measured"]["probes"] >= 2 and r["full"]["probes"] >= 2
        assert {"rps", "rung_rps", "spread"} <= set(r["measured"])
        assert {"low_rps", "high_rps", "open_above", "covered", "half_width"} <= set(r["full"]["interval"])
    with lzma.open(data) as f:
        saved = json.load(f)
    for case in saved["cases"]:  # each replay says whether its sender kept the schedule
        assert all(0.0 <= p["late_share"] <= 1.0 and p["late_p99_s"] >= -1e-3 for p in case["probes"])
    again = subprocess.run([sys.executable, script, "--data", str(data), "--out", str(tmp_path)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1] == last  # the real bisection replayed, the simulated one rerun
