"""Intervals of predicted figures (``sim/intervals.py``, ``sim/host_speed.py``, ``tune/intervals.py``, the host's
run-to-run spread in ``calibrate.estimators``): their coverage of a synthetic truth on the real simulator, and where
they appear (``simulate``, ``validate``, ``tune``, the report)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from serving_bench.calibrate.estimators import host_spread, round_speed
from serving_bench.cli import main as cli_main
from serving_bench.errors import InputError
from serving_bench.load.profile import LoadProfile, build_schedule
from serving_bench.profiles.schema import HostSpread, Profile
from serving_bench.run.metrics import summarize
from serving_bench.run.target import ClosedLoop
from serving_bench.serving_config import ModelServing, ServingConfig
from serving_bench.sim.host_speed import at_host_speed
from serving_bench.sim.intervals import Replications, replicate, summary_intervals
from serving_bench.sim.target import SimTarget
from serving_bench.tune.capacity import Ladder, Probe, bisect_capacity
from serving_bench.tune.run import TuneOptions, run_tune
from serving_bench.tune.intervals import CapacityQuestion, capacity_interval, ceiling_scale, climb, crossing
from serving_bench.tune.load import Load
from tune_fixtures import profile_json, write_load, write_profile

ONE = ServingConfig((ModelServing("m", instances=(("cpu", 1),)),))


def noisy_profile(path, spread: HostSpread | None = None):
    """One model, one instance: a service of 4 ms at the median with a log-normal spread (sigma 0.5), so a run has a
    finite sample of its own; ``spread`` as its measured host spread."""
    data = profile_json({"m": (4.0, 0.0, 1)})
    draws = np.random.default_rng(5).lognormal(0.0, 0.5, 400) * 0.004
    data["models"]["m"]["devices"]["cpu"]["batches"] = {"1": {"samples_s": draws.tolist()}}
    if spread is not None:
        data["host_spread"] = spread.to_json()
    path.write_text(json.dumps(data))
    return Profile.load(path)


def test_a_slower_host_takes_every_time_longer_and_serves_less(tmp_path):
    profile = noisy_profile(tmp_path / "p.json")
    base = SimTarget(profile, ONE).spec
    slow = at_host_speed(base, 1.25)
    assert np.allclose(slow.models[0].instance_tables[0, 1], 1.25 * base.models[0].instance_tables[0, 1])
    assert at_host_speed(base, 1.0) is base and base.models[0].instance_tables[0, 1, 5] != slow.models[0].instance_tables[0, 1, 5]
    schedule = build_schedule(LoadProfile.load(write_load(tmp_path / "l.yaml", {"m": 2000}, {}, duration_s=2.0)))
    latency = []
    for speed in (1.0, 1.25):
        table = SimTarget(profile, ONE, seed=1, host_speed=speed).run(schedule, ClosedLoop(1, 1.0)).table
        latency.append((table["done_s"] - table["sent_s"]).to_numpy())
    n = len(latency[1])
    assert 150 < n < len(latency[0]) and np.allclose(latency[1], 1.25 * latency[0][:n])  # the same draws, 25 % longer
    with pytest.raises(ValueError):
        at_host_speed(base, 0.0)


def test_replications_are_seeded_and_their_host_draws_stratified():
    reps = Replications(40, 0.9, 0.1, seed=3)
    assert reps.draws == Replications(40, 0.9, 0.1, seed=3).draws != Replications(40, 0.9, 0.1, seed=4).draws
    z = np.log([d.host_speed for d in reps.draws]) / 0.1
    slices = np.sort(np.floor(40 * 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))))
    assert list(slices) == list(range(40))  # one draw in each fortieth of the normal
    assert len({d.seed for d in reps.draws}) == 40
    # a 90 % interval over 40 values: ranks 0.05 * 41 and 0.95 * 41 (a new value falls between with chance 0.9)
    assert reps.interval(range(40)) == pytest.approx((1.05, 37.95))
    assert reps.upper([*range(39), None]) == pytest.approx(37.95) and math.isinf(reps.upper([None] * 3 + [1.0]))


def test_intervals_cover_a_synthetic_truth_and_not_without_the_host_term(tmp_path):
    """The truth: 150 runs of the same schedule (as ``validate`` replays one), each on a host whose speed is drawn
    anew (log-normal, sigma 0.1) and with its own finite sample (another simulator seed). The prediction: 90 %
    intervals of p50 and p99 over 40 replications, six prediction seeds. Their coverage of the truth's runs averages
    0.90 with a standard deviation of about 0.02 (each interval's own coverage varies by sqrt(0.9 x 0.1 / 42) =
    0.046 from the randomness of its ends, over 6 seeds and two correlated figures ~0.016; the binomial part over
    900 pairs 0.01), so within 0.06 is three of them. Built without the host term the intervals cover only the
    finite sample's part: 0.48-0.72 over the seeds tried, asserted below 0.8."""
    profile = noisy_profile(tmp_path / "p.json")
    schedule = build_schedule(LoadProfile.load(write_load(tmp_path / "l.yaml", {"m": 150}, {}, duration_s=4.0)))
    rng = np.random.default_rng([1, 99])
    truth = []
    for t in range(150):
        run = SimTarget(profile, ONE, seed=10**6 + t, host_speed=float(np.exp(0.1 * rng.standard_normal())))
        figures = summarize(run.run(schedule))["models"]["m"]
        truth.append((figures["p50_s"], figures["p99_s"]))
    truth = np.array(truth)

    def coverage(sigma: float, seeds) -> float:
        shares = []
        for seed in seeds:
            reps = Replications(40, 0.9, sigma, seed=seed)
            found = summary_intervals(replicate(profile, ONE, lambda _draw: schedule, reps), reps)["m"]
            for column, key in enumerate(("p50_s", "p99_s")):
                low, high = found[key]
                shares.append(np.mean((truth[:, column] >= low) & (truth[:, column] <= high)))
        return float(np.mean(shares))

    assert abs(coverage(0.1, range(100, 106)) - 0.9) < 0.06
    assert coverage(0.0, range(100, 103)) < 0.8


