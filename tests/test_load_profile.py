"""Load profiles: validation errors (file, field, expectation), build_schedule determinism and meta."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from serving_bench.errors import InputError
from serving_bench.load.profile import LoadProfile, build_schedule
from serving_bench.run.schedule import Schedule

ROOT = Path(__file__).resolve().parents[1]
PROFILES = [ROOT / "load_profiles" / name for name in ("smoke.yaml", "bursty.yaml", "diurnal_sleep.yaml",
                                                      "ramp_step.yaml", "azure_hour.yaml", "trace_replay.yaml",
                                                      "demo.yaml", "demo_heavy.yaml")]

BASE = {"duration": "10s", "seed": 3, "warmup": "1s", "cooldown": 0.5,
        "arrival": {"process": "poisson", "rate": 200},
        "models": {"a": {"share": 1, "slo": {"p99": "20ms", "p50": "5ms"}},
                   "b": {"share": 3, "batch": {1: 1, 4: 1}, "samples": 8},
                   "c": {"rate": 30}}}


def _profile(tmp_path, data, name="p.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return LoadProfile.load(path)


@pytest.mark.parametrize("path", PROFILES, ids=[p.name for p in PROFILES])
def test_committed_profiles_build(path):
    schedule = build_schedule(LoadProfile.load(path))
    assert len(schedule) > 100 and schedule.meta["profile"] == str(path)


def test_smoke_profile_targets_the_small_models_and_the_ensemble():
    schedule = build_schedule(LoadProfile.load(ROOT / "load_profiles" / "smoke.yaml"))
    assert set(schedule.models) == {"tiny_cnn_onnxruntime", "tiny_mlp_torchscript", "tiny_ens", "sleep_python"}
    assert 15 <= schedule.duration_s <= 25 and schedule.meta["arrivals"]["shared"]["process"] == "poisson"


def test_same_seed_same_schedule_and_meta(tmp_path):
    profile = _profile(tmp_path, BASE)
    a, b = build_schedule(profile), build_schedule(profile)
    assert a.equals(b)
    assert a.equals(Schedule.load(a.save(tmp_path / "s.npz")))
    other = build_schedule(_profile(tmp_path, {**BASE, "seed": 4}, "q.yaml"))
    assert not np.array_equal(a.arrival_s[:50], other.arrival_s[:50])
    meta = a.meta
    assert meta["seed"] == 3 and meta["duration_s"] == 10.0 and meta["warmup_s"] == 1.0 and meta["cooldown_s"] == 0.5
    assert meta["slos"] == {"a": {"p99": 0.02, "p50": 0.005}}
    assert meta["profile"] == str(tmp_path / "p.yaml")
    assert meta["inputs"]["b"]["samples"] == 8 and a.sample[a.model == a.models.index("b")].max() < 8


def test_shares_batches_and_own_streams(tmp_path):
    schedule = build_schedule(_profile(tmp_path, {**BASE, "duration": 200}))
    counts = {m: int((schedule.model == k).sum()) for k, m in enumerate(schedule.models)}
    shared = counts["a"] + counts["b"]
    assert abs(shared - 200 * 200) < 4 * np.sqrt(200 * 200)
    assert counts["b"] / shared == pytest.approx(0.75, abs=0.01)
    assert abs(counts["c"] - 30 * 200) < 4 * np.sqrt(30 * 200)
    b = schedule.batch[schedule.model == schedule.models.index("b")]
    assert set(np.unique(b)) == {1, 4} and (b == 4).mean() == pytest.approx(0.5, abs=0.02)
    assert np.all(schedule.batch[schedule.model == schedule.models.index("a")] == 1)


def test_adding_a_model_keeps_the_other_streams(tmp_path):
    one = build_schedule(_profile(tmp_path, {"duration": 5, "models": {"c": {"rate": 30}}}, "one.yaml"))
    two = build_schedule(_profile(tmp_path, {"duration": 5, "models": {"c": {"rate": 30}, "d": {"rate": 50}}},
                                  "two.yaml"))
    np.testing.assert_array_equal(one.arrival_s, two.arrival_s[two.model == two.models.index("c")])


def test_trace_profile_uses_trace_models_and_batches(tmp_path):
    (tmp_path / "t.csv").write_text("timestamp_s,model,batch\n5,x,2\n5.5,y,1\n7,x,3\n")
    schedule = build_schedule(_profile(tmp_path, {"arrival": {"process": "trace", "path": "t.csv"},
                                                  "models": {"x": {"slo": {"p99": "1s"}}}}))
    assert schedule.duration_s == pytest.approx(2.0, abs=1e-6)
    assert list(schedule.model_names()) == ["x", "y", "x"] and list(schedule.batch) == [2, 1, 3]
    np.testing.assert_allclose(schedule.arrival_s, [0, 0.5, 2.0])


@pytest.mark.parametrize("change, where, expected", [
    ({"duration": None}, "duration", "missing"),
    ({"duration": "-3s"}, "duration", "expected a duration > 0"),
    ({"warmup": "9s", "cooldown": "2s"}, "warmup", "below the duration"),
    ({"seed": -1}, "seed", "expected an integer >= 0"),
    ({"speed": 2}, "speed", "unknown field"),
    ({"models": {}}, "models", "at least one model"),
    ({"models": {"a": {"share": 1, "rate": 5}}}, "models.a.rate", "give one of share, rate, arrival"),
    ({"models": {"a": {"share": -1}}}, "models.a.share", "expected a traffic weight > 0"),
    ({"models": {"a": {"slo": {"p97": "2ms"}}}}, "models.a.slo.p97", "expected one of p50, p90, p95, p99"),
    ({"models": {"a": {"slo": {"p99": "fast"}}}}, "models.a.slo.p99", "expected a duration > 0"),
    ({"models": {"a": {"batch": 0}}}, "models.a.batch", "expected a batch size >= 1"),
    ({"models": {"a": {"inputs": {"input": "x.npy"}}}}, "models.a.inputs.input", "no such file"),
    ({"models": {"a": {"shapes": {"ids": [0]}}}}, "models.a.shapes.ids[0]", "expected a dimension >= 1"),
    ({"models": {"../etc": {"share": 1}}}, "models.../etc", "not a safe model name"),
    ({"arrival": {"process": "gamma", "rate": 10}}, "arrival.cv", "missing"),
    ({"arrival": None, "models": {"a": {"share": 1}}}, "models.a.share", "needs a top-level 'arrival'"),
    ({"arrival": None, "models": {"a": {}}}, "models.a", "expected share, rate or arrival"),
])
def test_profile_errors_are_one_line_with_file_and_field(tmp_path, change, where, expected):
    data = dict(BASE)
    for key, value in change.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    with pytest.raises(InputError) as err:
        _profile(tmp_path, data)
    line = err.value.line()
    assert line.startswith(f"{tmp_path / 'p.yaml'}: {where}: ") and expected in line and "\n" not in line


def test_profile_that_is_not_yaml_or_not_a_mapping(tmp_path):
    (tmp_path / "bad.yaml").write_text("duration: [1,\n")
    with pytest.raises(InputError, match=r"bad.yaml: line \d+: not valid YAML"):
        LoadProfile.load(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(InputError, match=r"list.yaml: \(top level\): expected a mapping"):
        LoadProfile.load(tmp_path / "list.yaml")
    with pytest.raises(InputError, match=r"nope.yaml: cannot read the profile"):
        LoadProfile.load(tmp_path / "nope.yaml")


@pytest.mark.parametrize("path", PROFILES, ids=[p.name for p in PROFILES])
def test_a_scaled_profile_sends_every_stream_faster(path):
    """``LoadProfile.scaled(f)``: every arrival process (shared, per model, traces) sends f times as much over the
    same run; the mix of models stays."""
    profile = LoadProfile.load(path)
    base, fast = build_schedule(profile), build_schedule(profile.scaled(2.5))
    assert fast.duration_s == base.duration_s and fast.arrival_s.max() < base.duration_s
    assert 2.5 * 0.85 < len(fast) / len(base) < 2.5 * 1.15
    for name in base.models:
        share, faster = np.mean(base.model_names() == name), np.mean(fast.model_names() == name)
        assert abs(faster - share) < 0.05 + 0.2 * share, name
    assert profile.scaled(1.0) == profile
    with pytest.raises(ValueError):
        profile.scaled(0.0)


def _window_dispersion(times: np.ndarray, duration_s: float, window_s: float) -> float:
    """Variance over mean of the arrival counts in consecutive windows (1 for Poisson)."""
    counts = np.histogram(times, bins=np.arange(0.0, duration_s + 1e-9, window_s))[0]
    return float(counts.var() / counts.mean())


def _gap_cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


@pytest.mark.parametrize("process", ["poisson", "gamma"])
def test_superposed_and_scaled_growth(tmp_path, process):
    """8x a load of 10 req/s over 600 s, by both growth rules. Poisson: both give Poisson at 80 req/s (same rate,
    exponential gaps, counts' dispersion 1, the gaps indistinguishable by a two-sample KS test). Gamma gaps of cv 2:
    ``scale`` keeps cv 2, and its counts in windows of w are the base's in windows of 8 w (the same users, sped up);
    ``superpose`` (8 independent copies) keeps the base's dispersion in windows of w, and its gaps grow closer to
    exponential. At w = one mean gap of the grown load, the dispersion was 2.0 (superpose) against 2.8 (scale) over
    five seeds, each within 0.1 of the base's figure it should equal; the gaps' cv 1.57-1.60 against 1.98-2.03."""
    from scipy import stats

    from serving_bench.tune.load import load_from_file

    arrival = {"process": "gamma", "rate": 10, "cv": 2} if process == "gamma" else {"process": "poisson", "rate": 10}
    path = tmp_path / "load.yaml"
    path.write_text(yaml.safe_dump({"duration": "600s", "seed": 5, "models": {"a": {"arrival": arrival}}}))
    superposed, scaled = (load_from_file(path, growth=g) for g in ("superpose", "scale"))
    base, wide, fast = superposed.base.arrival_s, superposed.at(8).arrival_s, scaled.at(8).arrival_s
    assert np.array_equal(scaled.at(8).arrival_s, fast) and scaled.at(8).meta["growth"] == "scale"
    window = 1 / 80
    rate_sd = np.sqrt((4 if process == "gamma" else 1) * 80 / 600)  # counts of a renewal process: variance cv² n
    for times in (wide, fast):
        assert abs(len(times) / 600 - 80) < 4 * rate_sd
    ks = stats.ks_2samp(np.diff(wide), np.diff(fast)).pvalue
    if process == "poisson":
        for times in (wide, fast):
            assert abs(_gap_cv(times) - 1) < 0.05 and abs(_window_dispersion(times, 600, window) - 1) < 0.1
        assert ks > 1e-3
        return
    assert abs(_gap_cv(fast) - 2) < 0.15 and _gap_cv(wide) < 1.75 and ks < 1e-6
    assert _window_dispersion(wide, 600, window) == pytest.approx(_window_dispersion(base, 600, window), abs=0.25)
    assert _window_dispersion(fast, 600, window) == pytest.approx(_window_dispersion(base, 600, 8 * window), abs=0.3)
    assert _window_dispersion(fast, 600, window) > _window_dispersion(wide, 600, window) + 0.5
