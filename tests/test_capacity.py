"""Capacity by bisection (``tune/capacity.py``): the ladder's arithmetic on probes with a known answer, repeats of the
decisive steps, the replays that verify a capacity on Triton (``tune/verify.py``), and the simulator's capacity
against the M/D/1 closed form."""

from __future__ import annotations

import math

import pytest

from serving_bench.tune.capacity import Interpolated, Ladder, Probe, Repeats, bisect_capacity, interpolate
from serving_bench.tune.run import TuneOptions, run_tune
from serving_bench.tune.verify import (Replay, capacity_check, capacity_replays, interval_holds, interval_replay,
                                       measured_bracket)
from tune_fixtures import write_load, write_profile


def threshold(limit: float, log: list | None = None):
    """A probe that meets the SLOs up to ``limit`` (its violation: scale / limit)."""
    def probe(scale: float, attempt: int) -> Probe:
        if log is not None:
            log.append((scale, attempt))
        return Probe(scale, scale <= limit + 1e-12, scale / limit)
    return probe


@pytest.mark.parametrize("limit, ladder, rung, capped", [
    (3.0, Ladder(), 12, False),                      # 2**(12/8) = 2.83 <= 3 < 2**(13/8) = 3.08
    (1.0, Ladder(), 0, False),                       # exactly the load
    (100.0, Ladder(max_scale=16), 32, True),         # met at the top: at least 16x
    (0.5, Ladder(), None, False),                    # misses at 1x with nothing below: capacity 0
    (0.3, Ladder(min_scale=0.1), -14, False),        # below 1x (the planner): 2**(-14/8) = 0.30 <= 0.3
    (2.0, Ladder(steps_per_doubling=2), 2, False),   # a coarser ladder
])
def test_bisection_lands_on_the_rung_at_or_below_the_limit(limit, ladder, rung, capped):
    log: list = []
    found = bisect_capacity(threshold(limit, log), ladder)
    assert found.capacity_scale == (0.0 if rung is None else pytest.approx(ladder.scale(rung)))
    assert found.capped is capped
    assert log[0] == (1.0, 0) and len(log) == len(set(log)) == len(found.probes)
    assert len(log) <= 2 + math.ceil(math.log2(ladder.i_max - ladder.i_min + 2))  # rung 0, an end, then halving
    if found.met and found.failed:
        assert found.failed.rung == found.met.rung + 1 and found.decisive == (found.met, found.failed)
    assert found.failed is None if capped else found.failed.scale > limit
    assert [s.scale for s in found.steps] == sorted(s.scale for s in found.steps)


def test_ladder_rungs():
    ladder = Ladder(min_scale=0.5, max_scale=10, steps_per_doubling=8)
    assert (ladder.i_min, ladder.i_max) == (-8, 27) and ladder.scale(27) >= 10 > ladder.scale(26)
    assert ladder.rung(ladder.scale(13)) == 13 and ladder.rung(3.0) == 12
    assert ladder.above(ladder.scale(12)) == pytest.approx(ladder.scale(13))


def noisy(true_rung: int, lucky: dict[tuple[int, int], bool], ladder: Ladder):
    """A probe that meets the SLOs up to ``true_rung``, except where ``lucky[(rung, attempt)]`` says otherwise (a
    replay that happened to pass or fail)."""
    def probe(scale: float, attempt: int) -> Probe:
        rung = ladder.rung(scale * (1 + 1e-9))
        ok = lucky.get((rung, attempt), rung <= true_rung)
        return Probe(scale, ok, 0.9 if ok else 1.2, {"attempt": attempt})
    return probe


