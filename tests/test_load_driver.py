"""TritonTarget against the real tritonserver: accounting, open and closed loop, caps, timeouts, unknown models,
coordinated-omission safety under a stalled server, M/D/1 agreement on the sleep model, and the native and Python
senders recording the same schedule alike (the tests without ``sender=`` use the default: native where it builds)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np
import pytest
from conformance import assert_target_contract
from repos import write_sleep_chain

from serving_bench.errors import InputError
from serving_bench.load import native
from serving_bench.load.driver import SendOptions, TritonTarget
from serving_bench.run.target import ClosedLoop, OpenLoop
from serving_bench.run.schedule import Schedule
from serving_bench.run.metrics import summarize
from serving_bench.serve.control import Control
from serving_bench.serving_config import ServingConfig

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from serving_bench.export.sleep import write_sleep_entry
    from serving_bench.serve.server import TritonServer

    repo = tmp_path_factory.mktemp("load_repo")
    write_sleep_entry(repo, "sleep_zero", base_ms=0.0, per_item_ms=0.0)
    # one request at a time, a fixed service time: an M/D/1 queue (20 ms: long against the noise of a shared machine)
    write_sleep_entry(repo, "sleep_md1", base_ms=20.0, per_item_ms=0.0, max_batch_size=1)
    write_sleep_entry(repo, "sleep_slow", base_ms=400.0, per_item_ms=0.0, max_batch_size=4)
    write_sleep_entry(repo, "sleep_long", base_ms=3000.0, per_item_ms=0.0, max_batch_size=4)
    write_sleep_chain(repo, "sleep_ens", ["sleep_zero"])
    # Triton's queue policy drops a request that waited more than 20 ms in the queue
    write_sleep_entry(repo, "sleep_qto", base_ms=100.0, per_item_ms=0.0, max_batch_size=1)
    serving = ServingConfig.from_repo(repo, ["sleep_qto"])
    serving.with_model(serving["sleep_qto"].replace(queue_timeout_us=20_000)).apply_to_repo(repo)
    with TritonServer(repo) as srv:
        yield srv


def poisson_schedule(rate, duration, model="sleep_zero", seed=0, batch=1, **meta):
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate * duration)
    t = np.sort(rng.random(n) * duration)
    return Schedule(t, np.zeros(n), (model,), rng.integers(0, 8, n), np.full(n, batch),
                    {"seed": seed, "duration_s": duration, **meta})


def test_open_loop_answers_every_request_once(server):
    schedule = poisson_schedule(200, 2.0, batch=2)
    records = TritonTarget(server).run(schedule)
    c = assert_target_contract(schedule, records)
    assert c["ok"] == len(schedule) and not records.info.partial
    lateness = (records.table["sent_s"] - records.table["intended_s"]).to_numpy()
    assert np.median(lateness) < 0.005  # sent on time (loose: the CI machine is shared)
    stats = records.info.server_stats["sleep_zero"]
    assert stats["success_count"] == len(schedule)  # Triton saw exactly what we sent


def test_ensemble_is_summarized_with_its_members(server):
    rng = np.random.default_rng(5)
    n = 60
    schedule = Schedule(np.sort(rng.random(n)), rng.integers(0, 2, n), ("sleep_zero", "sleep_ens"),
                        rng.integers(0, 4, n), np.ones(n), {"duration_s": 1.0})
    records = TritonTarget(server).run(schedule)
    assert_target_contract(schedule, records)
    summary = summarize(records)
    assert summary["ensembles"]["sleep_ens"]["members"] == ["sleep_zero"]
    assert summary["ensembles"]["sleep_ens"]["counts"]["ok"] == int((schedule.model == 1).sum())
    assert "sleep_ens" in summary["models"] and "sleep_zero" not in summary["ensembles"]


def test_perf_analyzer_wrapper_measures_the_same_server(server):
    from serving_bench.peers.perf_analyzer import Level, PeerMissing, Windows, find_perf_analyzer

    try:
        pa = find_perf_analyzer()
    except PeerMissing as err:
        pytest.skip(f"perf_analyzer cannot run here: {err}")
    m = pa.measure("sleep_md1", server.endpoints.grpc_url, Level(concurrency=1),
                   Windows(measurement_s=1.0, stability_pct=999, max_trials=3))
    assert m.mode == "concurrency" and 20 < m.throughput_ips < 55  # one 20 ms request at a time
    assert 0.020 <= m.p50_s <= m.p99_s < 0.2 and m.server_compute_infer_s >= 0.020


SENDERS = ["python", pytest.param("native", marks=pytest.mark.skipif(
    native.native_check().problem is not None, reason=str(native.native_check().problem)))]


@pytest.mark.parametrize("sender", SENDERS)
def test_several_sender_processes_share_one_schedule(server, sender):
    schedule = poisson_schedule(300, 1.5, seed=1)
    records = TritonTarget(server, send=SendOptions(senders=2, sender=sender)).run(schedule)
    c = assert_target_contract(schedule, records)
    assert c["ok"] == len(schedule) and records.info.senders == 2 and records.info.sender == sender


def test_native_and_python_senders_record_a_mixed_schedule_alike(server):
    """Plain, ensemble and timed-out requests of three models: the same rows, statuses and error texts from both."""
    if native.native_check().problem:
        pytest.skip(native.native_check().problem)
    rng = np.random.default_rng(11)
    n = 150
    schedule = Schedule(np.sort(rng.random(n) * 1.5), rng.choice(3, n, p=[0.6, 0.3, 0.1]),
                        ("sleep_zero", "sleep_ens", "sleep_slow"), rng.integers(0, 4, n), np.ones(n),
                        {"duration_s": 1.5})
    runs = {s: TritonTarget(server, send=SendOptions(timeout_s=0.3, sender=s)).run(schedule)
            for s in ("python", "native")}
    for sender, records in runs.items():
        c = assert_target_contract(schedule, records)
        assert records.info.sender == sender and not records.info.partial
        assert c["ok"] == int((schedule.model < 2).sum()) and c["timeout"] == int((schedule.model == 2).sum())
        assert records.info.sender_cpu_s > 0
    python, native_ = (runs[s].table for s in ("python", "native"))
    assert list(python.columns) == list(native_.columns)
    for column in ("request_id", "model", "batch", "intended_s", "status", "error"):
        assert python[column].tolist() == native_[column].tolist(), column
    assert runs["native"].info.server_stats["sleep_ens"]["success_count"] == int((schedule.model == 1).sum())


def test_sender_falls_back_to_python_when_the_native_one_cannot_be_built(tmp_path, monkeypatch, capsys):
    """A failed build is remembered outside the package (the cache folder) and said once: a later run does not try,
    nor announce, the build again, and nothing is written beside the package's source."""
    monkeypatch.setattr(native, "BINARY", tmp_path / "serving-bench-sender")
    monkeypatch.setenv("SERVING_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler"))
    before = sorted(p.name for p in native.NATIVE_DIR.iterdir())
    native.native_check.cache_clear()
    try:
        sender, note = native.choose_sender("auto")
        assert "building the native sender" in capsys.readouterr().err
        reason = json.loads((tmp_path / "cache" / "native-sender-build.json").read_text())["why"]
        assert sender == "python" and "could not be built" in note and reason in note
        assert "no-compiler" in reason or "gRPC C++ is missing" in reason
        with pytest.raises(ValueError, match="could not be built"):
            native.choose_sender("native")
        assert native.choose_sender("python") == ("python", "sender: python (asked for)")
        native.native_check.cache_clear()  # the next run
        sender, again = native.choose_sender("auto")
        assert sender == "python" and reason in again and "an earlier try" in again
        assert "building" not in capsys.readouterr().err
        assert sorted(p.name for p in native.NATIVE_DIR.iterdir()) == before
        monkeypatch.setenv("CXX", str(tmp_path / "another-compiler"))  # what the build depends on changed: tried
        native.native_check.cache_clear()
        native.choose_sender("auto")
        assert "building the native sender" in capsys.readouterr().err
    finally:
        native.native_check.cache_clear()


