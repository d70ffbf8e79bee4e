"""The simulator: queueing theory with the sleep model, Triton's batcher rules, device sharing, determinism, engine
identity (fast vs SimPy reference), the Target contract, and one-line errors for bad profiles/configs."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from serving_bench.errors import InputError
from serving_bench.load.driver import TritonTarget
from serving_bench.profiles import Curve, DeviceInfo, Dist, IdleEffect, Law, ModelOnDevice, ModelProfile, Profile
from serving_bench.profiles.distributions import parse_idle
from serving_bench.run.metrics import summarize
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop, OpenLoop, Target
from serving_bench.serving_config import ModelServing, ServingConfig
from serving_bench.sim.interference import Observation, predict
from serving_bench.sim.spec import QueuePolicyNotModelledWarning
from serving_bench.sim.target import SimTarget

from conformance import assert_target_contract


def sleep_profile(base=0.005, per=0.001, sizes=(1, 32), overhead=0.0, colocation=(), device="cpu", kind="cpu",
                  names=("sleep_python",), service=None, gap=0.0, per_request=0.0, idle=None, **device_kw) -> Profile:
    """A profile of the sleep model: service ``base + per * items`` exactly (what the sleep runner sleeps)."""
    models = {}
    for name in names:
        batches = service or {b: Dist.constant(base + per * b) for b in sizes}
        md = ModelOnDevice("n/a", batches, tuple(colocation), per_request_s=per_request, batch_gap_s=gap, idle=idle)
        models[name] = ModelProfile(name, "python", "fp32", {device: md})
    info = DeviceInfo(device, kind, "test", cores=2 if kind == "cpu" else None, **device_kw)
    profile = Profile({device: info}, models, Dist.constant(overhead), path="test_profile.json")
    return Profile.from_json(profile.to_json(), "test_profile.json")


def poisson(rate, n, seed=0, models=("sleep_python",), batch=None):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    which = rng.integers(0, len(models), n)
    return Schedule(t, which, models, np.zeros(n), np.ones(n) if batch is None else batch,
                    {"duration_s": float(t[-1])})


def one(name="sleep_python", **kw) -> ServingConfig:
    kw.setdefault("instances", (("cpu", 1),))
    return ServingConfig((ModelServing(name, **kw),))


# -- queueing theory ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_wait_matches_theory(rho):
    """M/D/1 (Poisson arrivals, deterministic service, FIFO, one server): W = rho S / (2 (1 - rho))."""
    s = 0.006
    records = SimTarget(sleep_profile(), one(max_batch_size=1)).run(poisson(rho / s, 200_000, seed=1))
    wait = (records.table["done_s"] - records.table["intended_s"]).to_numpy() - s
    theory = rho * s / (2 * (1 - rho))
    assert abs(wait.mean() - theory) / theory < 0.04
    assert abs(np.mean(wait > 1e-12) - rho) < 0.01  # P(wait) = rho


def test_mm1_sojourn_matches_theory():
    """M/M/1 via an exponential service-time distribution: mean sojourn 1 / (mu - lambda)."""
    mu, lam = 200.0, 140.0
    u = np.linspace(0, 1, 2001)[:-1]
    q = list(u) + [1.0]
    s = list(-np.log1p(-u) / mu) + [-np.log(1 / 4000) / mu]
    service = {1: Dist(tuple(q), tuple(s))}
    records = SimTarget(sleep_profile(service=service), one(max_batch_size=0)).run(poisson(lam, 200_000, seed=2))
    sojourn = (records.table["done_s"] - records.table["intended_s"]).mean()
    assert abs(sojourn - 1 / (mu - lam)) / (1 / (mu - lam)) < 0.05


def test_two_instances_on_two_cores_are_md2():
    """Two instances on a 2-core device run in parallel (M/D/2): mean wait within 5 % of the Cosmetatos
    approximation ``W = 0.5 (1 + (1 - rho)(c - 1)(sqrt(4 + 5c) - 2) / (16 rho c)) W_M/M/c``."""
    s, c, rho = 0.006, 2, 0.8
    a = c * rho
    sched = poisson(a / s, 100_000, seed=3)
    wait = (SimTarget(sleep_profile(), one(max_batch_size=1, instances=(("cpu", 2),))).run(sched).table["done_s"]
            - sched.arrival_s).mean() - s
    erlang_c = (a ** c / 2 / (1 - rho)) / (1 + a + a ** c / 2 / (1 - rho))
    w_mmc = erlang_c * s / (c * (1 - rho))
    w_mdc = 0.5 * (1 + (1 - rho) * (c - 1) * (np.sqrt(4 + 5 * c) - 2) / (16 * rho * c)) * w_mmc
    assert abs(wait - w_mdc) / w_mdc < 0.05


# -- Triton's batcher ----------------------------------------------------------------------------------------------

def _single(times, **kw):
    n = len(times)
    sched = Schedule(np.asarray(times, float), np.zeros(n), ("sleep_python",), np.zeros(n), np.ones(n),
                     {"duration_s": float(max(times)) + 1})
    return SimTarget(sleep_profile(), one(**kw)).run(sched)


def test_lone_request_waits_the_queue_delay():
    r = _single([0.0], max_batch_size=8, dynamic_batching=True, max_queue_delay_us=2000).table
    assert r["done_s"][0] == pytest.approx(0.002 + 0.006)


def test_preferred_size_sends_at_once_and_delay_collects_the_rest():
    # 4 requests within 0.1 ms with preferred [4]: sent as one batch of 4 when the 4th arrives
    r = _single([0.0, 0.00002, 0.00004, 0.0001], max_batch_size=8, dynamic_batching=True, max_queue_delay_us=5000,
                preferred_batch_sizes=(4,)).table
    assert list(r["exec_batch"]) == [4, 4, 4, 4]
    assert r["done_s"][0] == pytest.approx(0.0001 + 0.005 + 0.004)


def test_delay_zero_busy_instance_grows_one_payload():
    # the first request runs alone; the next five arrive while it runs and ride together in the next batch
    times = [0.0] + [0.001 * k for k in range(1, 6)]
    r = _single(times, max_batch_size=8, dynamic_batching=True, max_queue_delay_us=0).table
    assert list(r["exec_batch"]) == [1, 5, 5, 5, 5, 5]
    assert r["done_s"][5] == pytest.approx(0.006 + 0.010)


def test_queue_full_rejects_and_queue_timeout_times_out():
    times = [0.0] + [0.0001 * k for k in range(1, 40)]
    r = _single(times, max_batch_size=1, dynamic_batching=True, max_queue_size=3).table
    assert (r["status"] == "rejected").sum() > 20
    assert (r["error"][r["status"] == "rejected"] == "Exceeds maximum queue size").all()
    records = _single(times, max_batch_size=1, dynamic_batching=True, queue_timeout_us=15000)
    r = records.table
    timed_out = r["status"] == "timeout"
    assert 20 < timed_out.sum() < 40 and r["done_s"][timed_out].isna().all()
    assert_target_contract(Schedule(np.asarray(times), np.zeros(40), ("sleep_python",), np.zeros(40), np.ones(40),
                                    {"duration_s": float(max(times)) + 1}), records)


def test_gap_between_batches_keeps_the_instance_busy_but_not_the_answer():
    """The measured gap between two batches on a busy instance delays the next batch, not the finished one."""
    n = 3
    sched = Schedule(np.zeros(n), np.zeros(n), ("sleep_python",), np.zeros(n), np.ones(n), {"duration_s": 1.0})
    for dynamic in (False, True):
        r = SimTarget(sleep_profile(gap=0.001), one(max_batch_size=1, dynamic_batching=dynamic)).run(sched).table
        assert list(r["done_s"]) == pytest.approx([0.006, 0.013, 0.020])


def test_per_request_cost_inside_a_batch():
    """Four requests of one item batched together cost the 4-item service time plus 3 x per_request_s."""
    sched = Schedule(np.zeros(4), np.zeros(4), ("sleep_python",), np.zeros(4), np.ones(4), {"duration_s": 1.0})
    r = SimTarget(sleep_profile(per_request=0.0005), one(max_batch_size=8, dynamic_batching=True,
                                                         preferred_batch_sizes=(4,))).run(sched).table
    assert list(r["exec_batch"]) == [4] * 4 and r["done_s"][0] == pytest.approx(0.005 + 0.004 + 3 * 0.0005)


def test_cold_start_after_idle_time():
    """A batch after its instance idled 10 ms takes the measured extra; a request 50 ms after the previous one pays
    the overhead extra; back-to-back work pays nothing."""
    idle = IdleEffect((0.001, 0.01), (0.0, 0.002), (0.002, 0.05), (0.0, 0.003))
    times = [0.0, 0.001, 0.0171, 0.0671]  # the second queues behind the first; the third comes 3.1 ms after it ends
    sched = Schedule(np.array(times), np.zeros(4), ("sleep_python",), np.zeros(4), np.ones(4), {"duration_s": 1.0})
    r = SimTarget(sleep_profile(idle=idle), one(max_batch_size=1)).run(sched).table
    # first: never busy before (last value: +2 ms service), first request ever (+3 ms overhead)
    # second: back to back, 1 ms after the first (no overhead extra); third: instance idle 3.1 ms,
    # 16.1 ms after the previous request (+ 0.003 * 14.1 / 48); fourth: idle and 50 ms gap
    assert r["done_s"][0] == pytest.approx(0.006 + 0.002 + 0.003)
    assert r["done_s"][1] == pytest.approx(0.008 + 0.006)
    assert r["done_s"][2] == pytest.approx(0.0171 + 0.006 + 0.002 * 0.0021 / 0.009 + 0.003 * 0.0141 / 0.048)
    assert r["done_s"][3] == pytest.approx(0.0671 + 0.006 + 0.002 + 0.003)


def test_cold_start_follows_the_instance_s_recent_idle_time():
    """With a memory below 1 a batch's cold-start extra follows the weighted mean of its instance's idle times: two
    requests 1 ms after the previous answer stay cold after a 10 ms idle, cooling off by half each (memory 0.5);
    with memory 1 (the last idle time alone) they are hot at once."""
    times = np.array([0.0, 0.018, 0.027, 0.035])
    sched = Schedule(times, np.zeros(4), ("sleep_python",), np.zeros(4), np.ones(4), {"duration_s": 1.0})
    done = {}
    for memory in (0.5, 1.0):
        idle = IdleEffect((0.001, 0.01), (0.0, 0.002), (0.002, 0.05), (0.0, 0.0), service_memory=memory)
        profile = sleep_profile(idle=idle)
        done[memory] = SimTarget(profile, one(max_batch_size=1)).run(sched).table["done_s"].to_numpy()
        assert profile.models["sleep_python"].devices["cpu"].idle.service_memory == memory  # kept in the profile
    # never busy before (the last value, +2 ms); 10 ms idle (the first idle time: +2 ms); then 1 ms idle twice:
    # recent 5.5 ms (+1 ms), then 3.25 ms (+0.5 ms)
    assert done[0.5] == pytest.approx([0.008, 0.026, 0.027 + 0.006 + 0.001, 0.035 + 0.006 + 0.0005])
    assert done[1.0] == pytest.approx([0.008, 0.026, 0.033, 0.035 + 0.006 + 0.002 / 9])  # the last: 2 ms idle
    bad = IdleEffect((0.001, 0.01), (0.0, 0.002), (0.002, 0.05), (0.0, 0.0)).to_json()
    bad["service"]["memory"] = 0.0
    with pytest.raises(InputError, match=r"idle.service.memory: expected a number in \(0, 1\]"):
        parse_idle(bad, "p.json", "idle")


def test_dispatch_delays_the_arrival_at_the_batcher():
    """A measured dispatch time (thread hand-offs inside Triton) delays each request's arrival at the batcher: a
    lone request takes dispatch + service; two requests 0.5 ms apart with a 2 ms dispatch still batch together when
    the first waits the queue delay, and the second's delay counts from its own arrival at the batcher."""
    data = sleep_profile().to_json()
    data["models"]["sleep_python"]["dispatch"] = {"constant_s": 0.002}
    profile = Profile.from_json(data, "p.json")
    sched = Schedule(np.array([0.0, 0.0005]), np.zeros(2), ("sleep_python",), np.zeros(2), np.ones(2), {})
    r = SimTarget(profile, one(max_batch_size=1)).run(sched).table
    assert list(r["done_s"]) == pytest.approx([0.002 + 0.006, 0.008 + 0.006])
    r = SimTarget(profile, one(max_batch_size=8, dynamic_batching=True, max_queue_delay_us=1000)).run(sched).table
    assert list(r["exec_batch"]) == [2, 2] and r["done_s"][0] == pytest.approx(0.002 + 0.001 + 0.005 + 0.002)
    records = SimTarget(profile, one(max_batch_size=8, dynamic_batching=True), engine="simpy").run(sched)
    assert records.table.equals(SimTarget(profile, one(max_batch_size=8, dynamic_batching=True)).run(sched).table)


