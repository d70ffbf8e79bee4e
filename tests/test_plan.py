"""serving-bench plan on a synthetic forecast: fewest devices per growth factor, checked against closed form."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from serving_bench.cli import main as cli_main
from serving_bench.errors import InputError
from serving_bench.sim.intervals import IntervalOptions
from serving_bench.tune.forecast import load_forecast
from serving_bench.tune.plan import run_plan
from tune_fixtures import write_load, write_profile

# One-core devices (no parallel speed-up): a device serves model a at most 16 / (2 + 0.25 * 16) ms = 2,667 req/s
# (batch 16) and model b at most 8 / (3 + 0.5 * 8) ms = 1,143 req/s.
RATES = {"a": 400, "b": 150}
PEAK = {"a": 16 / 6e-3, "b": 8 / 7e-3}
REPLICATIONS = IntervalOptions(replications=8, host_spread=0.05)  # the fixture's: few, on a host spread of 5 %
NONE = IntervalOptions(replications=0)


def write_forecast(d, **extra) -> str:
    write_profile(d / "profile.json", {"a": (2.0, 0.25, 16), "b": (3.0, 0.5, 8)}, cores=1)
    write_load(d / "load.yaml", RATES, {"a": 50, "b": 60}, duration_s=10.0)
    body = {"load": "load.yaml", "profile": "profile.json", "growth": [1, 2, 5, 10], "max_gpus": 32,
            "search": {"instances": [1], "max_batch_size": [1, 8, 16], "max_queue_delay_us": [0]}, "max_evals": 6}
    body.update(extra)
    (d / "forecast.yaml").write_text(json.dumps(body))  # JSON is YAML
    return str(d / "forecast.yaml")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    return run_plan(load_forecast(write_forecast(d)), d / "out", quiet=True, intervals=REPLICATIONS), d


def test_plan_meets_slos_with_no_fewer_devices_than_physics_allows(plan):
    doc, _ = plan
    rows = {r["growth"]: r for r in doc["rows"]}
    assert list(rows) == [1.0, 2.0, 5.0, 10.0]
    gpus = [rows[g]["gpus"] for g in rows]
    assert gpus == sorted(gpus) and gpus[0] == 1
    for g, row in rows.items():
        # any layout needs at least the device-seconds the traffic demands at each model's best batch size
        floor = math.ceil(sum(RATES[m] * g / PEAK[m] for m in RATES) - 1e-9)
        assert floor <= row["gpus"] <= 2 * floor + 1, (g, row["gpus"], floor)
        assert row["slo_met"] and row["headroom"] >= -1e-9 and 0 < row["utilisation"] <= 1 + 1e-9
        for group in row["groups"]:
            for model in group["models"]:
                assert group["per_gpu"][model]["p99_s"] <= {"a": 0.05, "b": 0.06}[model]
    assert rows[10.0]["gpus"] >= 3
    assert any("10× (" in line and " devices — " in line for line in doc["recommendation"])  # CPU devices here


def test_plan_resumes_from_its_group_checkpoints(plan, tmp_path):
    doc, d = plan
    again = run_plan(load_forecast(d / "forecast.yaml"), d / "out", quiet=True, intervals=NONE)
    assert [r["gpus"] for r in again["rows"]] == [r["gpus"] for r in doc["rows"]]
    assert all(g["evaluated"] >= 1 for g in again["groups"])


def test_each_planned_gpu_count_says_how_sure_it_is(plan):
    """Each planned group's capacity searched again in 8 replications (its own load, simulator seed and host speed):
    a row's GPUs carry the grown load in the share of them where every group's GPUs times its replicated capacity
    reach the growth; the capacity interval's ends need ceil(g / c) GPUs; the plan's GPUs were checked by
    simulation, so they carry it in most replications; the recommendation says so."""
    doc, _ = plan
    assert doc["replications"]["count"] == 8 and doc["replications"]["host_spread"] == 0.05
    found = {tuple(g["models"]): g["capacity_interval"] for g in doc["groups"] if g["capacity_interval"]}
    for row in doc["rows"]:
        g, groups = row["growth"], [(found[tuple(r["models"])], r["gpus"]) for r in row["groups"]]
        assert all(len(f["capacities"]) == 8 and f["low_scale"] <= f["high_scale"] for f, _ in groups)
        carried = [all(n * f["capacities"][i] >= g * (1 - 1e-9) for f, n in groups) for i in range(8)]
        assert row["sufficient_share"] == pytest.approx(sum(carried) / 8) and row["sufficient_share"] >= 0.5
        assert row["gpus_interval"] == [sum(math.ceil(g / f[end] - 1e-9) for f, _ in groups)
                                        for end in ("high_scale", "low_scale")]
        assert row["gpus_interval"][0] <= row["gpus"] <= row["gpus_interval"][1] + 1
        line = next(x for x in doc["recommendation"] if x.startswith(f"{g:g}× ("))
        assert f"{row['gpus']} device{'s carry' if row['gpus'] > 1 else ' carries'} it in " \
               f"{row['sufficient_share'] * 100:.0f} % of 8 replications" in line


def test_a_rows_gpus_across_the_interval_add_up_over_its_groups_and_a_zero_end_needs_no_count():
    """Two groups at growth 4: a's capacities 1 / 2 / 2 / 4 (interval 1-4), b's 0 / 1 / 2 / 2 (interval 0-2), planned
    2 GPUs each: carried where both reach 4, in the last two replications: half; a needs
    1-4 GPUs, b 2 to none; the row in all 3 to none, in words up to ∞."""
    from serving_bench.sim.intervals import Replications
    from serving_bench.tune.intervals import CapacityInterval
    from serving_bench.tune.plan import add_row_interval, row_interval_text

    def found(capacities):
        return CapacityInterval(min(capacities), max(capacities), tuple(capacities), (False,) * 4, 0.9, "superpose",
                                0.0, 0, 4)

    row = {"growth": 4.0, "gpus": 4, "unit": "GPU",
           "groups": [{"models": ["a"], "gpus": 2}, {"models": ["b"], "gpus": 2}]}
    add_row_interval(row, {("a",): found([1.0, 2.0, 2.0, 4.0]), ("b",): found([0.0, 1.0, 2.0, 2.0])})
    assert row["sufficient_share"] == 0.5
    assert [g["gpus_interval"] for g in row["groups"]] == [[1, 4], [2, None]] and row["gpus_interval"] == [3, None]
    assert row_interval_text(row, Replications(4, 0.9, 0.0, 0)).endswith(
        "4 GPUs carry it in 50 % of 4 replications; the capacity's 90 % interval needs 3–∞.")
    beyond = dict(row, groups=[dict(g) for g in row["groups"]])  # a's interval above its profile's busiest run
    add_row_interval(beyond, {("a",): dataclasses.replace(found([1.0, 2.0, 2.0, 4.0]), extrapolated=True),
                              ("b",): found([0.0, 1.0, 2.0, 2.0])})
    assert beyond["extrapolated"] and not row["extrapolated"]
    assert row_interval_text(beyond, Replications(4, 0.9, 0.0, 0)).endswith("above it the simulator extrapolates).")
    untouched = {"growth": 1.0, "gpus": 1, "unit": "GPU", "groups": [{"models": ["a"], "gpus": 1}]}
    add_row_interval(untouched, {("a",): None})  # a group that meets its SLOs at no scale: no interval
    assert "sufficient_share" not in untouched and row_interval_text(untouched, Replications(4, 0.9, 0.0, 0)) == ""


def test_plan_cli_writes_plan_and_report(plan, capsys):
    _, d = plan
    assert cli_main(["plan", str(d / "forecast.yaml"), "--out", str(d / "out"), "--replications", "2"]) == 0  # resumes
    out = capsys.readouterr().out
    assert "report:" in out and (d / "out" / "plan.json").is_file() and (d / "out" / "report.html").is_file()
    assert "carried in (of 2); 90 % interval" in (d / "out" / "report.html").read_text()


def test_a_screened_plan_needs_the_same_devices(plan, tmp_path):
    """Each group's search ranked on 40 % of its load's time, its best simulated on the whole load: the same plan,
    the same configurations, and capacities that are the whole load's."""
    doc, _ = plan
    screened = run_plan(load_forecast(write_forecast(tmp_path, screen=0.4)), tmp_path / "out", quiet=True,
                        intervals=NONE)
    assert [r["gpus"] for r in screened["rows"]] == [r["gpus"] for r in doc["rows"]]
    assert sorted(tmp_path.glob("out/groups/*.confirmed.jsonl"))
    pick = lambda d: [(g["models"], g["config"], g["capacity_scale"]) for g in d["groups"]]  # noqa: E731
    assert pick(screened) == pick(doc)