def test_the_host_spread_is_the_rounds_spread_beyond_their_finite_samples(tmp_path):
    """Twelve closed loops of one second, three rounds each, simulated on hosts whose speed is drawn per round: with
    no host spread the rounds still differ by their finite samples (the plain pooled deviation is ~0.03) and the
    estimate, less the batch-means variance of each round, falls well below it (without the correction it would be
    it); with a spread of 0.08 it is near 0.08 (24 degrees of freedom: a standard error of about 0.012)."""
    profile = noisy_profile(tmp_path / "p.json")
    schedule = build_schedule(LoadProfile.load(write_load(tmp_path / "l.yaml", {"m": 1000}, {}, duration_s=2.0)))

    def estimate(sigma: float) -> tuple[HostSpread, float]:
        rng, runs = np.random.default_rng([0, 7]), []
        for point in range(12):
            rounds = []
            for r in range(3):
                speed = float(np.exp(sigma * rng.standard_normal()))
                table = SimTarget(profile, ONE, seed=10 * point + r, host_speed=speed).run(
                    schedule, ClosedLoop(2, 1.0)).table
                rounds.append(round_speed({"m": table.loc[table["status"].astype(str) == "ok", "done_s"].to_numpy()}))
            runs.append(rounds)
        plain = math.sqrt(sum(np.var([y for y, _ in r], ddof=1) * 2 for r in runs) / 24)
        return host_spread(runs), plain

    quiet, plain = estimate(0.0)
    assert (quiet.df, quiet.runs) == (24, 12) and quiet.sigma < 0.6 * plain and plain > 0.02
    noisy, _ = estimate(0.08)
    assert 0.055 < noisy.sigma < 0.105
    assert host_spread([[(0.0, 0.0)]]) is None and round_speed({"m": np.arange(10.0)}) is None


def test_a_profiles_host_spread_round_trips_and_is_checked(tmp_path):
    profile = noisy_profile(tmp_path / "p.json", HostSpread(0.031, 14, 7))
    assert profile.host_spread == HostSpread(0.031, 14, 7)
    profile.save(tmp_path / "again.json")
    assert Profile.load(tmp_path / "again.json").host_spread == profile.host_spread
    data = json.loads((tmp_path / "p.json").read_text())
    data["host_spread"] = {"sigma": -1, "df": 3, "runs": 2}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"bad.json: host_spread.sigma: expected a finite number >= 0"):
        Profile.load(tmp_path / "bad.json")