def test_colocation_curve_between_measured_batch_sizes_is_interpolated():
    from serving_bench.sim.spec import _curve_for

    small, large = Curve(1, (1.0, 2.0), (1.0, 2.0)), Curve(9, (1.0, 4.0), (1.0, 1.0))
    mid = _curve_for((small, large), 5)
    assert mid.batch == 5 and mid.k == (1.0, 2.0, 4.0)
    assert mid(2.0) == pytest.approx((2.0 + large(2.0)) / 2) and mid(4.0) == pytest.approx((small(4.0) + 1.0) / 2)
    assert _curve_for((small, large), 1) is small and _curve_for((small, large), 32) is large


def test_pair_curve_applies_up_to_its_batch_size():
    """Two models measured as a pair at batch 1 (time-sliced): their batch-1 requests share the device; at batch 4
    the pair curve does not apply and the demand law does (a GPU's default, serial: half the GPU each, each one's
    kernels wait for the other's, 9 ms x (1 + 0.5 x 0.5))."""
    data = sleep_profile(device="gpu0", kind="gpu", names=("a", "b"), sizes=(1, 4),
                         colocation=[Curve(1, (1.0, 2.0), (1.0, 2.0))]).to_json()
    for name in ("a", "b"):
        data["models"][name]["devices"]["gpu0"]["demand"] = {"1": 0.5, "4": 0.5}
    data["pairs"] = [{"device": "gpu0", "models": ["a", "b"], "batch": 1, "k": [1, 2], "speedup": [1.0, 1.0]}]
    profile = Profile.from_json(data, "p.json")
    config = ServingConfig(tuple(ModelServing(n, max_batch_size=4, instances=(("gpu0", 1),)) for n in ("a", "b")))
    for rows, expected in ((1, 0.012), (4, 0.009 * 1.25)):
        sched = Schedule(np.zeros(2), np.array([0, 1]), ("a", "b"), np.zeros(2), np.full(2, rows), {})
        assert list(SimTarget(profile, config).run(sched).table["done_s"]) == pytest.approx([expected, expected])


def test_batch_larger_than_max_batch_size_is_an_error_response():
    sched = Schedule(np.array([0.0, 0.1]), np.zeros(2), ("sleep_python",), np.zeros(2), np.array([2, 64]), {})
    r = SimTarget(sleep_profile(), one(max_batch_size=32, dynamic_batching=True)).run(sched).table
    assert list(r["status"].astype(str)) == ["ok", "error"]


# -- shared devices ----------------------------------------------------------------------------------------------

def test_time_sliced_gpu_halves_each_batch_speed():
    curve = Curve(1, (1.0, 2.0), (1.0, 1.0))  # S(2) = 1: two batches at once each run at half speed
    profile = sleep_profile(colocation=[curve], device="gpu0", kind="gpu")
    sched = Schedule(np.array([0.0, 0.0]), np.zeros(2), ("sleep_python",), np.zeros(2), np.ones(2), {})
    r = SimTarget(profile, one(max_batch_size=0, instances=(("gpu0", 2),))).run(sched).table
    assert list(r["done_s"]) == pytest.approx([0.012, 0.012])
    assert sorted(r["instance"]) == [0, 1]


@pytest.mark.parametrize("k, done_s", [(2, 0.006), (4, 0.006), (8, 0.012)])
def test_gpu_batches_stretch_whole_so_the_device_is_never_over_used(k, done_s):
    """k batches of 6 ms, each keeping the GPU busy a quarter of its time alone (demand 0.25), start at once on k
    instances. Up to k = 4 they fit the device (D <= 1: solo speed). At k = 8, D = 2: the device has 8 x 0.25 x 6 ms =
    12 ms of work to do, so all end at 12 ms — each stretched whole (phi = 1). Stretching only its busy share (phi =
    d) would end them at 7.5 ms, the device busy 160 % of the time (docs/sim.md, "On a GPU a batch stretches
    whole"). Law ``pool``, given: a GPU's default is ``serial`` (below)."""
    data = sleep_profile(device="gpu0", kind="gpu", sizes=(1,)).to_json()
    data["models"]["sleep_python"]["devices"]["gpu0"]["demand"] = {"1": 0.25}
    data["devices"]["gpu0"]["law"] = {"name": "pool"}
    profile = Profile.from_json(data, "p.json")
    sched = Schedule(np.zeros(k), np.zeros(k), ("sleep_python",), np.zeros(k), np.ones(k), {})
    config = one(max_batch_size=1, instances=(("gpu0", k),))
    for engine in ("fast", "simpy"):
        r = SimTarget(profile, config, engine=engine).run(sched).table
        assert list(r["done_s"]) == pytest.approx([done_s] * k) and sorted(r["instance"]) == list(range(k))


def _machine_repair_throughput(k: int, d: float) -> float:
    """The textbook machine-repair model: k machines, each working 1 - d between repairs of mean d by one repairman
    (exponential); repairs per unit time = (1 - p0) / d, p0 = 1 / sum_n k! / (k - n)! (d / (1 - d))^n."""
    rho = d / (1.0 - d)
    p0 = 1.0 / sum(math.factorial(k) / math.factorial(k - n) * rho ** n for n in range(k + 1))
    return (1.0 - p0) / d


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_serial_law_is_the_machine_repair_model_on_a_gpu(k):
    """A GPU's default law, ``serial``: a job is 1 - d of host work and d of kernels, and the device runs kernels one
    at a time. k identical batches of 6 ms at demand 0.25 run together at S(k) / k of their solo speed, S(k) the
    machine-repair model's throughput in solo jobs (k = 2: each job's kernels wait d x Q(1) = 0.25 x 0.25, so each
    runs at 1 / (1 + 1/16) = 16/17). It saturates at 1 / d = 4 jobs' worth (no linear extrapolation)."""
    from serving_bench.sim.device import Law
    from serving_bench.sim.serial import serial_rates

    speedup = _machine_repair_throughput(k, 0.25)
    assert Law("serial").speedup(k, 0.25) == pytest.approx(speedup)
    assert serial_rates([2], [0.25]) == pytest.approx([16 / 17])
    assert speedup < 4.0
    data = sleep_profile(device="gpu0", kind="gpu", sizes=(1,)).to_json()
    data["models"]["sleep_python"]["devices"]["gpu0"]["demand"] = {"1": 0.25}
    profile = Profile.from_json(data, "p.json")
    sched = Schedule(np.zeros(k), np.zeros(k), ("sleep_python",), np.zeros(k), np.ones(k), {})
    config = one(max_batch_size=1, instances=(("gpu0", k),))
    for engine in ("fast", "simpy"):
        r = SimTarget(profile, config, engine=engine).run(sched).table
        assert list(r["done_s"]) == pytest.approx([0.006 * k / speedup] * k)


def test_serial_law_slows_a_pair_below_the_devices_capacity():
    """Two different models on one GPU, demands 0.3 and 0.2 (together half the device: processor sharing would
    slow neither). With kernels one at a time each waits for the other's: a's kernels take 0.3 (1 + 0.2), so its
    6 ms run at 1 / (1 + 0.3 x 0.2) — until b's 6 ms of work is done (b at 1 / (1 + 0.2 x 0.3), the same rate),
    both at 6.36 ms. A model of demand 0 is neither slowed nor slows. Beyond the exact population (Schweitzer's
    approximation) the rates stay within a few % of the exact ones; the law is refused on a CPU host."""
    from serving_bench.sim.serial import EXACT_STATES, serial_rates

    profile = _demand_profile({"a": 0.3, "b": 0.2}, kind="gpu")
    assert _together(profile, ("a", "b"), "gpu0") == pytest.approx([0.006 * 1.06] * 2)
    assert serial_rates([1, 1, 1], [0.3, 0.2, 0.0]) == pytest.approx([1 / 1.06, 1 / 1.06, 1.0])
    split = [3] * 8  # 4^8 sub-populations: approximated
    assert 4 ** 8 > EXACT_STATES
    assert serial_rates(split, [0.1] * 8)[0] == pytest.approx(serial_rates([24], [0.1])[0], rel=0.05)
    data = _demand_profile({"a": 0.3}).to_json()
    data["devices"]["cpu"]["law"] = {"name": "serial"}
    with pytest.raises(InputError, match=r"devices\.cpu\.law\.name"):
        Profile.from_json(data, "p.json")


def _mean_value_rates(counts: list, demands: list) -> list:
    """Law serial's rates by mean-value analysis over every sub-population ``m`` of the running set (docs/sim.md):
    ``R_c(m) = d_c (1 + Q(m - e_c))``, ``Q(m) = sum_c m_c R_c(m) / (1 - d_c + R_c(m))``, a job of kind c at ``1 / (1
    - d_c + R_c(n))``; kinds of demand 0 at 1."""
    queue = {}
    rates = [1.0] * len(counts)
    for m in itertools.product(*(range(n + 1) for n in counts)):  # each m after every m - e_c
        total = 0.0
        for c, d in enumerate(demands):
            if m[c] and d > 0.0:
                response = d * (1.0 + queue[m[:c] + (m[c] - 1,) + m[c + 1:]])
                total += m[c] * response / (1.0 - d + response)
                if list(m) == counts:
                    rates[c] = 1.0 / (1.0 - d + response)
        queue[m] = total
    return rates


def test_serial_law_rates_are_the_mean_value_analysis():
    """sim.serial solves a running set by the product form's normalising constant (products before each kind,
    moments after it: no sub-population enumerated); the rates are those of mean-value analysis over every
    sub-population, to rounding — on random sets (0-3 jobs of up to 6 kinds, demands from 0 to 1), on sets it hands
    to mean-value analysis itself (a demand above 1, more than GF_JOBS jobs) and on one past EXACT_STATES
    sub-populations (Schweitzer's approximation, within 5 %)."""
    from serving_bench.sim.serial import EXACT_STATES, serial_rates

    rng = np.random.default_rng(3)
    for _ in range(300):
        kinds = int(rng.integers(1, 7))
        counts = [int(n) for n in rng.integers(0, 4, kinds)]  # at most 4^6 = EXACT_STATES sub-populations
        demands = [float(d) for d in rng.choice([0.0, 1.0, 0.02, 0.5, 0.97], kinds) * rng.uniform(0.5, 1.0, kinds)]
        demands[0] = float(rng.choice([demands[0], 0.0, 1.0]))
        assert serial_rates(counts, demands) == pytest.approx(_mean_value_rates(counts, demands), rel=1e-12)
    for counts, demands in (([2, 3], [1.05, 0.3]), ([129, 2], [0.2, 0.6]), ([1, 1], [0.0, 0.0])):
        assert serial_rates(counts, demands) == pytest.approx(_mean_value_rates(counts, demands), rel=1e-12)
    big = [2] * 8  # 3^8 sub-populations
    assert 3 ** 8 > EXACT_STATES
    assert serial_rates(big, [0.2] * 8) == pytest.approx(_mean_value_rates(big, [0.2] * 8), rel=0.05)


def test_interference_rule_leaves_a_model_that_uses_no_device_untouched():
    """A model whose batches use none of the device (measured demand 0, like the sleep model) neither slows a model
    that fills it (its own curve: time-sliced, demand 1) nor is slowed by it."""
    serial = Curve(1, (1.0, 2.0), (1.0, 1.0))
    free = Curve(1, (1.0, 2.0), (1.0, 2.0))
    base = sleep_profile(device="gpu0", kind="gpu", names=("heavy", "light")).to_json()
    base["models"]["heavy"]["devices"]["gpu0"]["colocation"] = [serial.to_json()]
    base["models"]["light"]["devices"]["gpu0"]["colocation"] = [free.to_json()]
    base["models"]["light"]["devices"]["gpu0"]["demand"] = {"1": 0.0}
    profile = Profile.from_json(base, "p.json")
    config = ServingConfig(tuple(ModelServing(n, instances=(("gpu0", 1),)) for n in ("heavy", "light")))
    sched = Schedule(np.array([0.0, 0.0]), np.array([0, 1]), ("heavy", "light"), np.zeros(2), np.ones(2), {})
    r = SimTarget(profile, config).run(sched).table
    assert list(r["done_s"]) == pytest.approx([0.006, 0.006])


# -- determinism and engines -------------------------------------------------------------------------------------

