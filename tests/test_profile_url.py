"""``profile --url`` against any Triton: the statistics extension's counters per run and batch size, service and ways
from them alone, samples from sums (paced runs), the host CPU of a server on this machine split over the runs, model
control for co-location; and (server, slow) the embedded server profiled as if it were external, its predictions
against the embedded profile's, the tolerance the embedded profile's own repeatability measured in the same test."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from serving_bench.calibrate.runs import LoopRun
from serving_bench.serve.control import COMPUTE_PHASES, ModelTimes


def _times(by_batch, queue=(0, 0), success=(0, 0)):
    """ModelTimes from ``{batch: (executions, compute ns)}`` (all of it in compute_infer)."""
    phases = {b: {p: ((n, ns) if p == "compute_infer" else (n, 0)) for p in COMPUTE_PHASES}
              for b, (n, ns) in by_batch.items()}
    inferences = sum(b * n for b, (n, _) in by_batch.items())
    return ModelTimes(phases, queue, success, inferences, sum(n for n, _ in by_batch.values()))


def test_the_counters_of_a_run_are_their_difference_per_batch_size():
    before = _times({1: (10, 10_000_000), 4: (2, 8_000_000)}, (12, 1_000_000), (12, 30_000_000))
    after = _times({1: (20, 30_000_000), 4: (2, 8_000_000), 8: (5, 50_000_000)}, (32, 3_000_000), (32, 90_000_000))
    run = after.minus(before)
    assert sorted(run.by_batch) == [1, 8]  # batch size 4 ran nothing in between
    assert run.executed(1) == 10 and run.compute_s(1) == pytest.approx(0.002) and run.compute_s(8) == pytest.approx(0.01)
    assert run.compute_s(4) is None and run.executed(4) == 0
    assert run.batch_counts() == {1: (10, 20_000_000), 8: (5, 50_000_000)}
    assert run.queue_s == pytest.approx(0.0001) and run.success_s == pytest.approx(0.003)
    assert run.executions == 15 and run.inferences == 50
    assert ModelTimes().queue_s is None and ModelTimes().success_s is None


def test_service_from_statistics_has_tritons_mean_and_the_latencies_spread():
    from serving_bench.calibrate.estimators import service_from_statistics

    latency = np.array([0.011, 0.012, 0.013, 0.020])
    run = LoopRun({"m": latency}, {"m": {"compute_infer_mean_s": 0.010}}, (0.0, 1.0))
    service, ways = service_from_statistics(run, "m", 0.0005)
    assert ways == pytest.approx(latency.mean() - 0.010 - 0.0005)
    assert service.mean() == pytest.approx(0.010) and np.diff(service) == pytest.approx(np.diff(latency))


def test_the_gap_between_batches_from_the_runs_cycle():
    from serving_bench.calibrate.estimators import batch_gap, cycle_gap

    # a closed loop of 3 in flight: 50 batches of 5 ms, 200 us between them; each request 0.5 ms on its way in
    # and 0.5 ms out; Triton's mean queue time is what the rest of the latency was: the span from the first send to
    # the last answer, less one request's ways, holds 50 cycles but the last gap
    n, compute, gap = 50, 0.005, 0.0002
    done = 0.0005 + np.arange(1, n + 1) * (compute + gap) - gap + 0.0005
    sent = np.concatenate([np.zeros(3), done[:-3]])
    queue = float((done - sent).mean()) - 0.001 - compute
    run = LoopRun({"m": done - sent}, {"m": {"compute_infer_mean_s": compute, "queue_mean_s": queue}}, (0.0, 1.0),
                  {"m": sent}, {"m": done})
    value, count = cycle_gap(run, "m")
    assert count == n and value == pytest.approx(gap * (1 - 1 / n))
    assert batch_gap(run, "m") == (value, count)  # no logged batches: the cycle
    assert cycle_gap(LoopRun({"m": done[:2] - sent[:2]}, run.stats, (0.0, 1.0), {"m": sent[:2]}, {"m": done[:2]}),
                     "m") == (0.0, 0)


def test_the_hosts_cpu_of_a_server_here_splits_into_its_instances_and_the_rest():
    """Without a runner log, a server on this machine whose instances run in processes of their own: 40 requests
    one at a time, 2 ms of compute each (80 ms in all), 5 ms of latency; the instances' processes used 40 ms, the
    run 160 ms in all: half a core while a batch computes, the rest (120 ms) over the 120 ms the requests spent
    outside the instance is one core on the ways (at most one); a loaded run gives the split's point."""
    from serving_bench.calibrate.estimators import demands, handoff_point, handoff_split, process_demands

    times = {"m": _times({1: (40, 80_000_000)}, (40, 0), (40, 0))}
    run = LoopRun({"m": np.full(40, 0.005)}, {"m": {"compute_infer_mean_s": 0.002}}, (0.0, 1.0), cpu_s=0.16,
                  times=times, runner_cpu_s=0.04)
    assert process_demands(run, "m") == pytest.approx((0.5, 1.0))
    assert demands(run, "m") == pytest.approx((0.5, 0.0, 1.0))  # no log: these, and no hop
    assert process_demands(LoopRun(run.latency, run.stats, run.window, cpu_s=0.16, times=times), "m") == (None, None)
    assert handoff_point(run, "m") == pytest.approx((1.0, 0.003))
    loaded = LoopRun({"m": np.full(90, 0.01)}, {}, (0.0, 1.0), cpu_s=0.2, runner_cpu_s=0.05,
                     times={"m": _times({3: (30, 90_000_000)}, (90, 0), (90, 0))})
    assert handoff_point(loaded, "m") == pytest.approx((3.0, 0.15 / 90))
    # o = c_r + c_b / n through (1, 3 ms) and (3, 1.67 ms): 1 ms per request, 2 ms per batch
    assert handoff_split([handoff_point(run, "m"), handoff_point(loaded, "m")]) == pytest.approx((0.001, 0.002))