@pytest.mark.parametrize("sender", SENDERS)
def test_closed_loop_keeps_concurrency_and_trims_unreached_requests(server, sender):
    schedule = poisson_schedule(1000, 3.0, model="sleep_md1")  # far more requests than 1 s can serve
    records = TritonTarget(server, mode=ClosedLoop(concurrency=2, duration_s=1.0),
                           send=SendOptions(sender=sender)).run(schedule)
    c = assert_target_contract(schedule, records, closed_loop=True)
    assert 20 < c["ok"] < 110  # ~20 ms each, one instance: about 50 in 1 s
    sent = np.sort(records.table["sent_s"].to_numpy())
    done = np.sort(records.table["done_s"].to_numpy())
    # never more than 2 outstanding: the k-th send happens after the (k-2)-th completion
    assert np.all(sent[2:] >= done[:-2] - 1e-6)


@pytest.mark.parametrize("sender", SENDERS)
def test_cap_drop_and_wait_are_accounted(server, sender):
    schedule = poisson_schedule(100, 1.0, model="sleep_slow", seed=2)
    dropped = TritonTarget(server, mode=OpenLoop(max_in_flight=4, on_cap="drop"),
                           send=SendOptions(sender=sender)).run(schedule)
    c = assert_target_contract(schedule, dropped)
    assert c["not_sent"] > 0 and dropped.info.dropped == c["not_sent"] and c["ok"] == c["sent"]
    short = schedule.select(np.arange(len(schedule)) < 12)
    waited = TritonTarget(server, mode=OpenLoop(max_in_flight=4, on_cap="wait"),
                          send=SendOptions(sender=sender)).run(short)
    c = assert_target_contract(short, waited)
    assert c["ok"] == len(short)
    late = (waited.table["sent_s"] - waited.table["intended_s"]).to_numpy()
    assert late.max() > 0.3  # the 5th request waited for a slot