def _noisy_profile(names=("a", "b"), gap=0.0, idle=None):
    profile = sleep_profile(names=names, service={1: Dist.from_samples([0.002, 0.003, 0.006]),
                                                  8: Dist.from_samples([0.005, 0.007, 0.012])}, overhead=0.0,
                            gap=gap, per_request=0.0002, idle=idle)
    data = profile.to_json()
    data["overhead"] = {"samples_s": [1e-4, 2e-4, 5e-4]}
    return Profile.from_json(data, "p.json")


def _mixed_config():
    return ServingConfig((
        ModelServing("a", max_batch_size=8, dynamic_batching=True, max_queue_delay_us=500,
                     preferred_batch_sizes=(2, 4), queue_timeout_us=30000, instances=(("cpu", 2),)),
        ModelServing("b", max_batch_size=8, dynamic_batching=True, max_queue_size=6, instances=(("cpu", 1),)),
    ))


def test_same_inputs_same_records_other_seed_other_records():
    sched = poisson(900, 4000, seed=4, models=("a", "b"))
    first = SimTarget(_noisy_profile(), _mixed_config(), seed=7).run(sched)
    again = SimTarget(_noisy_profile(), _mixed_config(), seed=7).run(sched)
    other = SimTarget(_noisy_profile(), _mixed_config(), seed=8).run(sched)
    assert first.table.equals(again.table) and first.info == again.info
    assert not first.table["done_s"].equals(other.table["done_s"])


@pytest.mark.parametrize("seed", range(4))
def test_fast_engine_equals_simpy_reference(seed):
    rng = np.random.default_rng(seed)
    n = 1500
    t = np.cumsum(rng.exponential(1 / rng.uniform(300, 1500), n))
    if seed % 2:
        t = np.round(t, 3)  # simultaneous arrivals
    sched = Schedule(t, rng.integers(0, 2, n), ("a", "b"), np.zeros(n), rng.integers(1, 3, n) if seed == 3
                     else np.ones(n), {"duration_s": float(t[-1])})
    config = _mixed_config()
    if seed == 2:
        config = ServingConfig(tuple(m.replace(max_queue_delay_us=0, max_queue_size=0) for m in config.models))
    gap = 0.0003 if seed >= 2 else 0.0
    idle = IdleEffect((0.0005, 0.01), (0.0, 0.001), (0.001, 0.01), (0.0, 0.0005),
                      service_memory=0.125 if seed == 3 else 1.0) if seed % 2 else None
    fast = SimTarget(_noisy_profile(gap=gap, idle=idle), config, seed=seed).run(sched)
    ref = SimTarget(_noisy_profile(gap=gap, idle=idle), config, seed=seed, engine="simpy").run(sched)
    assert fast.table.equals(ref.table)


def test_ensemble_fans_out_joins_and_matches_reference():
    profile = _noisy_profile(("pre", "left", "right", "join"))
    config = ServingConfig(tuple(ModelServing(n, max_batch_size=8, dynamic_batching=True)
                                 for n in ("pre", "left", "right", "join")),
                           (("pipe", ("pre", "left", "right", "join")),))
    deps = {"pipe": ((), (0,), (0,), (1, 2))}
    sched = poisson(150, 600, seed=5, models=("pipe", "left"))
    fast = SimTarget(profile, config, ensemble_deps=deps).run(sched)
    ref = SimTarget(profile, config, ensemble_deps=deps, engine="simpy").run(sched)
    assert fast.table.equals(ref.table)
    assert_target_contract(sched, fast)
    pipe = fast.table[fast.table["model"] == "pipe"]
    assert (pipe["status"] == "ok").all() and ((pipe["done_s"] - pipe["intended_s"]) > 3 * 0.002).all()


def _write_pipe_repo(repo):
    """A repository of three sleep members and the ensemble ``pipe``: ``left`` and ``right`` read the request,
    ``join`` reads both their outputs."""
    for name in ("left", "right", "join"):
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
                                                  "dynamic_batching {}\n")
    steps = "".join(f'  step {{ model_name: "{m}" model_version: -1 input_map {{ key: "{k}" value: "{v}" }} '
                    f'output_map {{ key: "OUT" value: "{m}_out" }} }}\n'
                    for m, k, v in (("left", "IN", "IN"), ("right", "IN", "IN")))
    steps += ('  step { model_name: "join" model_version: -1 input_map { key: "A" value: "left_out" } '
              'input_map { key: "B" value: "right_out" } output_map { key: "OUT" value: "OUT" } }\n')
    (repo / "pipe").mkdir()
    (repo / "pipe" / "config.pbtxt").write_text('name: "pipe"\nplatform: "ensemble"\nmax_batch_size: 8\n'
                                                 f"ensemble_scheduling {{\n{steps}}}\n")


def test_an_ensembles_step_graph_travels_with_its_serving_config(tmp_path):
    """The members that need only the request run together: read from the repository, the graph is part of the
    serving config, so the simulator needs no other source for it (the tuner, the profile's fit and the benchmarks
    build their configs so); a config without a graph runs its steps as a chain. Each member sleeps 6 ms."""
    _write_pipe_repo(tmp_path)
    config = ServingConfig.from_repo(tmp_path, ["pipe"])
    assert config.ensembles == (("pipe", ("left", "right", "join")),)
    assert config.ensemble_deps == (("pipe", ((), (), (0, 1))),)
    profile = sleep_profile(names=("left", "right", "join"), base=0.005, per=0.001)
    sched = Schedule(np.array([0.0]), np.array([0]), ("pipe",), np.zeros(1), np.ones(1), {})
    target = SimTarget(profile, config)
    pipe, names = target.spec.ensembles[0], [m.name for m in target.spec.models]
    assert (names[pipe.entry], names[pipe.exit]) == ("left", "join")  # whose ways in and out its requests take
    graph = target.run(sched).table["done_s"]
    chain = SimTarget(profile, dataclasses.replace(config, ensemble_deps=())).run(sched).table["done_s"]
    assert list(graph) == pytest.approx([0.012]) and list(chain) == pytest.approx([0.018])
    # an observation of a closed loop on the ensemble keeps the graph through its JSON: one client, a 12 ms cycle
    serving = {m.name: m for m in config.models}
    obs = Observation("cpu", serving, {"pipe": 1}, {"pipe": 83.3}, ensembles=dict(config.ensembles),
                      ensemble_deps=dict(config.ensemble_deps))
    again = Observation.from_json(json.loads(json.dumps(obs.to_json())))
    assert again == obs
    assert predict(profile, again, seconds=1.206)["pipe"] == pytest.approx(100 / 1.206)  # a chain: 67 answers


def test_an_ensemble_takes_its_entry_members_way_in_and_its_exit_members_way_out(tmp_path):
    """The ensemble "pipe" (left and right in parallel, then join; each sleeps 6 ms) with plain delays for ways (no
    request device): "left" takes 1 ms in, "join" 3 ms out, the others other times. One request at 0 is answered at
    the client at 1 + 6 + 6 + 3 = 16 ms; a closed loop of one client sends every 16 ms."""
    _write_pipe_repo(tmp_path)
    config = ServingConfig.from_repo(tmp_path, ["pipe"])
    data = sleep_profile(names=("left", "right", "join"), base=0.005, per=0.001).to_json()
    for name, way_in, way_out in (("left", 0.001, 0.010), ("right", 0.020, 0.020), ("join", 0.030, 0.003)):
        data["models"][name]["dispatch"] = {"constant_s": way_in}
        data["models"][name]["overhead"] = {"constant_s": way_out}
    profile = Profile.from_json(data, "p.json")
    sched = Schedule(np.zeros(3), np.zeros(3), ("pipe",), np.zeros(3), np.ones(3), {"duration_s": 0.0})
    once = SimTarget(profile, config).run(Schedule(np.array([0.0]), np.array([0]), ("pipe",), np.zeros(1),
                                                   np.ones(1), {})).table
    assert list(once["done_s"]) == pytest.approx([0.016])
    loop = SimTarget(profile, config).run(sched, _Closed(1, 0.04)).table
    assert list(loop["sent_s"]) == pytest.approx([0.0, 0.016, 0.032])
    assert list(loop["done_s"]) == pytest.approx([0.016, 0.032, 0.048])


def test_an_ensembles_own_time_is_added_to_its_answer_by_the_quiet_before_it(tmp_path):
    """The ensemble "pipe" (left and right in parallel, then join; each sleeps 6 ms) whose profile measured its own
    time beyond its members' path: 2 ms 1 ms after the previous request, 4 ms after 100 ms, linear between (median
    and p90 the same). The first request (nothing before it) is answered at 12 + 4 ms; one sent 51 ms later at
    12 + 2 + 2 x 50 / 99 ms; its members alone are not slowed. The engines agree, in open and closed loop."""
    from serving_bench.profiles.distributions import EnsembleExtra

    _write_pipe_repo(tmp_path)
    config = ServingConfig.from_repo(tmp_path, ["pipe", "left"])
    extra = EnsembleExtra((0.001, 0.1), (0.002, 0.004), (0.002, 0.004))
    profile = dataclasses.replace(sleep_profile(names=("left", "right", "join"), base=0.005, per=0.001),
                                  ensembles={"pipe": extra})
    sched = Schedule(np.array([0.0, 0.051, 0.2]), np.array([0, 0, 1]), ("pipe", "left"), np.zeros(3), np.ones(3), {})
    table = SimTarget(profile, config).run(sched).table
    latency = (table["done_s"] - table["intended_s"]).to_numpy()
    assert latency == pytest.approx([0.016, 0.012 + 0.002 + 0.002 * 0.05 / 0.099, 0.006])
    assert SimTarget(profile, config, engine="simpy").run(sched).table.equals(table)
    loop = SimTarget(profile, config).run(sched.select(sched.model == 0), _Closed(1, 0.03)).table
    assert list(loop["done_s"] - loop["sent_s"])[:2] == pytest.approx([0.016, 0.012 + 0.002 + 0.002 * 0.015 / 0.099])


def test_records_satisfy_target_contract_and_summarize():
    sched = poisson(900, 3000, seed=6, models=("a", "b"))
    records = SimTarget(_noisy_profile(), _mixed_config()).run(sched)
    assert_target_contract(sched, records)
    summary = summarize(records)
    assert summary["models"]["a"]["counts"]["scheduled"] + summary["models"]["b"]["counts"]["scheduled"] == 3000
    assert 1.0 <= summary["models"]["a"]["mean_exec_batch"] <= 8.0
    util = records.info.sim.utilisation
    assert 0.0 < util["a"] < 1.0
    json.dumps(records.info.to_json())


# -- bad input ---------------------------------------------------------------------------------------------------

def test_missing_batch_size_names_profile_and_field():
    with pytest.raises(InputError, match=r"test_profile.json: models.sleep_python.devices.cpu.batches: .*batch size 33 \(max_batch_size 64\)"):
        SimTarget(sleep_profile(sizes=(1, 32)), one(max_batch_size=64, dynamic_batching=True))


def test_missing_model_or_device_names_the_field():
    with pytest.raises(InputError, match=r"test_profile.json: models.other: the profile has no model"):
        SimTarget(sleep_profile(), one("other"))
    with pytest.raises(InputError, match=r"test_profile.json: devices: the profile has no device 'gpu3'"):
        SimTarget(sleep_profile(), one(instances=(("gpu3", 1),)))
    target = SimTarget(sleep_profile(), one())
    with pytest.raises(InputError, match=r"models.nope: the schedule sends requests to 'nope'"):
        target.run(poisson(10, 5, models=("nope",)))


def test_more_instances_than_the_device_allows():
    with pytest.raises(InputError, match=r"test_profile.json: devices.cpu.max_instances: .*3 instances.*at most 2"):
        SimTarget(sleep_profile(max_instances=2), one(instances=(("cpu", 3),)))


# -- closed loop -------------------------------------------------------------------------------------------------

_Closed = ClosedLoop  # the closed-loop mode both targets take (serving_bench.run.target)


def _exponential(mean):
    u = np.linspace(0, 1, 2001)[:-1]
    return Dist(tuple(list(u) + [1.0]), tuple(list(-np.log1p(-u) * mean) + [-np.log(1 / 4000) * mean]))