def test_simulate_prints_and_saves_each_models_intervals(tmp_path, capsys):
    noisy_profile(tmp_path / "p.json", HostSpread(0.05, 10, 5))
    load = write_load(tmp_path / "l.yaml", {"m": 150}, {}, duration_s=4.0)
    base = ["simulate", str(load), "--profile", str(tmp_path / "p.json")]
    assert cli_main(base + ["--out", str(tmp_path / "plain"), "--replications", "0"]) == 0
    assert cli_main(base + ["--out", str(tmp_path / "ivl"), "--replications", "20"]) == 0
    out = capsys.readouterr().out
    assert "90% intervals over 20 replications (each its own realisation of the load; host spread 5.0 %" in out
    plain, found = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("plain", "ivl"))
    assert "replications" not in plain and found["replications"]["host_spread"] == 0.05
    model, point = found["models"]["m"], plain["models"]["m"]
    assert model["p99_s"] == point["p99_s"]  # the point figure stays the --seed run's
    for key in ("p50_s", "p90_s", "p99_s", "throughput_rps"):
        low, high = model["intervals"][key]
        assert low < high
    assert model["intervals"]["p50_s"][0] < point["p50_s"] < model["intervals"]["p50_s"][1]
    assert cli_main(base + ["--out", str(tmp_path / "bad"), "--confidence", "90"]) == 2
    assert "--confidence: expected a share between 0 and 1" in capsys.readouterr().err


def test_validate_shows_the_predicted_interval_and_the_coverage(tmp_path, capsys):
    """The measured side is a run of the simulator on a host 8 % slower (written as a replay): with the host spread
    stated the intervals hold its figures; without it (the finite sample's only) they miss the latencies."""
    from serving_bench.export.sleep import write_sleep_entry
    from serving_bench.run.results import write_results

    repo = tmp_path / "repo"
    write_sleep_entry(repo, "m", base_ms=4.0, per_item_ms=0.0, max_batch_size=0)
    noisy_profile(tmp_path / "p.json")
    load = write_load(tmp_path / "l.yaml", {"m": 150}, {}, duration_s=4.0)
    schedule = build_schedule(LoadProfile.load(load))
    profile = Profile.load(tmp_path / "p.json")
    write_results(tmp_path / "replay", SimTarget(profile, ONE, seed=77, host_speed=1.08).run(schedule), schedule)
    argv = ["validate", str(load), "--profile", str(tmp_path / "p.json"), "--repo", str(repo), "--replay",
            str(tmp_path / "replay"), "--replications", "30"]
    assert cli_main(argv + ["--out", str(tmp_path / "v"), "--host-spread", "0.1"]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "v" / "validation.json").read_text())
    rows = {r["metric"]: r for r in doc["rows"]}
    assert all(rows[m]["inside"] for m in ("p50", "p90", "p99")) and rows["mean batch"]["inside"] is None
    assert rows["p50"]["predicted_low"] < rows["p50"]["measured"] < rows["p50"]["predicted_high"]
    assert 0 < rows["p50"]["measured_spread"] < 0.2
    cov = doc["coverage"]
    assert (cov["rows"], cov["confidence"], cov["metrics"]) == (4, 0.9, ["p50", "p90", "p99", "throughput"])
    assert cov["inside"] >= 3 and cov["median_half_width"] > 0 and cov["width_ratio"] > 0
    assert "predicted 90%" in out and " in  " in out and f"coverage: {cov['inside']} of 4 measured figures" in out
    assert cli_main(argv + ["--out", str(tmp_path / "v0"), "--host-spread", "0"]) == 0
    narrow = json.loads((tmp_path / "v0" / "validation.json").read_text())
    assert not {r["metric"]: r for r in narrow["rows"]}["p50"]["inside"]  # 8 % slower: outside the finite sample's
    assert narrow["coverage"]["median_half_width"] < cov["median_half_width"]