def test_repeats_judge_the_decisive_steps_by_their_rule():
    """The rung above the true capacity passes its first replay by luck: probed once, the bisection takes it; with
    three replays a step and a majority rule it is found to fail and the capacity is the true rung; under the rule
    ``all`` a single failed replay of the true rung moves the capacity one rung lower."""
    ladder = Ladder()
    lucky = {(13, 0): True}
    once = bisect_capacity(noisy(12, lucky, ladder), ladder)
    assert once.capacity_scale == pytest.approx(ladder.scale(13))
    thrice = bisect_capacity(noisy(12, lucky, ladder), ladder, Repeats(3, "majority"))
    assert thrice.capacity_scale == pytest.approx(ladder.scale(12))
    assert (thrice.met.rung, thrice.failed.rung) == (12, 13)
    for step in thrice.decisive:
        assert step.repeated and [p.detail["attempt"] for p in step.probes] == [0, 1, 2]
    assert [p.ok for p in thrice.failed.probes] == [True, False, False]
    assert thrice.failed.violation_range == (0.9, 1.2)
    assert all(len(s.probes) in (1, 3) for s in thrice.steps)
    strict = bisect_capacity(noisy(12, {(12, 2): False}, ladder), ladder, Repeats(3, "all"))
    assert strict.capacity_scale == pytest.approx(ladder.scale(11)) and strict.failed.rung == 12
    with pytest.raises(ValueError):
        Repeats(3, "median")


def power(limit: float, exponent: float = 3.0, noise: dict[int, float] | None = None):
    """A probe whose violation is ``(scale / limit) ** exponent`` (times ``noise[attempt]``): log-linear in the scale,
    so the interpolation finds ``limit`` exactly where the noise is 1."""
    def probe(scale: float, attempt: int) -> Probe:
        violation = (scale / limit) ** exponent * (noise or {}).get(attempt, 1.0)
        return Probe(scale, violation <= 1.0, violation)
    return probe


def test_interpolation_inside_the_bracket_finds_a_log_linear_crossing():
    ladder = Ladder()
    found = bisect_capacity(power(3.0), ladder)
    assert found.capacity_scale == pytest.approx(ladder.scale(12))  # the rung: 2.83, 6 % under
    inner = interpolate(found)
    assert inner.how == "interpolated" and inner.scale == pytest.approx(3.0) and inner.repeats == ()
    assert inner.spread is None


def test_each_repeat_pair_gives_its_own_crossing_and_the_spread_their_range():
    """Three replays a decisive step; the second replay of each runs 10 % hot (its violation 1.1 times the others'):
    the medians still cross at the limit, that pair crosses lower, by log(1.1) / slope."""
    ladder = Ladder()
    found = bisect_capacity(power(3.0, noise={1: 1.1}), ladder, Repeats(3, "majority"))
    inner = interpolate(found)
    assert inner.scale == pytest.approx(3.0)
    assert inner.repeats[0] == pytest.approx(3.0) and inner.repeats[2] == pytest.approx(3.0)
    assert inner.repeats[1] == pytest.approx(3.0 * 1.1 ** (-1 / 3))  # slope 3 in log-log
    assert inner.spread == pytest.approx((3.0 - 3.0 * 1.1 ** (-1 / 3)) / 3.0)


def test_repeats_that_disagree_still_give_a_spread():
    """Two replays a decisive step, both must meet; the second runs cool (its violation half the first's): at 3.08 the
    first misses and the second meets, so the medians do not cross inside the bracket [2.83, 3.08] and the capacity is
    its geometric middle. The pairs still give a spread on the medians' slope (3): the first pair crosses at the limit,
    the cool one far above, kept at one bracket's width over it (rung 14)."""
    ladder = Ladder()
    found = bisect_capacity(power(3.0, noise={1: 0.5}), ladder, Repeats(2, "all"))
    assert (found.met.rung, found.failed.rung) == (12, 13)
    inner = interpolate(found)
    assert inner.how == "midpoint" and inner.scale == pytest.approx(math.sqrt(ladder.scale(12) * ladder.scale(13)))
    assert inner.repeats[0] == pytest.approx(3.0)
    assert inner.repeats[1] == pytest.approx(ladder.scale(14))
    assert inner.spread == pytest.approx((ladder.scale(14) - inner.repeats[0]) / inner.scale)


def test_without_a_bracket_or_a_crossing_the_interpolation_says_so():
    ladder = Ladder(max_scale=4)
    capped = bisect_capacity(power(100.0), ladder)
    assert interpolate(capped) == Interpolated(capped.capacity_scale, (), "rung") and capped.capped
    zero = bisect_capacity(power(0.5), Ladder())
    assert interpolate(zero) == Interpolated(0.0, (), "rung")

    def failing_by_count(scale: float, attempt: int) -> Probe:  # a miss with no finite violation
        return Probe(scale, scale <= 2.0, 0.5 if scale <= 2.0 else math.inf)
    middle = interpolate(bisect_capacity(failing_by_count, ladder))
    assert middle.how == "midpoint" and middle.scale == pytest.approx(math.sqrt(2.0 * ladder.scale(9)))