@pytest.mark.parametrize("clients", [1, 4])
def test_closed_loop_deterministic_cycle(clients):
    """N clients, deterministic service S and return overhead Z, one instance: each client's cycle is
    max(S + Z, N S) — the server saturates once N S > S + Z (the closed-network asymptotes are exact here)."""
    s, z = 0.006, 0.002
    records = SimTarget(sleep_profile(overhead=z), one(max_batch_size=1)).run(poisson(1, 5000), _Closed(clients, 3.0))
    assert_target_contract(poisson(1, 5000), records, closed_loop=True)
    cycle = max(s + z, clients * s)
    latency = (records.table["done_s"] - records.table["sent_s"]).to_numpy()
    assert latency[clients:-clients] == pytest.approx(cycle)
    assert len(records) == pytest.approx(clients * 3.0 / cycle, abs=clients)
    assert (records.table["intended_s"] == records.table["sent_s"]).all() and records.table["sent_s"].max() < 3.0


def test_closed_loop_matches_the_machine_repair_model():
    """M/M/1//N: N clients thinking (the return overhead) an exponential Z, service exponential S. Utilisation
    U = 1 - p0, p0 = 1 / sum_k N!/(N-k)! (S/Z)^k; throughput X = U / S; response (send to answer) R = N / X - Z."""
    from math import factorial

    n_clients, s, z = 3, 0.004, 0.006
    profile = sleep_profile(service={1: _exponential(s)})
    data = profile.to_json()
    data["overhead"] = _exponential(z).to_json()
    profile = Profile.from_json(data, "p.json")
    records = SimTarget(profile, one(max_batch_size=0)).run(poisson(1, 400_000), _Closed(n_clients, 400.0))
    p0 = 1 / sum(factorial(n_clients) / factorial(n_clients - k) * (s / z) ** k for k in range(n_clients + 1))
    x = (1 - p0) / s
    assert len(records) / 400.0 == pytest.approx(x, rel=0.02)
    response = (records.table["done_s"] - records.table["sent_s"]).mean()  # includes the think (return) time
    assert response == pytest.approx(n_clients / x, rel=0.02)


def test_closed_loop_engines_agree_with_ensembles_and_queue_limits():
    profile = _noisy_profile(("pre", "left", "right", "join", "b"))
    config = ServingConfig(tuple(ModelServing(n, max_batch_size=8, dynamic_batching=True, max_queue_delay_us=300)
                                 for n in ("pre", "left", "right", "join"))
                           + (ModelServing("b", max_batch_size=8, dynamic_batching=True, max_queue_size=2),),
                           (("pipe", ("pre", "left", "right", "join")),))
    deps = {"pipe": ((), (0,), (0,), (1, 2))}
    sched = poisson(100, 20000, seed=9, models=("pipe", "left", "b"))
    mode = _Closed({"pipe": 3, "left": 2, "b": 5}, 0.5)
    fast = SimTarget(profile, config, ensemble_deps=deps, seed=3).run(sched, mode)
    ref = SimTarget(profile, config, ensemble_deps=deps, seed=3, engine="simpy").run(sched, mode)
    assert fast.table.equals(ref.table)
    c = assert_target_contract(sched, fast, closed_loop=True)
    assert c["ok"] > 100 and c["rejected"] > 0  # 5 clients against a queue of 2: some are refused
    per_model = fast.table.groupby("model", observed=True).size()
    assert set(per_model.index) == {"pipe", "left", "b"}


# -- padding and the mean batch ---------------------------------------------------------------------------------

def test_padded_batches_run_at_the_next_captured_size():
    """A runtime with captured sizes 1, 4, 8 (CUDA graphs, TVM buckets): a batch of 3 takes the time of 4, a batch
    of 5 the time of 8; the profile measured those sizes only."""
    service = {1: Dist.constant(0.002), 4: Dist.constant(0.004), 8: Dist.constant(0.008)}
    profile = sleep_profile(service=service)
    data = profile.to_json()
    data["models"]["sleep_python"]["devices"]["cpu"]["padded_sizes"] = [1, 4, 8]
    profile = Profile.from_json(data, "p.json")
    config = one(max_batch_size=8, dynamic_batching=True, preferred_batch_sizes=(3, 5))
    for size, expected in ((3, 0.004), (5, 0.008)):
        sched = Schedule(np.zeros(size), np.zeros(size), ("sleep_python",), np.zeros(size), np.ones(size),
                         {"duration_s": 1.0})
        records = SimTarget(profile, config).run(sched)
        assert (records.table["exec_batch"] == size).all() and records.table["done_s"].to_numpy() == pytest.approx(expected)
    data["models"]["sleep_python"]["devices"]["cpu"]["padded_sizes"] = [4, 2]
    with pytest.raises(InputError, match=r"p.json: models.sleep_python.devices.cpu.padded_sizes: expected strictly"):
        Profile.from_json(data, "p.json")
    assert profile.models["sleep_python"].devices["cpu"].executed_size(9) == 9  # beyond the captured: unpadded


def _two_thread_profile() -> Profile:
    """The sleep model on a 2-core host, measured at 2 threads per instance (5 ms a request) and at 1 (8 ms)."""
    from tune_fixtures import two_thread_profile_json

    return Profile.from_json(two_thread_profile_json("sleep_python"), "test_profile.json")


def test_each_instance_runs_at_the_threads_the_config_gives_it():
    """With :func:`_two_thread_profile`: one instance gets both cores, so 5 ms; two instances one core each, so
    8 ms; two instances told 2 threads each, 5 ms."""
    profile = _two_thread_profile()
    alone = Schedule.at_times([0.0], "sleep_python")
    for instances, threads, expected in ((1, 0, 0.005), (2, 0, 0.008), (2, 2, 0.005)):
        config = dataclasses.replace(one(instances=(("cpu", instances),)), threads_per_instance=threads)
        done = SimTarget(profile, config).run(alone).table["done_s"].to_numpy()
        assert done == pytest.approx([expected]), (instances, threads)


def test_mean_batch_is_per_execution():
    """Two executions, one of 1 item and one of 3 (three requests): 2 items per execution, not the 2.5 a
    request-weighted mean would give."""
    from serving_bench.run.metrics import per_execution_batch

    assert per_execution_batch(np.array([1, 1, 1, 1]), np.array([1, 3, 3, 3])) == pytest.approx(2.0)
    assert per_execution_batch(np.array([2, 1]), np.array([3, 3])) == pytest.approx(3.0)
    assert per_execution_batch(np.array([1]), np.array([-1])) is None


def test_a_queue_policy_warns_that_triton_2_51s_stall_is_not_modelled():
    expected = r"^sleep_python: queue policy \(max_queue_size 16\) simulated "
    with pytest.warns(QueuePolicyNotModelledWarning, match=expected):
        SimTarget(sleep_profile(), one(max_batch_size=8, dynamic_batching=True, max_queue_size=16))
    with warnings.catch_warnings():
        warnings.simplefilter("error", QueuePolicyNotModelledWarning)
        SimTarget(sleep_profile(), one(max_batch_size=8, dynamic_batching=True))


# -- the interference model (hand-worked cases) -----------------------------------------------------------------

def _demand_profile(demands: dict, threads=1, cores=2, law=None, kind="cpu"):
    """Sleep-like models (service 6 ms at batch 1) with the given measured demand each."""
    profile = sleep_profile(names=tuple(demands), device="cpu" if kind == "cpu" else "gpu0", kind=kind)
    data = profile.to_json()
    device = "cpu" if kind == "cpu" else "gpu0"
    for name, d in demands.items():
        data["models"][name]["devices"][device]["demand"] = {"1": d}
        data["models"][name]["devices"][device]["threads"] = threads
    data["devices"][device]["cores"] = cores if kind == "cpu" else None
    if law:
        data["devices"][device]["law"] = law
    return Profile.from_json(data, "p.json")


def _together(profile, names, device="cpu"):
    config = ServingConfig(tuple(ModelServing(n, max_batch_size=1, instances=((device, 1),)) for n in names))
    sched = Schedule(np.zeros(len(names)), np.arange(len(names)), tuple(names), np.zeros(len(names)),
                     np.ones(len(names)), {})
    return SimTarget(profile, config).run(sched).table["done_s"].to_numpy()


def test_two_identical_models_share_the_cores_by_demand():
    """Two models of demand 1.5 (two threads, busy 75 % of the time) on 2 cores: D = 3, s = D / C = 1.5; each
    batch's CPU-bound share phi = 0.75 runs 1.5 times slower: 6 ms x (1 + 0.75 x 0.5) = 8.25 ms. With demand 1
    each they fit (D = 2): 6 ms."""
    assert _together(_demand_profile({"a": 1.5, "b": 1.5}, threads=2), ("a", "b")) == pytest.approx([0.00825] * 2)
    assert _together(_demand_profile({"a": 1.0, "b": 1.0}), ("a", "b")) == pytest.approx([0.006] * 2)


def test_laws_effective_capacity_and_soft_onset():
    """pool_eff: eta = 0.75 of 2 cores -> D = 2 gives s = 2 / 1.5 = 4/3: 8 ms. soft (p = 2): s = sqrt(1 + x^2) with
    x = D / (eta C) = 2 / 2 = 1 -> sqrt(2): 6 sqrt(2) ms — contention before the pool is full."""
    profile = _demand_profile({"a": 1.0, "b": 1.0}, law={"name": "pool_eff", "eta": 0.75})
    assert _together(profile, ("a", "b")) == pytest.approx([0.008] * 2)
    profile = _demand_profile({"a": 1.0, "b": 1.0}, law={"name": "soft", "eta": 1.0, "power": 2.0})
    assert _together(profile, ("a", "b")) == pytest.approx([0.006 * np.sqrt(2)] * 2)
    from serving_bench.sim.device import Law
    assert Law("pool", 2).speedup(8, 1.0) == pytest.approx(2.0)  # saturates: no linear extrapolation


def test_demand_from_a_saturating_curve_and_the_cpu_default():
    """No measured demand: a curve with S(4) = 2 on 2 cores means d = C / S = 1; without a curve a CPU batch
    keeps its threads busy."""
    from serving_bench.sim.spec import batch_demand

    info = DeviceInfo("cpu", "cpu", cores=2)
    md = ModelOnDevice("n/a", {1: Dist.constant(0.006)}, threads=2)
    assert batch_demand(info, md, 1, Curve(1, (1.0, 2.0, 4.0), (1.0, 2.0, 2.0))) == pytest.approx(1.0)
    assert batch_demand(info, md, 1, None) == 2.0
    assert batch_demand(info, ModelOnDevice("n/a", md.batches, demand={1: 0.4, 8: 0.8}), 4, None) == \
        pytest.approx(0.4 + 3 / 7 * 0.4)


def test_hand_off_share_psi_scales_the_hop_and_the_ways_in_and_out():
    """A batch of 6 ms whose last 2 ms are the hop (Triton <-> stub): the runtime's 4 ms at its demand 1.0, the hop
    at the hand-off demand; with a measured hand-off demand 1.0 scaled by psi = 0.5: (1.0 x 4 + 0.5 x 2) / 6 = 5/6.
    psi defaults to 1 and never reaches the law's own parameters."""
    from serving_bench.sim.spec import batch_demand, device_law, handoff_share

    info = DeviceInfo("cpu", "cpu", cores=2, law=Law("pool_eff", eta=0.8, psi=0.5))
    md = ModelOnDevice("n/a", {1: Dist.constant(0.006)}, demand={1: 1.0}, hop_s=0.002)
    assert handoff_share(info) == 0.5 and handoff_share(DeviceInfo("cpu", "cpu", cores=2)) == 1.0
    assert batch_demand(info, md, 1, None, handoff=1.0 * handoff_share(info)) == pytest.approx(5 / 6)
    assert batch_demand(info, md, 1, None) == 1.0  # no hand-off demand measured: the runner's alone
    assert device_law(info).speedup(2, 1.0) == device_law(DeviceInfo("cpu", "cpu", cores=2, law=Law(
        "pool_eff", eta=0.8))).speedup(2, 1.0)


def _hosted_profile(request_demand=1.0, dispatch=0.001, overhead=0.001):
    """The sleep model (6 ms, demand 1) whose requests' ways in and out (1 ms each) are work on the same 2 cores."""
    data = _demand_profile({"sleep_python": 1.0}).to_json()
    model = data["models"]["sleep_python"]
    model["request_demand"] = request_demand
    model["dispatch"] = {"constant_s": dispatch}
    model["overhead"] = {"constant_s": overhead}
    data["request_device"] = "cpu"
    return Profile.from_json(data, "p.json")