def test_a_plan_names_its_growth_rule_and_scale_agrees_for_poisson(plan, tmp_path, capsys):
    """``plan --growth scale`` (the same users sending more) on the fixture's Poisson load: named in plan.json, the
    recommendation and the report; Poisson load grown either way is Poisson at the grown rate, so the plan needs the
    same devices give or take one (capacities are known to a rung, from other draws)."""
    doc, d = plan
    assert doc["growth_rule"] == "superpose" and "grown by superpose" in doc["recommendation"][0]
    assert cli_main(["plan", str(d / "forecast.yaml"), "--growth", "scale", "--out", str(tmp_path / "out"),
                     "--replications", "0"]) == 0
    scaled = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert scaled["growth_rule"] == "scale" and "grown by scale (the same users sending more)" in \
        scaled["recommendation"][0]
    assert all(abs(a["gpus"] - b["gpus"]) <= 1 for a, b in zip(scaled["rows"], doc["rows"]))
    assert "grown by scale" in (tmp_path / "out" / "report.html").read_text()
    capsys.readouterr()


@pytest.mark.parametrize("change,field", [({"growth": []}, "growth"), ({"growth": [1, -2]}, "growth"),
                                          ({"grouping": "random"}, "grouping"), ({"load": "missing.yaml"}, "load"),
                                          ({"search": {"instances": [0]}}, "search.instances"),
                                          ({"slos": {"a": {"p99": "fast"}}}, "slos.a.p99"),
                                          ({"colour": "red"}, "colour"), ({"screen": 0}, "screen"),
                                          ({"screen": "half"}, "screen"), ({"growth_rule": "double"}, "growth_rule")])