def test_timeout_status(server):
    schedule = Schedule([0.0, 0.01], [0, 0], ("sleep_slow",), [0, 1], [1, 1], {"duration_s": 0.1})
    records = TritonTarget(server, send=SendOptions(timeout_s=0.1)).run(schedule)
    c = assert_target_contract(schedule, records)
    assert c["timeout"] == 2 and records.table["error"].str.startswith("timeout").all()


def test_queue_policy_timeout_is_a_timeout_like_in_the_simulator(server):
    schedule = Schedule(np.zeros(4), np.zeros(4), ("sleep_qto",), np.zeros(4), np.ones(4), {"duration_s": 0.5})
    records = TritonTarget(server).run(schedule)
    assert_target_contract(schedule, records)
    status = records.table["status"].astype(str).tolist()
    assert status.count("ok") == 1 and status.count("timeout") == 3, status
    timed_out = records.table[records.table["status"] == "timeout"]
    assert timed_out["error"].str.contains("Request timeout expired").all()
    assert timed_out["done_s"].isna().all()


def test_unknown_model_lists_served_models_and_sends_nothing(server):
    before = TritonTarget(server)._stats()
    schedule = Schedule([0.0, 0.1], [0, 1], ("sleep_zero", "no_such_model"), [0, 0], [1, 1],
                        {"profile": "p.yaml"})
    with pytest.raises(InputError) as err:
        TritonTarget(server).run(schedule)
    line = err.value.line()
    assert line.startswith("p.yaml: models.no_such_model: not served") and "sleep_md1, sleep_qto, sleep_slow, sleep_zero" in line
    assert TritonTarget(server)._stats()["sleep_zero"]["inference_count"] == before["sleep_zero"]["inference_count"]