def test_requests_ways_in_and_out_share_the_cores():
    """A lone request: 1 ms in + 6 ms service + 1 ms out. Four closed-loop clients, four instances: every phase
    keeps a core busy, four chains on two cores run at half speed: each request takes 16 ms and the server answers
    2 / 8 ms = 250 requests per second — the cores, not the instances, are the limit. Without the ways in and out
    on the cores (plain delays, using no core) only the four services share them: 12 ms each, a 14 ms cycle, 286 per
    second — more than the cores allow."""
    config = one(max_batch_size=1, instances=(("cpu", 4),))
    lone = SimTarget(_hosted_profile(), config).run(poisson(1, 1))
    assert lone.table["done_s"][0] - lone.table["intended_s"][0] == pytest.approx(0.008)
    records = SimTarget(_hosted_profile(), config).run(poisson(1, 2000), _Closed(4, 1.0))
    latency = (records.table["done_s"] - records.table["sent_s"]).to_numpy()
    assert latency[8:-8] == pytest.approx(0.016) and len(records) == pytest.approx(250, abs=4)
    delays = _hosted_profile(request_demand=0.0)  # ways in and out that use no core: plain delays
    records = SimTarget(delays, config).run(poisson(1, 4000), _Closed(4, 1.0))
    assert len(records) == pytest.approx(4 / 0.014, abs=4)


def test_a_client_costing_more_cpu_per_request_takes_the_hosts_cores():
    """The profile above through a client costing 2 ms more host CPU per request: the way out grows to 3 ms, at
    demand (1 x 2 + 2) / (1 + 3) = 1, so a request is 10 ms of work on a core; four closed-loop chains on two cores:
    20 ms each, 2 / 10 ms = 200 requests per second (250 through the profile's own sender). By hand, the demand
    keeps the simulated CPU per request: 0.5 x 2 ms + 1 ms over 3 ms = 2/3; with the law's psi = 0.5, which scales
    the request demands, (0.5 x 1 x 2 ms + 1 ms) / (0.5 x 3 ms) = 4/3; a cheaper client (-0.5 ms) shortens the way
    out and keeps a demand of 1."""
    from serving_bench.sim.client import through_client

    config = one(max_batch_size=1, instances=(("cpu", 4),))
    profile = through_client(_hosted_profile(), 0.002)
    assert profile.models["sleep_python"].overhead.mean == pytest.approx(0.003)
    assert profile.models["sleep_python"].request_demand == pytest.approx(1.0)
    records = SimTarget(profile, config).run(poisson(1, 2000), _Closed(4, 1.0))
    latency = (records.table["done_s"] - records.table["sent_s"]).to_numpy()
    assert latency[8:-8] == pytest.approx(0.020) and len(records) == pytest.approx(200, abs=4)
    assert through_client(_hosted_profile(0.5), 0.001).models["sleep_python"].request_demand == pytest.approx(2 / 3)
    data = _hosted_profile().to_json()
    data["devices"]["cpu"]["law"] = {"name": "pool", "psi": 0.5}
    assert through_client(Profile.from_json(data, "p.json"), 0.001).models["sleep_python"].request_demand == \
        pytest.approx(4 / 3)
    data = _hosted_profile(0.5).to_json()  # an idle instance takes 0.5 ms of the way in to take up the payload:
    data["models"]["sleep_python"]["devices"]["cpu"]["pickup_s"] = 0.0005  # (0.5 x 1.5 ms + 1 ms) / 2.5 ms
    assert through_client(Profile.from_json(data, "p.json"), 0.001).models["sleep_python"].request_demand == \
        pytest.approx(1.75 / 2.5)
    cheaper = through_client(_hosted_profile(), -0.0005).models["sleep_python"]
    assert cheaper.overhead.mean == pytest.approx(0.0005) and cheaper.request_demand == pytest.approx(1.0)
    assert through_client(_hosted_profile(), 0.0) == _hosted_profile()


def _engines_agree_open_and_closed(profile, config, sched, closed, seed):
    """The fast engine and the SimPy reference give identical records of ``sched`` in open loop and in the closed
    loop ``closed``, both meeting the target contract."""
    for mode in (None, closed):
        fast = SimTarget(profile, config, seed=seed).run(sched, mode)
        assert fast.table.equals(SimTarget(profile, config, seed=seed, engine="simpy").run(sched, mode).table)
        assert_target_contract(sched, fast, closed_loop=mode is not None)


def test_hosted_requests_engines_agree_open_and_closed():
    data = _hosted_profile(request_demand=0.8).to_json()
    data["models"]["sleep_python"]["dispatch"] = {"samples_s": [0.0003, 0.0008, 0.002]}
    data["models"]["sleep_python"]["overhead"] = {"samples_s": [0.0002, 0.0005, 0.003]}
    profile = Profile.from_json(data, "p.json")
    config = one(max_batch_size=8, dynamic_batching=True, max_queue_delay_us=400, instances=(("cpu", 2),))
    _engines_agree_open_and_closed(profile, config, poisson(400, 3000, seed=11), _Closed(6, 2.0), seed=2)


def test_core_wait_probability_and_length_by_hand():
    """p = 0.5, slice 2 ms, 2 cores. Beside one long execution of demand 1 and nothing else (D = 1): q = 0.5 x 1 /
    max(2, 1) = 0.25, so a draw u = 0.1 waits (0.1 / 0.25) x 2 ms = 0.8 ms and u = 0.3 does not wait. With D = 4 of
    which 1 long: q = 0.5 / 4 = 0.125. Nothing long running: no wait whatever the rest."""
    from serving_bench.sim.spec import CoreWait

    wait = CoreWait(0.5, 0.002)
    assert wait.wait_s(1.0, 1.0, 2.0, 0.1) == pytest.approx(0.0008)
    assert wait.wait_s(1.0, 1.0, 2.0, 0.3) == 0.0
    assert wait.wait_s(4.0, 1.0, 2.0, 0.1) == pytest.approx(0.1 / 0.125 * 0.002)
    assert wait.wait_s(4.0, 1.0, 2.0, 0.13) == 0.0
    assert wait.wait_s(3.0, 0.0, 2.0, 0.0) == 0.0


def test_a_wait_after_quiet_time_by_hand():
    """p = 0.5, slice 2 ms, quiet time 4 ms: beside a long execution a phase after 4 ms of quiet waits with q = 0.5 x
    (1 - 1/e) = 0.316 whatever else runs (a draw u = 0.1 waits (0.1 / 0.316) x 2 ms), after none never; nothing
    long running, no wait. The host's recent quiet time is the weighted mean of the gaps between sends: with
    memory 1/2, gaps of 8 ms then 2 ms give 5 ms at the second send (open and closed loop alike)."""
    from serving_bench.sim.spec import CoreWait
    from serving_bench.sim.workload import Workload

    wait = CoreWait(0.5, 0.002, quiet_s=0.004, memory=0.5)
    q = 0.5 * (1 - math.exp(-1))
    assert wait.wait_s(1.0, 1.0, 2.0, 0.1, 0.004) == pytest.approx(0.1 / q * 0.002)
    assert wait.wait_s(4.0, 1.0, 2.0, 0.1, 0.004) == pytest.approx(0.1 / q * 0.002)  # crowded or not
    assert wait.wait_s(1.0, 1.0, 2.0, q + 0.01, 0.004) == 0.0
    assert wait.wait_s(1.0, 1.0, 2.0, 0.001, 0.0) == 0.0 and wait.wait_s(1.0, 0.0, 2.0, 0.001, 1.0) == 0.0
    profile = _waiting_profile(0.5, 0.002, wait_quiet_s=0.004, wait_quiet_memory=0.5)
    config = ServingConfig((ModelServing("long", max_batch_size=1), ModelServing("short", max_batch_size=1)))
    target = SimTarget(profile, config)
    assert target.spec.core_wait == wait
    times = np.array([0.0, 0.008, 0.010])
    work = Workload(target.spec, 0, [("model", 1)], np.zeros(3, dtype=np.int64), np.ones(3, dtype=np.int64), times)
    assert list(work.quiet_s) == pytest.approx([math.inf, 0.008, 0.005])


def _waiting_profile(wait_p=1.0, wait_s=0.002, **quiet):
    """On 2 cores: "long" (10 ms batches of demand 2: both cores) and "short" (1 ms batches of demand 1) whose
    requests' ways in and out (1 ms each, demand 0) run on the host and wait for a core behind long executions."""
    data = _demand_profile({"long": 2.0, "short": 1.0}, threads=2).to_json()
    data["models"]["long"]["devices"]["cpu"]["batches"] = {"1": {"constant_s": 0.010}}
    data["models"]["short"]["devices"]["cpu"]["batches"] = {"1": {"constant_s": 0.001}}
    data["models"]["short"]["devices"]["cpu"]["threads"] = 1
    short = data["models"]["short"]
    short["request_demand"] = 0.0
    short["dispatch"] = {"constant_s": 0.001}
    short["overhead"] = {"constant_s": 0.001}
    data["request_device"] = "cpu"
    data["devices"]["cpu"]["law"] = {"name": "pool", "wait_p": wait_p, "wait_s": wait_s, **quiet}
    return Profile.from_json(data, "p.json")


def test_the_wait_chance_follows_the_hosts_instances_in_all():
    """Measured 0.4 with 4 instances in all and 0.1 with 2: with 3 (one "long", two "short") 0.25, halfway; with 2
    or fewer 0.1 and with 4 or more 0.4 — flat outside what was measured, never extrapolated. A law measured at one
    count keeps its wait_p whatever the count; a law with only some of the three fields is refused."""
    from serving_bench.sim.spec import wait_chance

    by_count = {"wait_instances": 4, "wait_p_fewer": 0.1, "wait_instances_fewer": 2}
    law = Law(wait_p=0.4, **by_count)
    assert [wait_chance(law, n) for n in (1, 2, 3, 4, 8)] == pytest.approx([0.1, 0.1, 0.25, 0.4, 0.4])
    assert wait_chance(Law(wait_p=0.4), 3) == 0.4 and wait_chance(law, None) == 0.4
    profile = _waiting_profile(0.4, 0.002, **by_count)

    def chance(long: int, short: int) -> float:
        config = ServingConfig((ModelServing("long", max_batch_size=1, instances=(("cpu", long),)),
                                ModelServing("short", max_batch_size=1, instances=(("cpu", short),))))
        return SimTarget(profile, config).spec.core_wait.p

    assert chance(1, 1) == pytest.approx(0.1) and chance(1, 2) == pytest.approx(0.25)
    assert chance(2, 2) == pytest.approx(0.4) and chance(4, 4) == pytest.approx(0.4)
    data = profile.to_json()
    del data["devices"]["cpu"]["law"]["wait_p_fewer"]
    with pytest.raises(InputError, match=r"law.wait_p_fewer: missing"):
        Profile.from_json(data, "p.json")
    data["devices"]["cpu"]["law"].update(wait_p_fewer=0.1, wait_instances_fewer=4)
    with pytest.raises(InputError, match=r"law.wait_instances_fewer: expected less than wait_instances"):
        Profile.from_json(data, "p.json")
    data["devices"]["cpu"]["law"].update(wait_p_fewer=1.5, wait_instances_fewer=2)
    with pytest.raises(InputError, match=r"law.wait_p_fewer: expected a probability"):
        Profile.from_json(data, "p.json")


def test_the_waits_length_follows_the_hosts_quiet_between_the_two_measured_times():
    """A law measured at two quiet times (2 ms of recent quiet: waits up to 2 ms; 12 ms: up to 4 ms) draws a wait's
    length linear between them and flat outside (never extrapolated): at 7 ms up to 3 ms. A draw u below the chance
    q waits u / q of that length. The three fields come together, the busier quiet time first."""
    from serving_bench.sim.spec import core_wait

    law = Law("pool", wait_p=1.0, wait_s=0.002, wait_gap_s=0.002, wait_gap_quiet_s=0.012, wait_s_quiet=0.004)
    wait = core_wait(DeviceInfo("cpu", "cpu", cores=1, law=law))
    lengths = [wait.wait_s(1.0, 1.0, 1.0, 0.5, quiet) for quiet in (0.001, 0.002, 0.007, 0.012, 0.100)]
    assert lengths == pytest.approx([0.001, 0.001, 0.0015, 0.002, 0.002])
    assert core_wait(DeviceInfo("cpu", "cpu", cores=1, law=Law("pool", wait_p=1.0, wait_s=0.002))
                     ).wait_s(1.0, 1.0, 1.0, 0.5, 0.100) == pytest.approx(0.001)
    data = _waiting_profile().to_json()
    data["devices"]["cpu"]["law"].update(wait_gap_s=0.002, wait_s_quiet=0.004)
    with pytest.raises(InputError, match=r"law.wait_gap_quiet_s: missing"):
        Profile.from_json(data, "p.json")
    data["devices"]["cpu"]["law"].update(wait_gap_quiet_s=0.001)
    with pytest.raises(InputError, match=r"law.wait_gap_s: expected less than wait_gap_quiet_s"):
        Profile.from_json(data, "p.json")