def test_climb_finds_what_bisection_finds_from_any_start():
    ladder = Ladder(max_scale=16)
    for limit in (0.5, 1.0, 1.3, 3.0, 9.9, 100.0):
        expected = bisect_capacity(lambda s, _a: Probe(s, s <= limit + 1e-12, s / limit), ladder)
        for start in (-3, 0, 5, 13, 40):
            capacity, capped, probes = climb(lambda r: ladder.scale(r) <= limit + 1e-12, ladder, start)
            assert (capacity, capped) == (pytest.approx(expected.capacity_scale), expected.capped)
            assert probes <= 2 * math.ceil(math.log2(ladder.i_max + 2)) + 2


def test_a_capacity_interval_widens_with_the_host_spread(tmp_path):
    """The API a benchmark calls: each replication its own realisation, seed and host speed; an interval over them
    that contains the point capacity and widens when the host varies."""
    profile = noisy_profile(tmp_path / "p.json")
    schedule = build_schedule(LoadProfile.load(write_load(tmp_path / "l.yaml", {"m": 40}, {}, duration_s=5.0)))
    question = CapacityQuestion(profile, ONE, Load(schedule, growth="scale"), {"m": {"p99": 0.03}}, Ladder())
    still = capacity_interval(question, Replications(20, 0.9, 0.0, seed=1), start_scale=4.0)
    moving = capacity_interval(question, Replications(20, 0.9, 0.15, seed=1), start_scale=4.0)
    assert len(still.capacities) == 20 and still.growth == "scale" and still.probes < 20 * 6
    assert still.low <= still.high and moving.high / moving.low > still.high / still.low
    assert json.loads(json.dumps(moving.to_json()))["replications"] == 20
    replayed = capacity_interval(dataclasses.replace(question, same_load=True), Replications(20, 0.9, 0.0, seed=1),
                                 start_scale=4.0)
    assert replayed.capacities != still.capacities  # the one schedule: only the seeds vary


def test_a_capacity_interval_beyond_the_profiles_busiest_run_reaches_down_to_it(tmp_path):
    """The profile's busiest calibration run answered 80 model requests a second; the load offers 40 at scale 1,
    so the ceiling is scale 2. A capacity predicted at 2.6-4 (an instance of 4 ms at the median, p99 <= 30 ms) is an
    extrapolation: the interval's low ends come down to 2 and it says so. A profile that saw 4,000 a second is left
    as it was; an ensemble's request counts once per step."""
    profile = noisy_profile(tmp_path / "p.json")
    schedule = build_schedule(LoadProfile.load(write_load(tmp_path / "l.yaml", {"m": 40}, {}, duration_s=5.0)))
    question = CapacityQuestion(profile, ONE, Load(schedule, growth="scale"), {"m": {"p99": 0.03}}, Ladder())
    replications = Replications(20, 0.9, 0.0, seed=1)
    plain = capacity_interval(question, replications, start_scale=4.0)
    assert plain.ceiling is None and not plain.extrapolated and plain.low > 2.0  # no calibration run: as it was

    def with_ceiling(rps: float) -> CapacityQuestion:
        run = {"device": "cpu", "clients": {"m": 2}, "measured_rps": {"m": rps / 2, "other": rps / 2}}
        return dataclasses.replace(question, profile=dataclasses.replace(profile, calibration=(run,)))

    low_ceiling = with_ceiling(80.0)
    beyond = capacity_interval(low_ceiling, replications, start_scale=4.0)
    assert beyond.ceiling == pytest.approx(2.0, rel=0.05) and beyond.extrapolated
    assert beyond.low == beyond.ceiling and beyond.crossing_low == beyond.ceiling
    assert (beyond.high, beyond.crossing_high, beyond.capacities) == (plain.high, plain.crossing_high,
                                                                      plain.capacities)
    assert json.loads(json.dumps(beyond.to_json()))["extrapolated"] is True
    within = capacity_interval(with_ceiling(4000.0), replications, start_scale=4.0)
    assert not within.extrapolated and (within.low, within.crossing_low) == (plain.low, plain.crossing_low)
    ensemble = dataclasses.replace(ONE, ensembles=(("m", ("a", "b", "c")),))
    assert ceiling_scale(dataclasses.replace(low_ceiling, config=ensemble)) == pytest.approx(beyond.ceiling / 3)