def test_bad_forecast_is_one_line_naming_the_field(tmp_path, change, field):
    path = write_forecast(tmp_path, **change)
    with pytest.raises(InputError) as err:
        load_forecast(path)
    line = err.value.line()
    assert "\n" not in line and line.startswith(path) and f": {field}: " in line


def test_plan_for_an_h200_from_its_eager_mode_profile(tmp_path):
    """Hardware that is not here: the bundled H200 torch-eager table (engineer D's importer)."""
    (tmp_path / "load.yaml").write_text("name: h200\nduration: 2s\nseed: 5\nmodels:\n"
                                        "  resnet50_fp16: {rate: 3000, slo: {p99: 40ms}}\n")
    body = {"load": "load.yaml", "profile": "builtin:h200-eager", "growth": [1, 4], "max_gpus": 16,
            "search": {"instances": [1, 2], "max_batch_size": [8, 32], "max_queue_delay_us": [0]}, "max_evals": 4}
    (tmp_path / "forecast.yaml").write_text(json.dumps(body))
    doc = run_plan(load_forecast(tmp_path / "forecast.yaml"), tmp_path / "out", quiet=True, intervals=NONE)
    assert "NVIDIA H200" in doc["hardware"] and "eager mode" in doc["hardware"]
    assert "eager mode" in doc["recommendation"][0]
    one, four = doc["rows"]
    # resnet50 fp16 eager takes >= 4.2 ms per batch of up to 32 on one H200: at most ~7,600 img/s per GPU
    assert one["gpus"] >= 1 and four["gpus"] >= math.ceil(4 * 3000 / (32 / 4.2e-3))
    assert four["gpus"] >= one["gpus"] and all(r["slo_met"] for r in doc["rows"])
    assert all(g["config"]["resnet50_fp16"]["device"] == "gpu0" for g in four["groups"])