def test_a_way_in_or_out_waits_for_a_core_behind_a_long_execution():
    """"long" starts at 0 and keeps both cores (D = D_long = 2, so q = p = 1: every phase of "short" beside it waits
    u x 2 ms, u its request's draw). "short" sent at 2 ms: waits W_in, 1 ms in, its batch (D = 3 on 2 cores: 1.5 ms),
    waits W_out, 1 ms out: answered at 5.5 ms + W_in + W_out, all before "long" ends. Without the wait: 5.5 ms. The
    long execution itself is not delayed by waiting phases (they use no core)."""
    config = ServingConfig((ModelServing("long", max_batch_size=1), ModelServing("short", max_batch_size=1)))
    sched = Schedule(np.array([0.0, 0.002]), np.array([0, 1]), ("long", "short"), np.zeros(2), np.ones(2), {})
    records = SimTarget(_waiting_profile(), config, seed=7).run(sched).table
    u_in, u_out = np.random.default_rng((7, 4)).random((2, 2))[1]  # the Workload's draws of request 1
    assert records["done_s"][1] == pytest.approx(0.0055 + 0.002 * (u_in + u_out))
    plain = SimTarget(_waiting_profile(wait_p=1e-12), config, seed=7).run(sched).table
    assert plain["done_s"][1] == pytest.approx(0.0055)
    assert records["done_s"][0] == pytest.approx(plain["done_s"][0])  # 10 ms + 1.5 ms x (1 - 1/1.5) stretched


def test_an_ensemble_travels_as_its_members_requests_and_each_step_waits_for_a_core():
    """The ensemble "pipe" (two steps of "short", one after the other) sent at 2 ms beside "long" (q = 1, as
    above): its way in is its first member's (waits W_in, 1 ms), each step's hand-off waits u x 2 ms (u its draw for
    that step) and runs 1.5 ms (D = 3 on 2 cores), its way out is its last member's (waits W_out, 1 ms): answered at
    7 ms + W_in + W_0 + W_1 + W_out, all before "long" ends. Without the wait: 7 ms."""
    config = ServingConfig((ModelServing("long", max_batch_size=1), ModelServing("short", max_batch_size=1)),
                           (("pipe", ("short", "short")),))
    deps = {"pipe": ((), (0,))}
    sched = Schedule(np.array([0.0, 0.002]), np.array([0, 1]), ("long", "pipe"), np.zeros(2), np.ones(2), {})
    done = SimTarget(_waiting_profile(), config, seed=7, ensemble_deps=deps).run(sched).table["done_s"]
    u_in, u_out = np.random.default_rng((7, 4)).random((2, 2))[1]  # the Workload's draws of request 1: its ways
    u_0, u_1 = np.random.default_rng((7, 5)).random((2, 2))[1]  # ... and its steps
    assert done[1] == pytest.approx(0.007 + 0.002 * (u_in + u_0 + u_1 + u_out))
    plain = SimTarget(_waiting_profile(wait_p=1e-12), config, seed=7, ensemble_deps=deps).run(sched).table
    assert plain["done_s"][1] == pytest.approx(0.007)
    # the wait's chance from the host's quiet (2 ms since the last send, against a quiet time of 1 us: q = p = 1):
    # each step's hand-off wakes its member's thread and waits as the way in does; the way out follows the server's
    # work and never waits
    quiet = SimTarget(_waiting_profile(wait_quiet_s=1e-6), config, seed=7,
                      ensemble_deps=deps).run(sched).table
    assert quiet["done_s"][1] == pytest.approx(0.007 + 0.002 * (u_in + u_0 + u_1))
    busy = SimTarget(_waiting_profile(0.6, 0.003), config, seed=4, ensemble_deps=deps)
    sched = poisson(200, 2000, seed=8, models=("long", "pipe"))
    for mode in (None, _Closed({"long": 1, "pipe": 3}, 1.0)):  # both engines, open and closed loop
        reference = SimTarget(busy.profile, config, seed=4, ensemble_deps=deps, engine="simpy").run(sched, mode)
        assert busy.run(sched, mode).table.equals(reference.table)


@pytest.mark.parametrize("quiet", [{}, {"wait_quiet_s": 0.004, "wait_quiet_memory": 0.125}])
def test_core_waits_engines_agree_open_and_closed(quiet):
    profile = _waiting_profile(wait_p=0.6, wait_s=0.003, **quiet)
    config = ServingConfig((ModelServing("long", max_batch_size=2, dynamic_batching=True),
                            ModelServing("short", max_batch_size=8, dynamic_batching=True, instances=(("cpu", 2),))))
    data = profile.to_json()
    data["models"]["long"]["devices"]["cpu"]["batches"]["2"] = {"constant_s": 0.018}
    data["models"]["short"]["devices"]["cpu"]["batches"]["8"] = {"samples_s": [0.0015, 0.002, 0.004]}
    profile = Profile.from_json(data, "p.json")
    _engines_agree_open_and_closed(profile, config, poisson(300, 3000, seed=5, models=("long", "short")),
                                   _Closed({"long": 1, "short": 4}, 1.0), seed=3)


def test_a_wait_probability_above_one_is_refused():
    data = _waiting_profile().to_json()
    data["devices"]["cpu"]["law"]["wait_p"] = 1.5
    with pytest.raises(InputError, match=r"^p\.json: devices\.cpu\.law\.wait_p: expected a probability in \(0, 1\]$"):
        Profile.from_json(data, "p.json")


def _pickup_profile(pickup_s=0.001, hog=True):
    """On 2 cores: "a" (2 ms batches that use no core: a sleep) whose idle instance takes ``pickup_s`` to take up a
    payload, and "hog" (100 ms batches of demand 4: four threads on two cores)."""
    data = _demand_profile({"a": 0.0, "hog": 4.0}, threads=4).to_json()
    data["models"]["a"]["devices"]["cpu"]["batches"] = {"1": {"constant_s": 0.002}, "8": {"constant_s": 0.002}}
    data["models"]["a"]["devices"]["cpu"]["pickup_s"] = pickup_s
    data["models"]["hog"]["devices"]["cpu"]["batches"] = {"1": {"constant_s": 0.100}}
    return Profile.from_json(data, "p.json")


def _a_config():
    return ServingConfig((ModelServing("a", max_batch_size=8, dynamic_batching=True),
                          ModelServing("hog", max_batch_size=1)))


def test_a_payload_grows_while_its_instance_takes_it_up():
    """Pickup 1 ms. Request 0 at 0: the idle instance takes its payload up from 0 to 1 ms; request 1 at 0.5 ms
    joins it, so both run in one batch, 1 to 3 ms. Request 2 at 1.5 ms finds the payload executing: a new one, taken
    up when the instance frees at 3 ms, run from 4 to 6 ms. Without the take-up: 0-2 ms, 2-4 ms (1 and 2 together)."""
    sched = Schedule(np.array([0.0, 0.0005, 0.0015]), np.zeros(3, dtype=np.int32), ("a",), np.zeros(3), np.ones(3),
                     {})
    table = SimTarget(_pickup_profile(), _a_config()).run(sched).table
    assert table["done_s"].tolist() == pytest.approx([0.003, 0.003, 0.006])
    assert table["exec_batch"].tolist() == [2, 2, 1]
    table = SimTarget(_pickup_profile(pickup_s=0.0), _a_config()).run(sched).table
    assert table["done_s"].tolist() == pytest.approx([0.002, 0.004, 0.004])


def test_taking_up_a_payload_waits_for_a_core():
    """"hog" keeps D = 4 on 2 cores (stretch 2) from 0: "a"'s take-up (a thread waking up, CPU-bound, no demand of
    its own) takes 2 ms instead of 1, its sleep does not stretch: answered 4 ms after it arrived instead of 3."""
    sched = Schedule(np.array([0.0, 0.001]), np.array([1, 0]), ("a", "hog"), np.zeros(2), np.ones(2), {})
    table = SimTarget(_pickup_profile(), _a_config()).run(sched).table
    assert table["done_s"][1] - 0.001 == pytest.approx(0.004)
    alone = Schedule(np.array([0.001]), np.zeros(1, dtype=np.int32), ("a",), np.zeros(1), np.ones(1), {})
    assert SimTarget(_pickup_profile(), _a_config()).run(alone).table["done_s"][0] - 0.001 == pytest.approx(0.003)


@pytest.mark.parametrize("law", [None, {"name": "pool_eff", "eta": 0.9, "queue": 1.0},
                                 {"name": "pool_eff", "eta": 0.9, "queue": 1.0, "wait_p": 0.6, "wait_s": 0.003}])
def test_pickup_engines_agree_open_and_closed(law):
    """Take-ups on a busy host: stretched (no law given), or queued for a core by the run queue (with and without
    the wait behind long executions)."""
    data = _pickup_profile().to_json()
    data["models"]["a"]["devices"]["cpu"]["demand"] = {"1": 0.7, "8": 0.9}
    data["models"]["a"]["devices"]["cpu"]["batches"]["8"] = {"samples_s": [0.003, 0.004, 0.006]}
    data["models"]["a"]["devices"]["cpu"]["handoff_cpu_s"] = 0.0005
    data["models"]["a"]["devices"]["cpu"]["hop_s"] = 0.0003
    data["models"]["a"]["request_demand"] = 0.6
    data["models"]["a"]["dispatch"] = {"samples_s": [0.0009, 0.0012, 0.003]}
    data["request_device"] = "cpu"
    if law is not None:
        data["devices"]["cpu"]["law"] = law
    profile = Profile.from_json(data, "p.json")
    config = ServingConfig((ModelServing("a", max_batch_size=8, dynamic_batching=True, instances=(("cpu", 3),)),
                            ModelServing("hog", max_batch_size=1)))
    if law is not None:  # queued, then a core of its own
        assert SimTarget(profile, config).spec.devices["cpu"].kinds[(0, -1)].phi == 0.0
    _engines_agree_open_and_closed(profile, config, poisson(900, 4000, seed=21, models=("a", "hog")),
                                   _Closed({"a": 6, "hog": 1}, 1.0), seed=6)


def _ends(device, jobs):
    """Drive ``device`` alone: ``jobs`` are (time, work, kind) in time order; the end time of each, by its index."""
    ends, now, k = {}, 0.0, 0
    while k < len(jobs) or device.jobs:
        nxt = device.next_completion(now)
        if k < len(jobs) and jobs[k][0] <= nxt:
            now = jobs[k][0]
            device.add(now, jobs[k][1], jobs[k][2], k, None, -1, -1)
            k += 1
            continue
        now = nxt
        ends.update((job.seq, now) for job in device.pop_finished(now))
    return [ends[i] for i in range(len(jobs))]


def test_a_take_up_waits_in_the_run_queue_while_the_cores_are_taken_by_short_work():
    """2 cores. Two 2 ms batches of demand 1 from 0 take both. An instance's take-up (1 ms, no demand of its own,
    CPU-bound) comes at 0.5 ms: processor sharing keeps D = 2, no stretch, it ends at 1.5 ms. With the run queue
    (``queue`` 1, ``eta`` 1: the gate at 2 cores) it waits until the batches end at 2 ms: 3 ms; at ``eta`` 1.25 the
    gate is at 2.5 and it does not wait. Behind long executions (more than ``long_s``) it does not wait: 1.5 ms
    again. A way in (1 ms, demand 1) never queues: D = 3 from 0.5 ms, it ends at 0.5 + 1.5 = 2 ms, the batches
    (1 ms of their last 1.5 done by 2 ms) at 2.5 ms."""
    from serving_bench.sim.device import Device, Kind, Law
    batch, take_up, way = Kind("batch", 0, 1, 1.0), Kind("take-up", 0, -1, 0.0, phi=1.0), Kind("way", 1, 0, 1.0)
    jobs = [(0.0, 0.002, batch), (0.0, 0.002, batch), (0.0005, 0.001, take_up)]
    assert _ends(Device("cpu", Law("pool", 2)), jobs) == pytest.approx([0.002, 0.002, 0.0015])
    assert _ends(Device("cpu", Law("pool", 2, queue=1.0)), jobs) == pytest.approx([0.002, 0.002, 0.003])
    assert _ends(Device("cpu", Law("pool_eff", 2, eta=1.25, queue=1.0)), jobs) == \
        pytest.approx([0.002, 0.002, 0.0015])
    long_ones = Device("cpu", Law("pool", 2, queue=1.0), long_s=0.001)
    assert _ends(long_ones, jobs) == pytest.approx([0.002, 0.002, 0.0015])
    jobs[2] = (0.0005, 0.001, way)
    assert _ends(Device("cpu", Law("pool", 2, queue=1.0)), jobs) == pytest.approx([0.0025, 0.0025, 0.002])