@pytest.mark.exclusive
def test_stalled_server_shows_in_intended_latency_not_in_service_latency(server):
    """A synchronous client (one request outstanding) stops sending while the server is stalled (SIGSTOP): latency
    from the send time hides the stall (coordinated omission), latency from the intended time shows it.

    Only the server's process is stopped, not its python-backend stubs: stopping and resuming the whole process group
    left Triton 2.51's stub "not healthy" in 1 run of 25 here (the run's later requests then fail, and so does every
    later test on the model); stopping the server alone, 0 of 50."""
    schedule = poisson_schedule(100, 4.0, seed=3)
    pid = server.process.pid

    def answered(control) -> int:
        return control.statistics(["sleep_zero"])["sleep_zero"]["inference_count"]

    with Control(server.endpoints.grpc_url) as control:
        before = answered(control)  # counted before the run: a thread slow to start stops the server at once

    def stall():
        """Stop the server for 1 s once it has answered 100 of the run's requests (about 1 s into the schedule):
        timed from the run's own progress, counted from before the run, so a slow start cannot miss the run."""
        with Control(server.endpoints.grpc_url) as control:
            deadline = time.monotonic() + 60.0
            while answered(control) - before < 100 and time.monotonic() < deadline:
                time.sleep(0.01)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(1.0)
        os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=stall)
    thread.start()
    try:
        records = TritonTarget(server, mode=OpenLoop(max_in_flight=1, on_cap="wait")).run(schedule)
    finally:
        thread.join()
        os.kill(pid, signal.SIGCONT)
    counts = assert_target_contract(schedule, records)
    assert counts["ok"] == len(schedule.arrival_s), records.table["error"].value_counts()  # a stall, not a failure
    summary = summarize(records)["overall"]
    assert summary["p99_s"] > 0.5, summary["p99_s"]           # the stall: up to ~1 s late
    assert summary["service_p99_s"] < 0.1, summary["service_p99_s"]  # one slow request in ~400 is below p99


def md1_waits(arrivals: np.ndarray, service_s: float) -> np.ndarray:
    """Waiting time of each arrival in a FIFO single-server queue with deterministic service (Lindley's
    recursion): the M/D/1 queue on this very arrival sequence."""
    waits = np.zeros(len(arrivals))
    for k in range(1, len(arrivals)):
        waits[k] = max(0.0, waits[k - 1] + service_s - (arrivals[k] - arrivals[k - 1]))
    return waits