def test_tune_confidence_picks_a_more_conservative_capacity_on_a_noisy_profile(tmp_path):
    """On a profile whose host varies (spread 0.1) ``tune --confidence 0.9`` judges each probe at the 95th percentile
    over 16 replications of the p99, and finds a lower capacity than the one simulation a probe of the default; the
    default's own result carries the pick's interval over replicated searches."""
    write_profile(tmp_path / "p.json", {"m": (4.0, 1.0, 8)})
    data = json.loads((tmp_path / "p.json").read_text())
    data["host_spread"] = {"sigma": 0.1, "df": 20, "runs": 10}
    (tmp_path / "p.json").write_text(json.dumps(data))
    load = write_load(tmp_path / "l.yaml", {"m": 150}, {"m": 40}, duration_s=4.0)
    common = dict(load=str(load), profile=str(tmp_path / "p.json"), instances=(2,), max_batch_sizes=(1, 8),
                  queue_delays_us=(0,), verify_top=0, quiet=True, report=False, replications=16)
    plain = run_tune(TuneOptions(out=str(tmp_path / "plain"), **common))
    sure = run_tune(TuneOptions(out=str(tmp_path / "sure"), confidence=0.9, **common))
    point, judged = plain["best"]["result"], sure["best"]["result"]
    assert judged["capacity_scale"] < point["capacity_scale"]
    assert "judged_at" not in point and judged["judged_at"] == {"confidence": 0.9, "replications": 16,
                                                                "host_spread": 0.1}
    found = point["capacity_interval"]
    assert len(found["capacities"]) == 16 and found["low_scale"] <= found["high_scale"]
    assert any(line.startswith("Its capacity's 90% interval") for line in plain["recommendation"])
    assert any("judged at the upper end" in line for line in sure["recommendation"])
    assert sure["confidence"] == 0.9 and plain["intervals"]["host_spread"] == 0.1
    with pytest.raises(InputError, match="--confidence"):
        run_tune(TuneOptions(out=str(tmp_path / "none"), **dict(common, replications=0), confidence=0.9))


def test_tune_says_where_the_picks_capacity_interval_is_an_extrapolation(tmp_path):
    """A profile whose busiest calibration run answered 100 requests a second, a load of 150 at scale 1: the pick's
    interval (above 1x) reaches above the ceiling, comes down to 100 req/s, and the recommendation says why."""
    write_profile(tmp_path / "p.json", {"m": (4.0, 1.0, 8)})
    data = json.loads((tmp_path / "p.json").read_text())
    data["calibration"] = [{"device": "cpu", "clients": {"m": 2}, "measured_rps": {"m": 100.0}}]
    (tmp_path / "p.json").write_text(json.dumps(data))
    load = write_load(tmp_path / "l.yaml", {"m": 150}, {"m": 40}, duration_s=4.0)
    found = run_tune(TuneOptions(load=str(load), profile=str(tmp_path / "p.json"), out=str(tmp_path / "t"),
                                 instances=(2,), max_batch_sizes=(8,), queue_delays_us=(0,), verify_top=0,
                                 quiet=True, report=False, replications=8))
    interval = found["best"]["result"]["capacity_interval"]
    assert interval["extrapolated"] and interval["ceiling_rps"] == pytest.approx(100.0, rel=0.02)
    assert interval["low_rps"] == pytest.approx(100.0, rel=0.02) and interval["low_rps"] < interval["high_rps"]
    assert any("above the busiest load the profile measured" in line for line in found["recommendation"])