def test_a_profiles_law_is_parsed_once_typed_and_run_by_the_engine():
    """A profile's ``law`` object becomes a frozen :class:`Law` (numbers as floats, the parameters its name does not
    take dropped), writes back the same object, and the engine runs its name and throughput parameters; parameters
    it does not name take the vocabulary's defaults, and a device without a law is shared by its kind's default. Bad
    laws are one-line input errors naming the field."""
    from serving_bench.sim.spec import core_wait, device_law, handoff_share

    data = {"name": "pool_eff", "eta": 0.8, "queue": 1, "psi": 0.5, "wait_p": 0.1, "wait_s": 0.003}
    law = Law.from_json({**data, "power": 2.0}, "p.json", "devices.cpu.law")
    assert law == Law("pool_eff", eta=0.8, queue=1.0, psi=0.5, wait_p=0.1, wait_s=0.003)
    assert law.to_json() == {**data, "queue": 1.0} and list(law.to_json()) == ["name", "eta", "psi", "wait_p",
                                                                               "wait_s", "queue"]
    assert law.value("drift") == 0.0 and law.value("wait_quiet_memory") == 1.0 and law.value("power") == 8.0
    named = DeviceInfo("cpu", "cpu", cores=2, law=law)
    engine = device_law(named)
    assert (engine.name, engine.eta, engine.queue, engine.scale) == ("pool_eff", 0.8, 1.0, 1.6)
    assert handoff_share(named) == 0.5 and core_wait(named, 4).p == 0.1 and core_wait(named).quiet_s == 0.0
    assert DeviceInfo("gpu0", "gpu").sharing == Law("serial") and DeviceInfo("cpu", "cpu", cores=2).sharing == Law()
    assert device_law(DeviceInfo("gpu0", "gpu")).name == "serial" and core_wait(DeviceInfo("gpu0", "gpu")) is None
    for bad, line in (({"name": "fast"}, "p.json: law.name: expected one of pool, pool_eff, soft, none, serial"),
                      ({"name": "soft", "eta": 0.9}, "p.json: law.power: missing; the soft law needs it"),
                      ({"name": "pool", "psi": 0}, "p.json: law.psi: expected a number > 0"),
                      ({"name": "pool", "drift": 2}, "p.json: law.drift: expected a number in (0, 1]"),
                      ({"name": "pool", "eta": 0.5, "queue": "1"}, "p.json: law.queue: expected a finite number")):
        with pytest.raises(InputError) as err:
            Law.from_json(bad, "p.json", "law")
        assert err.value.line().startswith(line)
    with pytest.raises(ValueError, match="law.eta: missing; the pool_eff law needs it"):
        Law("pool_eff")
    with pytest.raises(ValueError, match="law.eta: not a parameter of the pool law"):
        Law("pool", eta=0.5)


def test_a_law_is_fitted_from_colocated_runs_and_chosen_by_held_out_error():
    """Observations made with an effective capacity of 70 % of two cores: fitting pool_eff recovers eta = 0.7; on
    held-out observations the fitted law beats plain processor sharing (which has nothing to fit)."""
    from serving_bench.sim.interference import (Observation, Simulations, fit, leave_one_out, predict, tail_error,
                                                with_law)

    truth = with_law(_demand_profile({"a": 1.0, "b": 1.0}), "cpu", Law("pool_eff", eta=0.7))
    runs = []
    for instances in ({"a": 1, "b": 1}, {"a": 2, "b": 0}, {"a": 2, "b": 2}, {"a": 3, "b": 1}):
        models = {m: k for m, k in instances.items() if k}
        serving = {m: ModelServing(m, instances=(("cpu", k),)) for m, k in models.items()}
        obs = Observation("cpu", serving, models, {})
        runs.append(dataclasses.replace(obs, measured_rps=predict(truth, obs)))
    base = _demand_profile({"a": 1.0, "b": 1.0})
    law, err = fit(base, "cpu", runs, "pool_eff")
    assert law.eta == pytest.approx(0.7, abs=0.02) and err < 0.01
    assert fit(base, "cpu", runs, "pool_eff", workers=2) == (law, err)  # the same simulations, in two processes
    tails = [dataclasses.replace(obs, measured_p99={m: 0.01 for m in obs.clients}) for obs in runs]
    with Simulations(base, "cpu", workers=2) as parallel:
        assert parallel.error(law, tails, tail=True) == Simulations(base, "cpu").error(law, tails, tail=True) == \
            tail_error(with_law(base, "cpu", law), tails) > 0
    held_out = leave_one_out(base, "cpu", runs, ("pool", "pool_eff"))
    assert held_out["pool_eff"] < 0.02 < held_out["pool"]
    assert Observation.from_json(runs[0].to_json()) == runs[0]
    tail = dataclasses.replace(runs[0], measured_p99={"a": 0.012})
    assert Observation.from_json(tail.to_json()) == tail


def test_a_law_pinned_on_a_bound_of_its_range_marks_the_profile_uncertain():
    """Runs made at a tenth of two cores' capacity (what a disturbed machine measures) are slower than any eta in
    0.25..1.5 explains: the fit ends on the lower bound, and the profile's note says so although the mean error
    alone stays under the warning's threshold; a fit inside the range says nothing."""
    from serving_bench.calibrate.calibration import FIT_WARNING, UNCERTAIN_NOTE, fit_warning
    from serving_bench.sim.interference import ETA_RANGE, Observation, fit, pinned, predict, with_law

    def runs(eta: float) -> list:
        truth = with_law(_demand_profile({"a": 1.0, "b": 1.0}), "cpu", Law("pool_eff", eta=eta))
        out = []
        for instances in ({"a": 2, "b": 2}, {"a": 3, "b": 1}):
            serving = {m: ModelServing(m, instances=(("cpu", k),)) for m, k in instances.items()}
            obs = Observation("cpu", serving, instances, {})
            out.append(dataclasses.replace(obs, measured_rps=predict(truth, obs)))
        return out

    base = _demand_profile({"a": 1.0, "b": 1.0})
    law, err = fit(base, "cpu", runs(0.1), "pool_eff")
    assert law.eta == pytest.approx(ETA_RANGE[0], abs=0.01) and pinned(law) == {"eta": ETA_RANGE}
    note = fit_warning(law, min(err, FIT_WARNING))
    assert note.startswith(f"{UNCERTAIN_NOTE} with eta 0.25") and "on a bound of its range 0.25..1.5" in note
    law, err = fit(base, "cpu", runs(0.7), "pool_eff")
    assert not pinned(law) and fit_warning(law, err) is None
    assert fit_warning(law, 2 * FIT_WARNING).startswith(f"{UNCERTAIN_NOTE} by 50 % on average")