def test_paced_samples_give_the_shape_and_the_back_to_back_run_the_mean():
    from serving_bench.calibrate.estimators import paced_service, paced_ways
    from serving_bench.calibrate.paced import Paced, one_request

    compute = np.array([0.0011, 0.0012, 0.0013, 0.0024])
    queue = np.full(4, 0.00015)
    success = compute + queue + 0.00005
    paced = Paced(1, success + np.array([0.0004, 0.0004, 0.0006, 0.0010]), compute, queue, success,
                  np.full(4, 0.002), np.full(4, 0.0005))
    service = paced_service(paced, 0.0010)
    assert service.mean() == pytest.approx(0.0010) and service / compute == pytest.approx(np.full(4, 0.0010 / 0.0015))
    way_in, way_out = paced_ways(paced, 0.0001, 0.0003, 0.0002)
    assert way_in.mean() == pytest.approx(0.0003) and way_out.mean() == pytest.approx(0.0002)
    # each way holds half of the latency beyond queue and compute; the queue, beyond the batcher's delay, is on the
    # way in
    assert np.diff(way_out) == pytest.approx(np.diff([0.000225, 0.000225, 0.000325, 0.000525]))
    assert np.diff(way_in) == pytest.approx(np.diff(way_out))
    # a difference of the counters counts one request only where it holds exactly one, alone in a batch of its size
    one = _times({1: (1, 1_200_000)}, (1, 150_000), (1, 1_400_000))
    assert one_request(one, 1) == pytest.approx((0.0012, 0.00015, 0.0014))
    assert one_request(_times({1: (2, 2_400_000)}, (2, 0), (2, 0)), 1) is None  # someone else's request too
    assert one_request(one, 2) is None  # not its size