def test_a_verification_replays_1x_the_capacity_and_one_rung_above():
    ladder = Ladder()
    c = ladder.scale(12)
    plan = capacity_replays({"capacity_scale": c, "capacity_capped": False}, ladder)
    assert plan == (Replay("load", 1.0), Replay("capacity", c), Replay("above", ladder.scale(13)))
    assert capacity_replays({"capacity_scale": 1.0, "capacity_capped": False}, ladder) == (
        Replay("capacity", 1.0), Replay("above", ladder.scale(1)))
    assert capacity_replays({"capacity_scale": 16.0, "capacity_capped": True}, ladder) == (
        Replay("load", 1.0), Replay("capacity", 16.0))
    assert capacity_replays({"capacity_scale": 0.0, "capacity_capped": False}, ladder) == (Replay("load", 1.0),)
    assert measured_bracket([(1.0, True), (c, True), (3.1, False)]) == (c, 3.1)
    assert measured_bracket([(1.0, True), (c, False), (3.1, True)]) == (1.0, c)  # the lowest miss bounds it
    assert measured_bracket([(1.0, False)]) == (None, 1.0)
    result = {"capacity_scale": c, "capacity_capped": False}
    check = capacity_check(result, list(zip(plan, (True, True, False))), "superpose")
    assert check["agrees"] and check["held_at_capacity"] and check["measured_met_scale"] == c
    check = capacity_check(result, list(zip(plan, (True, True, True))), "scale")
    assert not check["agrees"] and check["measured_failed_scale"] is None and check["growth"] == "scale"
    assert capacity_check({"capacity_scale": 0.0, "capacity_capped": False}, [(Replay("load", 1.0), False)],
                          "superpose")["agrees"]



def test_replays_that_disagree_check_the_capacity_interval_once_more():
    """A missed capacity sends one replay to the interval's low end, a met rung above one to the rung above its high
    end; the interval holds where the measured bracket lies inside it (at the ladder's resolution), is missed where
    outside, and is not settled between."""
    ladder = Ladder()
    c, low, high = ladder.scale(12), ladder.scale(10), ladder.scale(15)
    plan = capacity_replays({"capacity_scale": c, "capacity_capped": False}, ladder)
    result = {"capacity_scale": c, "capacity_capped": False,
              "capacity_interval": {"low_scale": low, "high_scale": high, "confidence": 0.9}}
    missed = list(zip(plan, (True, False, False)))
    at_low = interval_replay(result, missed, ladder)
    assert at_low == Replay("interval-low", low) and at_low.folder == f"interval-low-{low:.2f}x"
    met_above = list(zip(plan, (True, True, True)))
    at_top = interval_replay(result, met_above, ladder)
    assert at_top == Replay("interval-high", ladder.scale(16))
    assert interval_replay(result, list(zip(plan, (True, True, False))), ladder) is None  # as predicted
    assert interval_replay({"capacity_scale": c, "capacity_capped": False}, missed, ladder) is None  # no interval
    assert interval_replay(result, list(zip(plan, (False, False, False))), ladder) is None  # 1x missed: below it
    top_of_search = dict(result, capacity_interval=dict(result["capacity_interval"], high_scale=16.0))
    assert interval_replay(top_of_search, met_above, ladder) is None
    check = capacity_check(result, missed + [(at_low, True)], "superpose", ladder)
    assert (check["measured_met_scale"], check["measured_failed_scale"]) == (low, c)
    assert check["interval"] == {"low_scale": low, "high_scale": high, "confidence": 0.9, "holds": True}
    assert capacity_check(result, missed + [(at_low, False)], "superpose", ladder)["interval"]["holds"] is False
    assert capacity_check(result, met_above + [(at_top, False)], "superpose", ladder)["interval"]["holds"] is True
    assert capacity_check(result, met_above + [(at_top, True)], "superpose", ladder)["interval"]["holds"] is False
    assert "interval" not in capacity_check({"capacity_scale": c, "capacity_capped": False}, missed, "superpose")
    assert interval_holds(low, high, None, c, ladder) is None and interval_holds(low, high, c, None, ladder) is None
    # a low end of 0 (some replications missed at 1x) is never replayed, and holds a miss at 1x
    from_zero = dict(result, capacity_interval=dict(result["capacity_interval"], low_scale=0.0))
    assert interval_replay(from_zero, list(zip(plan, (False, False, False))), ladder) is None
    assert capacity_check(from_zero, list(zip(plan, (False, False, False))), "scale", ladder)["interval"]["holds"]

