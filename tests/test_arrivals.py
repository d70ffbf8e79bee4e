"""Arrival processes: generated statistics match their parameters within confidence bounds; seeds reproduce."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from serving_bench.errors import InputError
from serving_bench.load.arrivals import ARRIVALS, Gamma, Mmpp, Poisson, arrival_from_mapping
from serving_bench.load.fields import Where

W = Where("p.yaml", "arrival")


def _gaps(times):
    return np.diff(times)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_poisson_rate_and_exponential_gaps(seed):
    rate, duration = 200.0, 100.0
    t = Poisson(rate).times(duration, np.random.default_rng(seed))
    assert np.all(np.diff(t) >= 0) and t[0] >= 0 and t[-1] < duration
    # count ~ Poisson(rate*duration): within 4 standard deviations
    assert abs(len(t) - rate * duration) < 4 * np.sqrt(rate * duration)
    gaps = _gaps(t)
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 1e-3
    # counts in 1 s windows have index of dispersion ~1 (variance = mean)
    counts = np.histogram(t, bins=np.arange(0, duration + 1))[0]
    assert 0.75 < counts.var() / counts.mean() < 1.3


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_rate_and_cv(cv):
    rate, duration = 100.0, 600.0
    t = Gamma(rate, cv).times(duration, np.random.default_rng(3))
    gaps = _gaps(t)
    n = len(gaps)
    # mean gap within 4 standard errors of 1/rate; the sample CV within a bootstrap-free bound (shape >= 1/16)
    assert abs(gaps.mean() - 1 / rate) < 4 * (cv / rate) / np.sqrt(n)
    sample_cv = gaps.std() / gaps.mean()
    assert abs(sample_cv - cv) / cv < 0.06, sample_cv
    # and the gaps follow the gamma law itself (for cv 4 many gaps are below float64 resolution of the times: they
    # become simultaneous arrivals, so only the moments are checked there)
    shape = 1 / cv**2
    if cv <= 2:
        assert stats.kstest(gaps, "gamma", args=(shape, 0, 1 / (rate * shape))).pvalue > 1e-3


def test_mmpp_switching_and_rates():
    process = Mmpp(rates=(20.0, 500.0), switching=((0.0, 0.5), (2.0, 0.0)))
    np.testing.assert_allclose(process.stationary(), [0.8, 0.2], atol=1e-12)
    rng = np.random.default_rng(5)
    duration = 4000.0
    edges, states = process.path(duration, rng)
    sojourn = np.diff(edges)[:-1]  # the last sojourn is cut by the end of the run
    for state, mean in ((0, 2.0), (1, 0.5)):
        s = sojourn[states[:-1] == state]
        assert abs(s.mean() - mean) < 4 * mean / np.sqrt(len(s)), (state, s.mean(), len(s))
    time_in = np.array([np.diff(edges)[states == k].sum() for k in (0, 1)]) / duration
    np.testing.assert_allclose(time_in, [0.8, 0.2], atol=0.03)
    assert np.all(states[1:] != states[:-1])  # every recorded switch changes the state

    # arrivals: the rate inside each state matches that state's rate
    from serving_bench.load.arrivals import piecewise_poisson_times
    times = piecewise_poisson_times(edges, np.asarray(process.rates)[states], rng)
    which = states[np.searchsorted(edges, times, side="right") - 1]
    for k, r in enumerate(process.rates):
        observed = (which == k).sum() / np.diff(edges)[states == k].sum()
        assert abs(observed - r) < 4 * np.sqrt(r / np.diff(edges)[states == k].sum()), (k, observed)
    t = process.times(duration, np.random.default_rng(6))
    assert abs(len(t) / duration - process.expected_rate(duration)) / process.expected_rate(duration) < 0.05


@pytest.mark.parametrize("spec", [
    {"process": "constant", "rate": 50},
    {"process": "poisson", "rate": "3000/min"},
    {"process": "gamma", "rate": 50, "cv": 2},
    {"process": "mmpp", "rates": [10, 90], "switching": [[0, 1], [1, 0]]},
    {"process": "step", "rates": [10, 50, 90], "step_s": "20s"},
    {"process": "ramp", "start_rate": 10, "end_rate": 90},
    {"process": "diurnal", "mean_rate": 50, "amplitude": 0.8, "period_s": 30},
    {"process": "diurnal", "rates": [10, 90, 50], "minute_s": "2s"},
])
def test_every_process_is_seeded_and_meets_its_expected_rate(spec):
    process = arrival_from_mapping(spec, W)
    duration = 60.0
    a = process.times(duration, np.random.default_rng(11))
    b = process.times(duration, np.random.default_rng(11))
    c = process.times(duration, np.random.default_rng(12))
    assert np.array_equal(a, b)
    assert process.name == "constant" or not np.array_equal(a, c)
    assert np.all(np.diff(a) >= 0) and (len(a) == 0 or (a[0] >= 0 and a[-1] < duration))
    expected = process.expected_rate(duration) * duration
    assert abs(len(a) - expected) < 5 * np.sqrt(expected) + 2 + (0.15 * expected if process.name == "mmpp" else 0)


@pytest.mark.parametrize("spec", [
    {"process": "constant", "rate": 50, "phase_s": 0.3},
    {"process": "poisson", "rate": 50},
    {"process": "gamma", "rate": 50, "cv": 2},
    {"process": "mmpp", "rates": [10, 90], "switching": [[0, 1], [1, 0]]},
    {"process": "step", "rates": [10, 50, 90], "step_s": "20s"},
    {"process": "ramp", "start_rate": 10, "end_rate": 90, "ramp_s": 40},
    {"process": "diurnal", "mean_rate": 50, "amplitude": 0.8, "period_s": 30},
    {"process": "diurnal", "rates": [10, 90, 50], "minute_s": "2s"},
])
def test_a_scaled_process_sends_more_with_the_same_timing(spec):
    """``scaled(3)``: three times the expected rate; a process whose rate changes over time changes it at the same
    times (counts per part of the run tripled); gamma keeps its cv."""
    process = arrival_from_mapping(spec, W)
    fast = process.scaled(3.0)
    duration = 60.0
    assert fast.expected_rate(duration) == pytest.approx(3 * process.expected_rate(duration))
    slow_t = process.times(duration, np.random.default_rng(4))
    fast_t = fast.times(duration, np.random.default_rng(5))
    edges = np.linspace(0, duration, 5)
    slow_n, fast_n = np.histogram(slow_t, edges)[0], np.histogram(fast_t, edges)[0]
    # per quarter of the run, two independent draws: fast - 3 slow has sd 2 sqrt(3 n) for Poisson counts (3 sd
    # allowed), twice that for gamma gaps of cv 2; an MMPP's hidden chain differs between the draws too (30 % more)
    slack = 6 * np.sqrt(3 * slow_n + 1) * (2 if spec["process"] in ("gamma", "mmpp") else 1)
    assert np.all(np.abs(fast_n - 3 * slow_n) < slack + (0.3 * 3 * slow_n if spec["process"] == "mmpp" else 0))
    if spec["process"] == "gamma":
        gaps = np.diff(fast_t)
        assert fast.cv == 2 and abs(gaps.std() / gaps.mean() - 2) < 0.2


def test_step_and_ramp_follow_their_rates():
    step = arrival_from_mapping({"process": "step", "rates": [10, 200], "step_s": "50s"}, W)
    t = step.times(100.0, np.random.default_rng(0))
    first, second = (t < 50).sum() / 50, (t >= 50).sum() / 50
    assert abs(first - 10) < 4 * np.sqrt(10 / 50) and abs(second - 200) < 4 * np.sqrt(200 / 50)
    ramp = arrival_from_mapping({"process": "ramp", "start_rate": 0, "end_rate": 400}, W)
    t = ramp.times(100.0, np.random.default_rng(0))
    counts = np.histogram(t, bins=[0, 25, 50, 75, 100])[0] / 25
    np.testing.assert_allclose(counts, [50, 150, 250, 350], rtol=0.1)


@pytest.mark.parametrize("spec, message", [
    ({"process": "poison", "rate": 1}, "arrival.process: expected one of constant, poisson"),
    ({"rate": 1}, "arrival.process: missing"),
    ({"process": "gamma", "rate": 5}, "arrival.cv: missing"),
    ({"process": "poisson", "rate": 0}, "arrival.rate: expected a rate > 0"),
    ({"process": "poisson", "rate": "fast"}, "arrival.rate: expected a rate > 0"),
    ({"process": "poisson", "rate": 5, "burst": 2}, "arrival.burst: unknown field"),
    ({"process": "mmpp", "rates": [1, 2], "switching": [[0, 1]]}, "arrival.switching: expected a 2x2 matrix"),
    ({"process": "mmpp", "rates": [1, 2], "switching": [[0, 1], [0, 0]]}, "positive rate of leaving"),
    ({"process": "step", "rates": [1, -2], "step_s": 1}, "arrival.rates[1]: expected a rate >= 0"),
    ({"process": "diurnal", "minute_s": 1}, "either rates"),
    ({"process": "step", "rates": [1], "step_s": "5 parsecs"}, "arrival.step_s: expected a duration > 0"),
])
def test_bad_process_is_one_line_naming_file_and_field(spec, message):
    with pytest.raises(InputError) as err:
        arrival_from_mapping(spec, W)
    line = err.value.line()
    assert line.startswith("p.yaml: ") and message in line and "\n" not in line


def test_registry_names():
    assert {"constant", "poisson", "gamma", "mmpp", "diurnal", "step", "ramp", "trace"} <= set(ARRIVALS)