def test_cold_starts_from_paced_runs_at_random_quiet_times():
    """An external server's cold starts: the back-to-back run's mean compute and the paced run at batch 1 are the
    hot reference; paced runs at random quiet times give, by the instance's recent idle time, how much longer a batch computes (here 1 ms more once the
    instance idled over 10 ms) and, by the time since the previous request, how much longer the way in is (0.5 ms
    more after 20 ms): the extras grow with the quiet and are 0 back to back."""
    from serving_bench.calibrate.cold import cold_starts
    from serving_bench.calibrate.paced import Paced

    def paced(quiet, seed):
        rng = np.random.default_rng(seed)
        n = len(quiet)
        compute = 0.002 + rng.uniform(0, 1e-4, n) + np.where(quiet > 0.01, 0.001, 0.0)
        queue = 0.0001 + np.where(quiet > 0.02, 0.0005, 0.0)
        latency = compute + queue + 0.0004
        since = np.full(n, np.inf)
        since[1:] = latency[:-1] + quiet[1:]  # each sent its quiet time after the previous answer
        return Paced(1, latency, compute, queue * np.ones(n), latency, since, np.concatenate([[np.inf], quiet[1:]]))

    hot = paced(np.full(200, 0.001), 0)
    back_to_back = LoopRun({"m": hot.latency_s}, {"m": {"compute_infer_mean_s": float(hot.compute_s.mean())}},
                           (0.0, 1.0))
    quiet = np.random.default_rng(1).exponential(np.repeat([0.0005, 0.002, 0.008, 0.032, 0.128], 24))
    runs = {("m", "solo", 1): back_to_back, ("m", "paced", 1): hot, ("m", "cold", 0): paced(quiet, 2),
            ("m", "cold", 1): paced(quiet, 3)}
    effect = cold_starts(runs, "m", 0.0)
    assert effect is not None and effect.service_extra_s[0] == 0.0
    assert effect.service_extra_s[-1] == pytest.approx(0.001, abs=1e-4)
    assert max(e for x, e in zip(effect.service_idle_s, effect.service_extra_s) if x < 0.005) < 2e-4
    assert effect.dispatch_extra_s[-1] == pytest.approx(0.0005, abs=1e-4) and max(effect.overhead_extra_s) < 1e-4


def test_a_served_configuration_reloaded_with_other_instances_and_threads():
    from serving_bench.calibrate.session import reconfigured, served_threads
    from serving_bench.export.repository import ModelConfig

    config = ModelConfig(name="m", backend="python", max_batch_size=8)
    config.instance_group.add(count=1, kind=config.instance_group.add().KIND_CPU)
    del config.instance_group[1:]
    config.parameters["threads_per_instance"].string_value = "2"
    assert served_threads(config) == 2
    again = reconfigured(config, 3, 1)
    assert [g.count for g in again.instance_group] == [3] and served_threads(again) == 1
    assert served_threads(config) == 2  # a copy: the served one unchanged
    ort = ModelConfig(name="o", platform="onnxruntime_onnx")
    assert served_threads(ort) is None and not ort.parameters  # looking does not add the parameter
    assert [g.count for g in reconfigured(ort, 2, 4).instance_group] == [2] and served_threads(
        reconfigured(ort, 2, 4)) is None  # no thread parameter named: the threads are left as served
    ort.parameters["intra_op_thread_count"].string_value = "4"
    assert served_threads(reconfigured(ort, 2, 1)) == 1


@pytest.mark.server
def test_an_external_server_is_inspected_reloaded_and_restored(sleep_repo, tmp_path):
    """A server without model control (started without ``--model-control-mode=explicit``): the plan says so and
    keeps what it serves (no calibration, curves only up to its instances). With it: each phase reloads the models
    with its instances and threads, and the server serves them as before once the phase ends."""
    from dataclasses import replace

    from serving_bench.calibrate.plan import MeasureConfig, plan_measurement
    from serving_bench.calibrate.session import inspect_external, reloaded
    from serving_bench.errors import InputError
    from serving_bench.serve.control import Control
    from serving_bench.serve.server import TritonServer

    config = MeasureConfig(colocation=(1, 2), calibrate=2)
    with TritonServer(sleep_repo) as server:  # every entry, no model control
        url = server.endpoints.grpc_url
        plan = plan_measurement(sleep_repo, ["sleep_python"], replace(config, url=url))
        assert not plan.reloads and not plan.calibrated and plan.instances_at_most("sleep_python", 4) == 1
        assert any("does not allow model control" in n and "polling" in n for n in plan.notes)
        with pytest.raises(InputError, match="not served by the server"):
            inspect_external(url, ["nope"])
    with TritonServer(sleep_repo, models=["sleep_python"], threads_per_instance=2) as server:
        url = server.endpoints.grpc_url
        plan = plan_measurement(sleep_repo, ["sleep_python"], replace(config, url=url))
        assert plan.reloads and plan.calibrated and plan.threads == 2 and plan.sets_threads("sleep_python")
        with Control(url) as control:
            def served():
                c = control.model_config("sleep_python")
                return sum(g.count for g in c.instance_group), c.parameters["threads_per_instance"].string_value

            assert served() == (1, "2")
            with reloaded(url, ["sleep_python"], 3, 1, lambda _line: None):
                assert served() == (3, "1")
            assert served() == (1, "2")