def test_a_wait_for_a_core_is_fitted_on_the_runs_that_do_not_outnumber_the_cores():
    """On 2 cores: a model alone with 2 clients and a pair with one each are kept; all four models with 2 clients
    each (8 threads queueing for 2 cores) are not. With only such runs, all are kept."""
    from serving_bench.sim.interference import Observation, tail_runs

    profile = _demand_profile({"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0})
    def run(clients):
        return Observation("cpu", {m: ModelServing(m) for m in clients}, clients, {m: 100.0 for m in clients})
    alone, pair, crowd = run({"a": 2}), run({"a": 1, "b": 1}), run({m: 2 for m in "abcd"})
    assert tail_runs(profile, "cpu", [alone, pair, crowd]) == [alone, pair]
    assert tail_runs(profile, "cpu", [crowd]) == [crowd]


def test_an_open_loop_run_calibrates_the_wait_and_not_the_throughput():
    """An open-loop observation (Poisson arrivals at given rates, replayed from its seed) is kept with the light runs
    the wait is fitted on, crowd or not, and left out where throughputs are compared (its throughput is its offered
    load); its p99 is the simulation of its own schedule, which the wait for a core lengthens."""
    from serving_bench.sim.interference import (Observation, closed, error, leave_one_out, open_schedule,
                                                simulated_p99, tail_error, tail_runs, with_law)

    schedule = open_schedule({"long": 20.0, "short": 200.0}, 5.0, 3)
    assert schedule.equals(open_schedule({"short": 200.0, "long": 20.0}, 5.0, 3))  # one schedule per seed
    assert not schedule.equals(open_schedule({"long": 20.0, "short": 200.0}, 5.0, 4))
    counts = np.bincount(schedule.model, minlength=2)
    assert schedule.models == ("long", "short") and abs(counts[1] - 1000) < 4 * 1000 ** 0.5
    assert (np.diff(schedule.arrival_s) >= 0).all() and set(schedule.batch) == {1}
    profile = _waiting_profile(0.5, 0.004)
    serving = {m: ModelServing(m, max_batch_size=1) for m in ("long", "short")}
    light = Observation("cpu", serving, {}, {"long": 20.0, "short": 200.0}, rates={"long": 20.0, "short": 200.0},
                        seconds=5.0, seed=3)
    crowd = Observation("cpu", serving, {"long": 3, "short": 3}, {"long": 50.0, "short": 500.0})
    assert Observation.from_json(light.to_json()) == light
    assert tail_runs(profile, "cpu", [crowd, light]) == [light] and closed([crowd, light]) == [crowd]
    assert error(profile, [crowd, light]) == error(profile, [crowd])
    assert set(leave_one_out(profile, "cpu", [crowd, light], ("pool",))) == {"pool"}
    records = SimTarget(profile, ServingConfig(tuple(serving.values())), seed=0).run(schedule)
    ok = records.table[records.table["status"].astype(str) == "ok"]
    short = ok[ok["model"].astype(str) == "short"]
    waited = simulated_p99(profile, dataclasses.replace(light, seed=3))["short"]
    assert waited == pytest.approx(float(np.percentile(short["done_s"] - short["sent_s"], 99)))
    plain = with_law(profile, "cpu", Law("pool", wait_p=1e-9, wait_s=0.004))
    assert simulated_p99(plain, light)["short"] < waited  # the wait lengthens the tail
    measured = dataclasses.replace(light, measured_p99={"short": waited})
    assert tail_error(profile, [measured]) == 0.0 < tail_error(plain, [measured])


def test_the_engines_recent_mean_is_the_profiles_float_for_float():
    """``state.recent_mean`` (the engine's step, compiled) gives what ``distributions.recent_means`` gives, one value
    at a time: started by the first finite value (after inf and nan), the last value alone with memory 1."""
    from serving_bench.profiles.distributions import recent_means
    from serving_bench.sim.state import recent_mean

    values = [math.inf, math.nan, 0.002, 0.0007, 0.031, 0.0001, 0.064, 0.0033]
    for memory in (0.125, 0.5, 1.0):
        mean, stepped = math.inf, []
        for value in values:
            mean = recent_mean(mean, value, memory)
            stepped.append(mean)
        expected = recent_means(values, memory)
        assert all(a == b or (a != a and b != b) for a, b in zip(stepped, expected)), (memory, stepped, expected)
    assert recent_means(values, 1.0)[2:] == values[2:]


def test_the_engines_cold_start_curve_is_the_profiles_interpolation():
    """``state.Piecewise`` (the engine's typed copy) gives what ``distributions.interp`` gives, float for float:
    inside, at the points, beyond both ends and after an idle of inf (an instance never busy)."""
    from serving_bench.profiles.distributions import interp
    from serving_bench.sim.state import Piecewise

    xs, ys = (0.0003, 0.0021, 0.008, 0.0318, 0.0636), (0.0, 0.00015, 0.00031, 0.00059, 0.00068)
    curve = Piecewise(xs, ys)
    for x in [0.0, *xs, *np.random.default_rng(3).random(500) * 0.08, math.inf]:
        assert curve.at(float(x)) == interp(float(x), xs, ys)


def test_one_draw_at_a_time_is_what_numpy_draws_for_an_array():
    """A closed loop draws each request's way in and out one float at a time (``interp_one``, no array call); those
    floats are numpy's, bit for bit: on a quantile grid, a constant one, a cold-start curve with its tail, at the
    points, between them, beyond both ends, at inf and NaN."""
    from serving_bench.sim.workload import Grid, cold_extra, interp_one

    rng = np.random.default_rng(7)
    values = np.sort(rng.gamma(2.0, 1e-4, 257))
    u = np.concatenate([rng.random(2000), np.linspace(0.0, 1.0, 257), [0.0, 1.0, -0.5, 1.5]])
    for grid in (Grid(values), Grid(np.full(257, 3e-4))):
        assert np.array_equal(np.array([grid(float(x)) for x in u]), grid(u))
        assert all(type(grid(float(x))) is float for x in u[:3])
    gaps, median, p90 = (0.0003, 0.0021, 0.008, 0.0318), (0.0, 0.00015, 0.00031, 0.00059), (0.0, 0.0002, 0.0005, 1e-3)
    since = np.concatenate([rng.random(2000) * 0.04, gaps, [0.0, math.inf]])
    draws = rng.random(len(since))
    for tail in (p90, ()):
        one = np.array([cold_extra(float(g), float(d), gaps, median, tail) for g, d in zip(since, draws)])
        assert np.array_equal(one, cold_extra(since, draws, gaps, median, tail))
    assert np.isnan(interp_one(math.nan, gaps, median)) and np.isnan(np.interp(math.nan, gaps, median))
    assert interp_one(0.005, (0.005,), (2.0,)) == np.interp(0.005, (0.005,), (2.0,)) == 2.0


def test_an_observation_is_simulated_long_enough_for_its_slowest_model():
    """A 300 ms model measured at 1 / 0.3 s = 3.33 req/s: half a simulated second holds one answer (2 req/s, a 40 %
    error from the start alone); the simulated time grows to 20 answers (6 s), capped at 5 s: 16 answers, -4 %. A
    fast model keeps the half second; a p99 asks for 100 answers, in a second at least."""
    from serving_bench.sim.interference import Observation, error, predict, sim_seconds

    slow = sleep_profile(base=0.299, per=0.001)
    obs = Observation("cpu", {"sleep_python": ModelServing("sleep_python")}, {"sleep_python": 1},
                      {"sleep_python": 1 / 0.3})
    assert predict(slow, obs, seconds=0.5)["sleep_python"] == pytest.approx(2.0)
    assert sim_seconds(obs) == 5.0 and predict(slow, obs)["sleep_python"] == pytest.approx(16 / 5)
    assert error(slow, [obs]) == pytest.approx(abs(math.log(3.2 * 0.3)))
    fast = dataclasses.replace(obs, measured_rps={"sleep_python": 160.0})
    assert sim_seconds(fast) == 0.5 and sim_seconds(fast, tail=True) == 1.0  # at least a second for a p99
    assert sim_seconds(dataclasses.replace(obs, measured_rps={"sleep_python": 50.0}), tail=True) == 2.0


def test_both_targets_implement_the_target_protocol():
    target = SimTarget(sleep_profile(), one(max_batch_size=1))
    assert isinstance(target, Target) and isinstance(TritonTarget("127.0.0.1:1"), Target)
    sched = poisson(50, 20)
    assert target.run(sched, OpenLoop()).table.equals(target.run(sched).table)
    closed = target.run(sched, ClosedLoop(concurrency=1, duration_s=0.05))
    assert closed.info.mode == "closed" and closed.info.concurrency == {"sleep_python": 1}


def test_simulate_command_runs_a_closed_loop(tmp_path, capsys):
    """``simulate --concurrency N``: N clients per model, as ``replay --concurrency N`` on Triton."""
    from serving_bench.cli import main as cli
    from serving_bench.run.records import load_records

    profile = tmp_path / "p.json"
    sleep_profile().save(profile)
    load = tmp_path / "l.yaml"
    # a closed loop takes the schedule's requests in order, whatever their times: the load must hold enough of them
    load.write_text("name: c\nduration: 2s\nseed: 1\nmodels:\n  sleep_python: {rate: 1000}\n")
    assert cli(["simulate", str(load), "--profile", str(profile), "--out", str(tmp_path / "out"),
                "--concurrency", "3"]) == 0
    records = load_records(tmp_path / "out")
    assert records.info.mode == "closed" and records.info.concurrency == {"sleep_python": 3}
    # three clients on one instance that batches them (the config a profile implies: dynamic batching up to its
    # largest measured size): it never idles, a batch of 3 every 5 + 3 x 1 ms, 3 x 2 s / 8 ms answers
    assert len(records.table) == pytest.approx(3 * 2.0 / 0.008, abs=4)
    assert cli(["simulate", str(load), "--profile", str(profile), "--out", str(tmp_path / "bad"),
                "--concurrency", "0"]) == 2


def _simulate_sleep(tmp_path, profile: Profile, instances: int, *args: str) -> tuple[int, dict | None, Path]:
    """``serving-bench simulate`` of 2 s of one-row sleep_python requests on ``instances`` instances (max batch 1)
    from ``profile``, with ``args``: its exit status, its summary of sleep_python (None where it wrote none) and its
    output folder."""
    from serving_bench.cli import main as cli

    profile.save(tmp_path / "p.json")
    (tmp_path / "l.yaml").write_text("name: c\nduration: 2s\nseed: 1\nmodels:\n  sleep_python: {rate: 1000}\n")
    (tmp_path / "serving.yaml").write_text(
        f"models:\n  sleep_python: {{max_batch_size: 1, instances: [[cpu, {instances}]]}}\n")
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
    code = cli(["simulate", str(tmp_path / "l.yaml"), "--profile", str(tmp_path / "p.json"), "--config",
                str(tmp_path / "serving.yaml"), "--out", str(out), *args])
    summary = out / "summary.json"
    return code, json.loads(summary.read_text())["models"]["sleep_python"] if summary.exists() else None, out


def test_simulate_command_through_another_client(tmp_path):
    """``simulate --client-cpu-us 2000``: the hosted profile above through a client costing 2 ms more host CPU per
    request, four clients on four instances and two cores: 20 ms and 200 answers per second instead of 16 ms and 250
    (worked above)."""
    answered = {us: _simulate_sleep(tmp_path, _hosted_profile(), 4, "--concurrency", "4", "--client-cpu-us", us)[1]
                for us in ("0", "2000")}
    assert answered["0"]["p50_s"] == pytest.approx(0.016) and answered["2000"]["p50_s"] == pytest.approx(0.020)
    assert answered["0"]["throughput_rps"] == pytest.approx(250, abs=5)
    assert answered["2000"]["throughput_rps"] == pytest.approx(200, abs=5)
    code, _, out = _simulate_sleep(tmp_path, _hosted_profile(), 4, "--client-cpu-us", "nan")
    assert code == 2 and not out.exists()


def test_simulate_command_takes_the_threads_per_instance_the_server_would(tmp_path):
    """``simulate --threads-per-instance N`` as ``serve --threads-per-instance N``: two instances of
    :func:`_two_thread_profile`, one client: 8 ms by default (one thread each on 2 cores), 5 ms told 2 threads;
    0 threads is a one-line input error, nothing written."""
    for args, expected in (((), 0.008), (("--threads-per-instance", "2"), 0.005)):
        summary = _simulate_sleep(tmp_path, _two_thread_profile(), 2, "--concurrency", "1", *args)[1]
        assert summary["p50_s"] == pytest.approx(expected)
    code, _, out = _simulate_sleep(tmp_path, _two_thread_profile(), 2, "--threads-per-instance", "0")
    assert code == 2 and not out.exists()


# -- the host's speed drifts (sim/drift.py) -----------------------------------------------------------------------

DRIFT = {"in_service": 0.48, "in_out": 0.5, "service_out": 0.42, "service_by_lag_ms": {"0.5": 0.64, "5": 0.32}}


def test_drift_loadings_and_time_correlation_by_hand():
    """Services 0.5 ms apart correlate by 0.64: the service's loading is sqrt(0.64) = 0.8; the ways' loadings give
    their correlations with the service, 0.48 / 0.8 = 0.6 and 0.42 / 0.8 = 0.525. The latent's correlation: 1 at 0,
    0.64 / 0.64 = 1 at 0.5 ms, 0.32 / 0.64 = 0.5 at 5 ms, which the fitted two exponentials pass near."""
    from serving_bench.sim.drift import fit_drift

    host, loadings = fit_drift({"m": DRIFT, "quiet": {"service_by_lag_ms": {"0.5": -0.1}}})
    assert set(loadings) == {"m"}  # a model whose services do not correlate follows nothing
    assert (loadings["m"].way_in, loadings["m"].service, loadings["m"].way_out) == pytest.approx((0.6, 0.8, 0.525))
    assert host.correlation([0.0005, 0.005]) == pytest.approx([1.0, 0.5], abs=0.1)
    assert fit_drift({}) == (None, {})
    bad = _drifting_profile().to_json()
    bad["devices"]["cpu"]["law"]["drift"] = 1.5
    with pytest.raises(InputError, match=r"devices\.cpu\.law\.drift: expected a number in \(0, 1\]"):
        Profile.from_json(bad, "p.json")


def test_drift_latent_has_its_correlation_and_keeps_every_marginal():
    """The latent on its grid: mean 0, variance 1, correlation r(L) at a lag (within sampling noise); a draw that
    follows it stays uniform, and two draws at the same instant with loading 0.8 correlate by 0.64 (normal scores)."""
    from scipy.special import ndtri

    from serving_bench.sim.drift import GRID_STEP_S, HostDrift, at, follow

    host = HostDrift(0.8, 0.004, 0.025)
    z = host.latent(3)
    assert abs(z.mean()) < 0.05 and z.var() == pytest.approx(1.0, abs=0.1)
    lag = 10  # 5 ms
    assert np.corrcoef(z[:-lag], z[lag:])[0, 1] == pytest.approx(float(host.correlation(lag * GRID_STEP_S)), abs=0.05)
    assert np.array_equal(host.latent(3), z) and not np.array_equal(host.latent(4), z)
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 60, 20000)
    a, b = (follow(rng.random(len(t)), at(z, t), 0.8) for _ in range(2))
    assert np.quantile(a, [0.1, 0.5, 0.9]) == pytest.approx([0.1, 0.5, 0.9], abs=0.02)
    assert np.corrcoef(ndtri(a), ndtri(b))[0, 1] == pytest.approx(0.64, abs=0.03)
    assert np.array_equal(follow(a, at(z, t), 0.0), a)


def _drifting_profile(drift=DRIFT, hosted=False, share=1.0):
    """The sleep model with a short, wide service (0.2-1 ms at batch 1, as a tiny model's) whose profile measured a
    drift, followed at ``share`` of its loadings (the law's ``drift`` on the host)."""
    data = (_hosted_profile(request_demand=0.5) if hosted else sleep_profile()).to_json()
    model = data["models"]["sleep_python"]
    model["devices"]["cpu"]["batches"] = {"1": {"samples_s": list(np.linspace(0.0002, 0.001, 41))},
                                          "8": {"samples_s": list(np.linspace(0.0008, 0.0024, 41))}}
    if hosted:
        model["dispatch"] = {"samples_s": [0.0003, 0.0008, 0.002]}
        model["overhead"] = {"samples_s": [0.0002, 0.0005, 0.003]}
    if drift is not None:
        model["drift"] = drift
    data["request_device"] = "cpu"
    data["devices"]["cpu"]["law"] = {"name": "pool", "drift": share}
    return Profile.from_json(data, "p.json")


def test_services_follow_the_hosts_speed_keep_their_marginal_and_queue_longer():
    """Requests far apart (20 per second on one instance: none queues) see each service's measured distribution with
    the drift as without it. At 0.8 load the services close in time (a dozen within the latent's 8 ms) are slow
    together, and the queue behind a slow patch lengthens the tail: a p99 well above that of independent draws."""
    config = one(max_batch_size=1)

    def latency(profile, rate):
        records = SimTarget(profile, config, seed=1).run(poisson(rate, 20000, seed=5)).table
        return (records["done_s"] - records["intended_s"]).to_numpy()

    sparse = latency(_drifting_profile(), 20), latency(_drifting_profile(drift=None), 20)
    assert np.quantile(sparse[0], [0.1, 0.5, 0.9]) == pytest.approx(np.quantile(sparse[1], [0.1, 0.5, 0.9]), rel=0.03)
    loaded = [latency(p, 0.8 / 0.0006) for p in (_drifting_profile(), _drifting_profile(drift=None),
                                                  _drifting_profile(share=0.5))]
    assert np.quantile(loaded[0], 0.99) > 1.2 * np.quantile(loaded[1], 0.99)
    assert np.quantile(loaded[1], 0.99) < np.quantile(loaded[2], 0.99) < np.quantile(loaded[0], 0.99)
    host = SimTarget(_drifting_profile(share=0.5), config).spec
    assert host.models[0].drift.service == pytest.approx(0.4) and host.drift is not None


def test_drift_engines_agree_open_and_closed():
    profile = _drifting_profile(hosted=True)
    config = one(max_batch_size=8, dynamic_batching=True, max_queue_delay_us=400, instances=(("cpu", 2),))
    _engines_agree_open_and_closed(profile, config, poisson(400, 3000, seed=11), _Closed(6, 2.0), seed=2)