@pytest.mark.exclusive
@pytest.mark.slow
def test_mean_latency_agrees_with_md1_at_load_half(server):
    """M/D/1 at rho = 0.5: mean latency = mean M/D/1 wait + L0, within 10 %.

    S, the deterministic service time the queue sees, is how long the single instance is occupied per request:
    1 / its throughput when it is never idle (closed loop, two in flight; ~20 ms of sleep plus the python backend's
    hand-over). L0, the no-load latency (one request at a time), holds what does not queue: client, transport, the
    server's own path. The load is rho = lambda * S = 0.5. The M/D/1 wait is computed on the schedule's own Poisson
    arrivals (Lindley's recursion): over a 20 s run the mean wait of one Poisson realisation scatters by about 20 %
    around the closed form rho * S / (2 (1 - rho)), so the closed form is only checked loosely."""
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > 3 * cpus:  # other processes make the service time random and the client late: not M/D/1 any more
        pytest.skip(f"machine overloaded (load average {load:.1f} on {cpus} CPUs): queueing-theory check not meaningful")
    calibration = poisson_schedule(100, 3.0, model="sleep_md1", seed=9)
    saturated = TritonTarget(server, mode=ClosedLoop(concurrency=2, duration_s=3.0)).run(calibration)
    done = np.sort(saturated.table["done_s"].dropna().to_numpy())
    s = float(np.mean(np.diff(done[len(done) // 4:])))  # steady state: one completion every S seconds
    no_load = TritonTarget(server, mode=ClosedLoop(concurrency=1, duration_s=2.0)).run(calibration)
    l0 = float((no_load.table["done_s"] - no_load.table["sent_s"]).mean())
    assert 0.020 <= s < l0 + 0.005
    rate = 0.5 / s
    schedule = poisson_schedule(rate, 20.0, model="sleep_md1", seed=4, warmup_s=1.0)
    records = TritonTarget(server).run(schedule)
    assert_target_contract(schedule, records)
    measured = summarize(records)["overall"]["mean_s"]
    in_window = schedule.arrival_s >= 1.0
    predicted = float(md1_waits(schedule.arrival_s, s)[in_window].mean()) + l0
    closed_form = 0.5 * s / (2 * (1 - 0.5)) + l0
    assert abs(measured - predicted) / predicted < 0.10, (measured, predicted, closed_form, s, l0)
    assert abs(predicted - closed_form) / closed_form < 0.25  # this realisation is a typical one


@pytest.mark.exclusive
@pytest.mark.parametrize("sender", SENDERS)
def test_stop_ends_a_closed_loop_within_the_grace_period(server, sender):
    """A stop (what Ctrl-C does) must not wait for slow in-flight requests beyond grace_s."""
    # 3 s of service: whenever the stop comes, the requests in flight cannot finish within the grace period
    schedule = poisson_schedule(10, 30.0, model="sleep_long", seed=6)
    stopped_at: list[float] = []

    def stop_once_in_flight(progress):  # the clock starts after the (3 s) warm-up request
        if progress.in_flight >= 1 and progress.elapsed_s >= 0.3 and not stopped_at:
            stopped_at.append(time.monotonic())
            target.stop()

    target = TritonTarget(server, mode=ClosedLoop(concurrency=2, duration_s=30.0),
                          send=SendOptions(grace_s=0.2, sender=sender), progress=stop_once_in_flight,
                          progress_interval_s=0.1)
    records = target.run(schedule)
    # a few tenths after the stop (the warm-up before it may wait for a previous test's requests still running)
    assert time.monotonic() - stopped_at[0] < 2.0
    c = assert_target_contract(schedule, records, closed_loop=True)
    assert records.info.partial and records.info.stop_reason == "stopped"
    assert c["error"] >= 1 and records.table["error"].str.startswith("cancelled").any()


def test_infer_channel_answers_every_started_call_once_with_its_tag(server):
    """The sender's transport (grpcio's Cython layer, pinned): outcomes carry their tags, errors, deadlines and
    cancellations come back as status codes, each call exactly once."""
    from serving_bench.load.infer_channel import OK_CODE, STATUS_CODES, InferChannel

    def payloads(model):
        schedule = Schedule([0.0], [0], (model,), [0], [1], {"duration_s": 0.1})
        return TritonTarget(server).prepare(schedule).payloads

    zero, slow = payloads("sleep_zero"), payloads("sleep_slow")
    channel = InferChannel(server.endpoints.grpc_url)
    channel.ready(10.0)
    for k in range(20):
        channel.start(zero[0], 10.0, k)
    channel.start(b"", 10.0, "no model")
    channel.start(slow[0], 0.05, "deadline")  # 400 ms of service
    channel.cancel(channel.start(slow[0], 10.0, "cancelled"), "test")
    outcomes = {}
    while len(outcomes) < 23:
        tag, code, details = channel.next()
        assert tag not in outcomes
        outcomes[tag] = (STATUS_CODES[code].name, details)
    channel.close()
    assert all(outcomes[k] == ("OK", "") for k in range(20)) and OK_CODE == 0
    assert outcomes["no model"][0] not in ("OK", "CANCELLED", "DEADLINE_EXCEEDED") and outcomes["no model"][1]
    assert outcomes["deadline"][0] == "DEADLINE_EXCEEDED"
    assert outcomes["cancelled"][0] == "CANCELLED"