@pytest.mark.exclusive
@pytest.mark.server
def test_a_paced_run_counts_each_request_from_the_statistics(sleep_repo):
    """The sleep model (5 ms + 1 ms a row) at 2 rows, one request at a time: each request's compute time from the
    counters' difference around it is the sleep and the python backend's own work."""
    from serving_bench.calibrate.paced import paced_run
    from serving_bench.serve.server import TritonServer

    with TritonServer(sleep_repo, models=["sleep_python"]) as server:
        run = paced_run(server.endpoints.grpc_url, "sleep_python", 2, 0.5)
    assert len(run) >= 15 and run.skipped <= 2 and run.rows == 2
    assert np.all(run.compute_s >= 0.007) and np.median(run.compute_s) < 0.012
    # Triton's compute time of the python backend ends after the answer left (its output phase, some 0.3-0.6 ms
    # here): a request's latency is about its queue and compute time, not always more
    assert np.all(run.latency_s >= 0.007) and np.all(run.success_s >= run.compute_s)
    assert abs(np.median(run.latency_s - run.compute_s - run.queue_s)) < 0.002


SLEEP = "sleep_python"  # 15 ms + 2 ms a row: long beside the python backend's own work, which drifts with the host
LOADS_RPS = (60.0, 120.0, 180.0)  # open loop, Poisson; one instance batching up to 8 carries ~240 req/s
SLO_P99_S = 0.15  # the capacity's SLO
TARGET = 0.05  # issue 46: a --url profile's predictions within 5 % of the embedded profile's


def predictions(profile, repo) -> dict[str, float]:
    """What a user asks of a profile: p50, p99 and throughput of a Poisson replay of the sleep model served as its
    repository says (one instance, dynamic batching up to 8) at each of :data:`LOADS_RPS` (30 s simulated, seed 1),
    and its capacity with p99 <= :data:`SLO_P99_S` (``tune.capacity.bisect_capacity`` on the simulator, 16 rungs a
    doubling)."""
    from serving_bench.run.metrics import summarize
    from serving_bench.serving_config import ServingConfig
    from serving_bench.sim.interference import open_schedule
    from serving_bench.sim.target import SimTarget
    from serving_bench.tune.capacity import Ladder, Probe, bisect_capacity

    target = SimTarget(profile, ServingConfig.from_repo(repo, [SLEEP]), seed=1)

    def at(rate: float) -> dict:
        schedule = open_schedule({SLEEP: rate}, 30.0, 1)
        schedule = dataclasses.replace(schedule, meta={**schedule.meta, "warmup_s": 1.0})
        return summarize(target.run(schedule))["models"][SLEEP]

    out = {}
    for rate in LOADS_RPS:
        s = at(rate)
        out.update({f"p50 at {rate:g}/s": s["p50_s"], f"p99 at {rate:g}/s": s["p99_s"],
                    f"throughput at {rate:g}/s": s["throughput_rps"]})

    def probe(scale: float, _attempt: int) -> Probe:
        p99 = at(LOADS_RPS[0] * scale)["p99_s"]
        return Probe(scale, p99 <= SLO_P99_S, p99 / SLO_P99_S)

    out["capacity"] = bisect_capacity(probe, Ladder(0.25, 16.0, 16)).capacity_scale * LOADS_RPS[0]
    return out


def tolerances(embedded: list[dict[str, float]]) -> dict[str, float]:
    """Per kind of figure (p50, p99, throughput, capacity) the embedded profile's own repeatability: the largest
    relative difference between two embedded profiles' predictions of that kind, at least :data:`TARGET` (the target
    alone for one profile)."""
    out: dict[str, float] = {}
    for name in embedded[0]:
        kind = name.split(" ")[0]
        values = [e[name] for e in embedded]
        out[kind] = max(out.get(kind, TARGET), (max(values) - min(values)) / np.mean(values))
    return out


def url_profile(repo, out, config):
    """The sleep entry profiled with ``--url`` on a server started with model control, no execution log and one
    runtime thread per instance (as the embedded profiles are measured: no one-thread tables to measure)."""
    from serving_bench.calibrate.measure import measure_profile
    from serving_bench.serve.server import TritonServer

    with TritonServer(repo, models=[SLEEP], threads_per_instance=1) as server:  # explicit model control, no log
        return measure_profile(repo, [SLEEP], out, dataclasses.replace(config, url=server.endpoints.grpc_url))