def md1_sojourn_cdf(x: float, lam: float, service_s: float) -> float:
    """P(sojourn <= x) in an M/D/1 FIFO queue: the wait's distribution (Erlang), ``(1 - rho) sum_{k <= t/D}
    exp(lam (t - kD)) (lam (kD - t))**k / k!`` at ``t = x - D``. The sum alternates: exact enough while lam t < 20."""
    t = x - service_s
    if t < 0:
        return 0.0
    assert lam * t < 20, "outside the sum's numerically safe range"
    terms = [math.exp(lam * (t - k * service_s)) * (lam * (k * service_s - t)) ** k / math.factorial(k)
             for k in range(int(t // service_s) + 1)]
    return (1 - lam * service_s) * math.fsum(terms)


def md1_capacity(bound_s: float, service_s: float, q: float = 0.99) -> float:
    """The arrival rate at which the M/D/1 sojourn time's ``q`` quantile equals ``bound_s`` (bisection)."""
    lo, hi = 0.0, 1.0 / service_s
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if md1_sojourn_cdf(bound_s, mid, service_s) >= q else (lo, mid)
    return lo


def md1_p99(lam: float, service_s: float) -> float:
    lo, hi = service_s, 0.25
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if md1_sojourn_cdf(mid, lam, service_s) >= 0.99 else (mid, hi)
    return hi


@pytest.mark.parametrize("bound_ms, rate", [(100, 20.0), (50, 14.5)])
def test_the_simulators_capacity_is_the_md1_closed_form(tmp_path, bound_ms, rate):
    """One instance, max batch 1, a constant 10 ms service, Poisson arrivals at ``rate``: an M/D/1 queue, whose p99
    sojourn reaches the bound at the rate lambda* of the closed form. ``tune`` must find the ladder rung at or below
    lambda* / rate, exactly.

    Why no rung of slack: in both cases lambda* / rate lies 0.61 of a rung (of 9 %) above the rung below it and 0.39
    below the next (checked below). Over 10 seeds of this 3,000 s schedule (170,000-240,000 requests at the rung
    above), the simulated p99 at the rung above lambda* was 112.6 ± 3.3 ms (bound 100 ms) and 52.3 ± 0.6 ms (bound
    50); at the rung below, 84.3 ± 1.7 and 46.4 ± 0.6 ms: every one at least 3.7 standard deviations on its side of
    the bound, so a seed that moves the capacity by a rung is a draw of about 1 in 10,000. The p99 the simulator gives
    at both rungs is also held to the closed form within 10 % (3 sd)."""
    service_s, bound_s = 0.010, bound_ms / 1e3
    lam_star = md1_capacity(bound_s, service_s)
    ladder = Ladder(max_scale=8.0)
    position = math.log2(lam_star / rate) * ladder.steps_per_doubling
    rung = math.floor(position)
    assert 0.3 < position - rung < 0.7  # the closed form is well inside a rung: the test can tell one from the next
    profile = write_profile(tmp_path / "p.json", {"m": (service_s * 1e3, 0.0, 1)})
    load = write_load(tmp_path / "l.yaml", {"m": rate}, {"m": bound_ms}, duration_s=3000.0, seed=1)
    doc = run_tune(TuneOptions(load=str(load), profile=str(profile), out=str(tmp_path / "out"), instances=(1,),
                               max_batch_sizes=(1,), queue_delays_us=(0,), max_scale=8.0, verify_top=0, quiet=True,
                               report=False, replications=0))  # the point capacity; its interval: test_intervals.py
    result = doc["best"]["result"]
    assert result["capacity_scale"] == pytest.approx(ladder.scale(rung))
    p99 = {round(math.log2(p["scale"]) * ladder.steps_per_doubling): p["models"]["m"]["p99_s"]
           for p in result["probes"]}
    for r in (rung, rung + 1):
        assert p99[r] == pytest.approx(md1_p99(rate * ladder.scale(r), service_s), rel=0.10), r
