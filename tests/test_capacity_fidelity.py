"""``benchmarks/capacity_fidelity.py``: its scores worked by hand (Kendall's tau, regret, errors, the last line and
the targets), and its ``--smoke`` run on the real server — measured, saved, and evaluated again from the saved
measurements to the same last line."""

from __future__ import annotations

import importlib.util
import json
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


def _benchmark():
    spec = importlib.util.spec_from_file_location("capacity_fidelity", BENCHMARKS / "capacity_fidelity.py")
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
        assert {"rps", "rung_rps", "spread", "interval"} <= set(r["measured"])
    again = subprocess.run([sys.executable, script, "--data", str(data), "--out", str(tmp_path)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1] == last  # the real bisection replayed, the simulated one rerun