def compare(profiles: list, url, embedded: list[dict], from_url: dict, allowed: dict) -> bool:
    """Prints the service quantiles and each prediction of the embedded ``profiles`` and the --url one, and whether
    each kind of figure of the --url profile lies within ``allowed`` of the embedded profiles' mean."""
    named = [(f"embedded {i + 1}", p) for i, p in enumerate(profiles)] + [("--url", url)]
    for b in (1, 8):
        print(f"service at batch {b} (ms): p50 / p99 " + ", ".join(
            f"{name} {p.models[SLEEP].devices['cpu'].batches[b].median * 1e3:.2f} / "
            f"{p.models[SLEEP].devices['cpu'].batches[b].quantile(0.99) * 1e3:.2f}" for name, p in named))
    print(f"\n{'prediction':24s} " + " ".join(f"{name:>11s}" for name, _ in named) + "   --url off   allowed")
    worst: dict[str, float] = {}
    for name in embedded[0]:
        mean, u = float(np.mean([e[name] for e in embedded])), from_url[name]
        off = u / mean - 1
        kind = name.split(" ")[0]
        worst[kind] = max(worst.get(kind, 0.0), abs(off))
        scale = 1e3 if kind in ("p50", "p99") else 1.0
        print(f"{name:24s} " + " ".join(f"{e[name] * scale:11.2f}" for e in embedded) + f" {u * scale:11.2f}   "
              f"{off * 100:+8.1f} %  {allowed[kind] * 100:6.1f} %")
    return all(worst[kind] <= allowed[kind] for kind in worst)


@pytest.mark.exclusive
@pytest.mark.server
@pytest.mark.slow
def test_a_url_profile_predicts_what_the_embedded_profile_predicts(tmp_path):
    """The embedded server profiled as if it were external (``--url``: no runner logs, Triton's statistics, its
    model control and its processes' CPU) against the embedded profile of the same model, profiled before it: each
    prediction of the --url profile within 5 % of the embedded one's. One embedded profile is one draw of its own
    repeatability: where the --url profile misses, a second embedded profile is measured and the --url profile is
    held to their repeatability (at least the 5 % target) against their mean. The figures are printed (``pytest
    -s``); docs/profiles.md gives those measured."""
    from serving_bench.calibrate.measure import measure_profile
    from serving_bench.calibrate.plan import MeasureConfig
    from serving_bench.export.sleep import write_sleep_entry

    repo = tmp_path / "repo"
    write_sleep_entry(repo, SLEEP, base_ms=15.0, per_item_ms=2.0, max_batch_size=8)
    # memory and energy are not predictions (and a --url profile measures neither): not measured, 6 s a profile; one
    # runtime thread per instance: the sleep takes no core, so no one-thread tables to measure
    config = MeasureConfig(seconds=1.0, idle_rounds=1, colocation=(1, 2), colocation_batches=(1,), resources=False,
                           threads=1)
    profiles = [measure_profile(repo, [SLEEP], tmp_path / "embedded1.json", config)]
    url = url_profile(repo, tmp_path / "url.json", dataclasses.replace(config, threads=None))
    md = url.models[SLEEP].devices["cpu"]
    # through the server's model control: the calibration runs (2 instances) and a co-location curve S(2); from its
    # processes here: the demands; from paced runs: the cold starts
    assert md.batch_sizes == (1, 2, 4, 8) and url.calibration and md.colocation and md.colocation[0].k == (1.0, 2.0)
    assert md.demand and url.models[SLEEP].request_demand is not None and url.request_device == "cpu" and md.idle
    assert md.threads == 1 == profiles[0].models[SLEEP].devices["cpu"].threads
    embedded, from_url = [predictions(profiles[0], repo)], predictions(url, repo)
    allowed = tolerances(embedded)
    if compare(profiles, url, embedded, from_url, allowed):
        return
    profiles.append(measure_profile(repo, [SLEEP], tmp_path / "embedded2.json", config))
    embedded.append(predictions(profiles[1], repo))
    allowed = tolerances(embedded)
    if compare(profiles, url, embedded, from_url, allowed):
        return
    # a host stall during one of the --url profile's runs sets a figure for the whole profile (docs/profiles.md:
    # one of six such profiles met one); a second --url profile is judged, not a looser bound
    url = url_profile(repo, tmp_path / "url2.json", dataclasses.replace(config, threads=None))
    assert compare(profiles, url, embedded, predictions(url, repo), allowed), allowed