@pytest.mark.server
@pytest.mark.parametrize("claimed, extra", [((2.0, 0.5), "interval-low"), ((14.0, 3.0), "interval-high")])
def test_a_verification_that_disagrees_replays_the_interval_end_on_triton(sleep_repo, tmp_path, claimed, extra):
    """The real sleep model takes 5 ms + 1 ms an item; a profile claiming 2 + 0.5 predicts a capacity about twice
    too high, one claiming 14 + 3 about twice too low. The replays at the capacity and one rung above disagree, so
    the pick is replayed once more at its interval's low end (one rung above its high end), on real Triton; the
    measured capacity lies outside the interval, and tune.json, the recommendation and the report say so."""
    from serving_bench.report.render import render

    profile = write_profile(tmp_path / "p.json", {"sleep_python": (*claimed, 8)})
    load = write_load(tmp_path / "load.yaml", {"sleep_python": 30}, {"sleep_python": 60}, duration_s=2.0)
    doc = run_tune(TuneOptions(load=str(load), profile=str(profile), out=str(tmp_path / "out"), repo=str(sleep_repo),
                               instances=(1,), max_batch_sizes=(1,), queue_delays_us=(0,), verify_top=1,
                               growth="scale", quiet=True, report=False, replications=8, host_spread=0.25))
    (row,) = doc["verification"]
    interval = doc["best"]["result"]["capacity_interval"]
    labels = [r["label"] for r in row["replays"]]
    assert labels[:-1] in (["load", "capacity", "above"], ["capacity", "above"]) and labels[-1] == extra
    end = interval["low_scale"] if extra == "interval-low" else Ladder().above(interval["high_scale"])
    last = row["replays"][-1]
    assert last["scale"] == pytest.approx(end) and last["slo_met"] is (extra == "interval-high")
    assert (tmp_path / "out" / "verify" / "rank1" / f"{extra}-{end:.2f}x" / "summary.json").is_file()
    check = row["capacity"]
    assert not check["agrees"] and check["interval"]["holds"] is False
    assert check["interval"]["low_scale"] == interval["low_scale"]
    assert "that is outside its 90% interval" in doc["recommendation"][-1]
    assert ": missed</td>" in render({"tune": doc})


def test_the_report_shows_the_intervals_and_the_coverage():
    from serving_bench.report.render import render

    row = {"source": "validate", "model": "m", "metric": "p99", "simulated": 0.020, "measured": 0.024,
           "rel_error": -0.17, "predicted_low": 0.018, "predicted_high": 0.026, "inside": True}
    coverage = {"source": "validate", "confidence": 0.9, "rows": 4, "inside": 3, "coverage": 0.75,
                "metrics": ["p50", "p99"], "median_half_width": 0.12, "median_half_width_vs_own": 0.1,
                "median_measured_spread": 0.08, "width_ratio": 1.25,
                "replications": {"count": 40, "host_spread": 0.03, "host_spread_source": "the profile's"}}
    result = {"feasible": True, "capacity_rps": 300.0, "capacity_scale": 2.0, "gpus": 0, "instances": 1,
              "capacity_interval": {"low_scale": 1.83, "high_scale": 2.18, "extrapolated": True}}
    page = render({"validation": [row], "coverage": [coverage],
                   "tune": {"top": [{"rank": 1, "result": result, "config": {}}], "intervals": {"confidence": 0.9}}})
    assert "predicted interval" in page and "18.00 – 26.00" in page and "measured inside" in page
    assert "coverage 3 of 4 measured figures (p50, p99) inside their predicted 90% interval (75%)" in page
    assert "90% interval (× load)" in page and "1.83 – 2.18 (extrapolated)" in page


def test_a_replications_capacity_is_placed_where_its_violation_crosses_one():
    """Inside the bracket log-linearly (violation 0.5 at rung 8, 2.0 at rung 9: the geometric middle); the bracket's
    middle where the failed rung's violation is not finite; the rung itself where there is no bracket."""
    ladder = Ladder(0.125, 8.0, 8)
    two, above = ladder.scale(8), ladder.scale(9)
    assert crossing(two, False, {8: 0.5, 9: 2.0}, ladder) == pytest.approx(math.sqrt(two * above))
    assert crossing(two, False, {8: 1.0, 9: 3.0}, ladder) == pytest.approx(two)  # met exactly at its bound
    quarter = math.exp(math.log(two) + 0.25 * math.log(above / two))  # log 0.5 -> log 8: a quarter of the way
    assert crossing(two, False, {8: 0.5, 9: 8.0}, ladder) == pytest.approx(quarter)
    assert crossing(two, False, {8: 0.5, 9: math.inf}, ladder) == pytest.approx(math.sqrt(two * above))
    assert crossing(ladder.scale(ladder.i_max), True, {}, ladder) == ladder.scale(ladder.i_max)
    assert crossing(0.0, False, {}, ladder) == 0.0
