"""serving-bench tune on the real simulator: the known optimum, unsatisfiable SLOs, bad input, resume."""

from __future__ import annotations

import json

import pytest

from serving_bench.cli import main as cli_main
from serving_bench.tune.run import TuneOptions, run_tune
from tune_fixtures import write_load, write_profile

# m: 4 ms + 1 ms/item on a 2-core CPU. At 150 req/s with p99 <= 40 ms, capacity (req/s) is bounded by
# instances * b / (4 + b) ms: 1 instance, batch 1: 200; 2 x batch 1: 400; 1 x batch 8: 667; 2 x batch 8: 1333.
SPACE = dict(instances=(1, 2), max_batch_sizes=(1, 8), queue_delays_us=(0, 2000))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune_inputs")
    return {"profile": write_profile(d / "profile.json", {"m": (4.0, 1.0, 8)}),
            "load": write_load(d / "load.yaml", {"m": 150}, {"m": 40}), "dir": d}


def opts(inputs, out, **kw) -> TuneOptions:
    """The search alone: the pick's capacity interval (40 more searches) is tested in test_intervals.py."""
    base = dict(load=str(inputs["load"]), profile=str(inputs["profile"]), out=str(out), verify_top=0, quiet=True,
                report=False, replications=0, **SPACE)
    base.update(kw)
    return TuneOptions(**base)


def test_grid_finds_the_known_optimum(inputs, tmp_path):
    doc = run_tune(opts(inputs, tmp_path / "grid"))
    assert doc["search"]["generator"] == "grid" and doc["search"]["evaluated"] == 6 == doc["search"]["space_points"]
    best = doc["best"]
    assert doc["satisfiable"]
    assert (best["config"]["m"]["instances"], best["config"]["m"]["max_batch_size"]) == (2, 8)
    # capacity is within one ladder rung (9 %) plus queueing margin of the closed form 2 * 8 / 12 ms
    assert 0.75 * 1333 <= best["result"]["capacity_rps"] <= 1333
    ranked = [(t["config"]["m"]["instances"], t["config"]["m"]["max_batch_size"]) for t in doc["top"]]
    assert ranked.index((1, 8)) < ranked.index((2, 1))  # 667 before 400 req/s
    assert "Deploy: m: 2 instances" in doc["recommendation"][0]
    assert json.loads((tmp_path / "grid" / "tune.json").read_text())["best"]["key"] == best["key"]


def test_optuna_finds_the_same_optimum(inputs, tmp_path):
    doc = run_tune(opts(inputs, tmp_path / "optuna", generator="optuna", max_evals=5))
    assert doc["search"]["generator"] == "optuna" and doc["search"]["evaluated"] == 5
    assert (doc["best"]["config"]["m"]["instances"], doc["best"]["config"]["m"]["max_batch_size"]) == (2, 8)


def test_unsatisfiable_slos_say_so_with_best_achievable(inputs, tmp_path, capsys):
    code = cli_main(["tune", str(inputs["load"]), "--profile", str(inputs["profile"]), "--slo", "m=p99:3ms",
                     "--instances", "1,2", "--max-batch-sizes", "1,8", "--queue-delays-us", "0",
                     "--verify-top", "0", "--out", str(tmp_path / "unsat")])
    out = capsys.readouterr().out
    assert code == 1
    assert "The SLOs cannot be met" in out and "Best achievable" in out and "(SLO 3 ms)" in out
    doc = json.loads((tmp_path / "unsat" / "tune.json").read_text())
    assert doc["satisfiable"] is False and doc["best"]["result"]["violation"] > 1
    assert (tmp_path / "unsat" / "report.html").is_file()


@pytest.mark.parametrize("slo", ["m=p99", "m=p99:20", "m=p42:20ms", "m:p99:20ms"])
def test_bad_slo_is_one_line_with_the_expected_form(inputs, tmp_path, capsys, slo):
    code = cli_main(["tune", str(inputs["load"]), "--profile", str(inputs["profile"]), "--slo", slo,
                     "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: --slo") and "MODEL=STAT:VALUE" in err
    assert not (tmp_path / "bad" / "tune.json").exists()


def test_slo_for_a_model_not_in_the_load_is_rejected(inputs, tmp_path, capsys):
    code = cli_main(["tune", str(inputs["load"]), "--profile", str(inputs["profile"]), "--slo", "other=p99:20ms",
                     "--out", str(tmp_path / "bad")])
    assert code == 2 and "not a model of the load; models: m" in capsys.readouterr().err


def test_interrupted_tune_resumes_without_redoing_work(inputs, tmp_path, monkeypatch):
    import serving_bench.tune.search as search

    full = run_tune(opts(inputs, tmp_path / "full"))
    out = tmp_path / "resumed"
    calls = {"n": 0}
    real = search.evaluate

    def counting(ctx, params):
        calls["n"] += 1
        if calls["n"] == 4:  # Ctrl-C during the fourth evaluation
            raise KeyboardInterrupt
        return real(ctx, params)

    monkeypatch.setattr(search, "evaluate", counting)
    with pytest.raises(KeyboardInterrupt):
        run_tune(opts(inputs, out))
    lines = (out / "observations.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 3  # header + the three finished evaluations
    calls["n"] = -100  # no more interruptions
    doc = run_tune(opts(inputs, out))
    assert doc["search"]["resumed"] == 3 and doc["search"]["evaluated"] == 3 and calls["n"] == -97
    assert doc["best"]["key"] == full["best"]["key"]
    assert [t["key"] for t in doc["top"]] == [t["key"] for t in full["top"]]
    # a different search in the same folder is refused, not mixed in
    with pytest.raises(Exception, match="different search"):
        run_tune(opts(inputs, out, queue_delays_us=(0, 500)))


def test_tuning_for_a_client_that_costs_more_per_request(inputs, tmp_path):
    """--client-cpu-us: the tune simulates a client costing 20 ms more per request (here its way out: the fixture's
    profile simulates no host CPU to share), which leaves less of the 40 ms p99 budget for queueing, so the best
    capacity falls; the plain tune's checkpoint is not resumed for it; a non-number is refused."""
    plain = run_tune(opts(inputs, tmp_path / "t"))
    with pytest.raises(Exception, match="different search"):
        run_tune(opts(inputs, tmp_path / "t", client_cpu_us=20_000.0))
    slower = run_tune(opts(inputs, tmp_path / "slower", client_cpu_us=20_000.0))
    assert slower["best"]["result"]["capacity_rps"] < 0.9 * plain["best"]["result"]["capacity_rps"]
    with pytest.raises(Exception, match="--client-cpu-us"):
        run_tune(opts(inputs, tmp_path / "nan", client_cpu_us=float("nan")))


def test_verify_on_an_external_server_reloads_the_candidate(sleep_repo, tmp_path):
    """--url: the best candidate is loaded into a running Triton (explicit model control) and replayed there."""
    import tritonclient.grpc as grpcclient

    from serving_bench.serve.server import TritonServer

    profile = write_profile(tmp_path / "p.json", {"sleep_python": (5.0, 1.0, 8)})
    load = write_load(tmp_path / "load.yaml", {"sleep_python": 100}, {"sleep_python": 60}, duration_s=3.0)
    with TritonServer(sleep_repo, models=["sleep_python"]) as server:  # started with --model-control-mode=explicit
        url = server.endpoints.grpc_url
        doc = run_tune(TuneOptions(load=str(load), profile=str(profile), out=str(tmp_path / "out"), url=url,
                                   instances=(1, 2), max_batch_sizes=(1, 8), queue_delays_us=(0,), verify_top=1,
                                   quiet=True, report=False))
        served = grpcclient.InferenceServerClient(url).get_model_config("sleep_python", as_json=True)["config"]
    best = doc["best"]["config"]["sleep_python"]
    assert (best["instances"], best["max_batch_size"]) == (2, 8)
    assert int(served["max_batch_size"]) == 8 and sum(int(g["count"]) for g in served["instance_group"]) == 2
    (row,) = doc["verification"]
    assert row["server"] == url and row["slo_met"] and row["measured"]["sleep_python"]["throughput_rps"] > 50
    labels = [r["label"] for r in row["replays"]]  # the interval's end once more where the replays disagree
    assert labels[:3] == ["load", "capacity", "above"] and labels[3:] in ([], ["interval-low"], ["interval-high"])
    assert all(r["measured"]["sleep_python"]["throughput_rps"] > 50 for r in row["replays"])


@pytest.mark.server
def test_verification_cuts_an_overloaded_replay_instead_of_cancelling_and_goes_on_on_a_new_server(sleep_repo, tmp_path):
    """On the embedded server verification cancels no request: a replay ~3 s of work behind (600 requests in 0.6 s,
    one instance at ~6 ms each, no batching) is still answering 2 s (the cut for a 60 ms bound) after its last
    arrival, so its server is stopped, its unanswered requests failed and its SLO missed; the next replay runs on
    a new server, whole."""
    import numpy as np

    from serving_bench.run.schedule import Schedule
    from serving_bench.serving_config import ModelServing, ServingConfig
    from serving_bench.tune.objective import check_slos
    from serving_bench.tune.verify import verify_candidate

    def burst(n: int, spacing_s: float) -> Schedule:
        t = np.arange(n) * spacing_s
        return Schedule(t, np.zeros(n), ("sleep_python",), np.zeros(n, dtype=int), np.ones(n, dtype=int),
                        {"duration_s": float(t[-1]) + 0.1, "warmup_s": 0.0, "seed": 0})

    slos = {"sleep_python": {"p99": 0.060}}
    notes: list[str] = []
    heavy, light = verify_candidate(ServingConfig((ModelServing("sleep_python"),)),
                                    [(burst(600, 0.001), tmp_path / "heavy"), (burst(20, 0.05), tmp_path / "light")],
                                    slos, repo=sleep_repo, url=None, log=notes.append)
    counts = heavy["models"]["sleep_python"]["counts"]
    assert heavy["partial"] and heavy["run"]["stop_reason"].startswith("cut: still answering 2 s after its last")
    assert counts["sent"] == 600 == counts["ok"] + counts["failed"] + counts["timeout"] and counts["timeout"] == 0
    assert 0 < counts["ok"] < 600 and check_slos(heavy, slos, 0.0)[0] is False
    assert len(notes) == 1 and "heavy was cut" in notes[0] and "a new server" in notes[0]
    assert not light["partial"] and light["models"]["sleep_python"]["counts"]["ok"] == 20


@pytest.mark.exclusive
def test_verification_brackets_the_predicted_capacity_on_triton(sleep_repo, tmp_path):
    """The pick is replayed on the embedded Triton at 1x, at its predicted capacity and one ladder rung above, the
    load grown by the tune's rule (here ``scale``: the same users sending more), each replay the load's 3 s. Every
    replay's folder holds the grown schedule and its records; tune.json gives each replay's verdict, the measured
    bracket those verdicts imply and whether the SLOs held at the predicted capacity; the recommendation says so."""
    import numpy as np

    from serving_bench.run.records import load_records
    from serving_bench.run.schedule import Schedule
    from serving_bench.tune.capacity import Ladder
    from serving_bench.tune.load import load_from_file
    from serving_bench.tune.verify import measured_bracket

    profile = write_profile(tmp_path / "p.json", {"sleep_python": (5.0, 1.0, 8)})
    load = write_load(tmp_path / "load.yaml", {"sleep_python": 30}, {"sleep_python": 60}, duration_s=3.0)
    doc = run_tune(TuneOptions(load=str(load), profile=str(profile), out=str(tmp_path / "out"), repo=str(sleep_repo),
                               instances=(1,), max_batch_sizes=(1,), queue_delays_us=(0,), verify_top=1,
                               growth="scale", quiet=True, report=False))
    capacity = doc["best"]["result"]["capacity_scale"]
    assert doc["growth"] == "scale" and 1.0 < capacity < 16.0 and not doc["best"]["result"]["capacity_capped"]
    (row,) = doc["verification"]
    above = Ladder().above(capacity)
    assert [(r["label"], r["scale"]) for r in row["replays"]] == [("load", 1.0), ("capacity", capacity),
                                                                  ("above", pytest.approx(above))]
    grown = load_from_file(load, growth="scale")
    for replay in row["replays"]:
        folder = tmp_path / "out" / "verify" / "rank1" / f"{replay['label']}-{replay['scale']:.2f}x"
        assert replay["folder"] == str(folder)
        replayed = Schedule.load(folder / "schedule.npz")
        assert np.array_equal(replayed.arrival_s, grown.at(replay["scale"]).arrival_s)
        assert len(load_records(folder)) == replay["requests"] == len(replayed)
        summary = json.loads((folder / "summary.json").read_text())
        assert replay["slo_met"] == (summary["models"]["sleep_python"]["p99_s"] <= 0.060 and
                                     summary["models"]["sleep_python"]["counts"]["failed"] == 0)
        assert replay["simulated"]["sleep_python"]["p99_s"] > 0 and replay["measured"]["sleep_python"]["p99_s"] > 0
    assert row["replays"][2]["requests"] > row["replays"][1]["requests"] > 3 * row["replays"][0]["requests"]
    check = row["capacity"]
    verdicts = [(r["scale"], r["slo_met"]) for r in row["replays"]]
    assert (check["measured_met_scale"], check["measured_failed_scale"]) == measured_bracket(verdicts)
    assert check["held_at_capacity"] == row["replays"][1]["slo_met"] and check["growth"] == "scale"
    assert check["agrees"] == (row["replays"][1]["slo_met"] and not row["replays"][2]["slo_met"])
    line = doc["recommendation"][-1]
    assert line.startswith("Verified on real Triton (embedded), candidate #1") and f"{above:.2f}× (3.0 s each)" in line
    assert f"predicted capacity {capacity:.2f}× (scale)" in line


def test_gpu_placement_objectives(tmp_path):
    """With --gpus 2 the search places models on GPUs: throughput spreads them, the gpus objective packs them."""
    profile = write_profile(tmp_path / "p.json", {"a": (4.0, 0.5, 8), "b": (4.0, 0.5, 8)}, device="gpu0", kind="gpu")
    load = write_load(tmp_path / "load.yaml", {"a": 100, "b": 100}, {"a": 50, "b": 50}, duration_s=4.0)
    common = dict(load=str(load), profile=str(profile), gpus=2, instances=(1,), max_batch_sizes=(8,),
                  queue_delays_us=(0,), verify_top=0, quiet=True, report=False)
    spread = run_tune(TuneOptions(out=str(tmp_path / "throughput"), **common))
    packed = run_tune(TuneOptions(out=str(tmp_path / "gpus"), objective="gpus", **common))
    assert spread["search"]["space_points"] == 2  # {a, b} together or apart, up to renaming the GPUs
    assert spread["best"]["result"]["gpus"] == 2 and packed["best"]["result"]["gpus"] == 1
    assert spread["best"]["result"]["capacity_rps"] >= packed["best"]["result"]["capacity_rps"]
    assert {c["device"] for c in packed["best"]["config"].values()} == {"gpu0"}
    assert "on 1 GPU" in packed["recommendation"][1]


def test_two_worker_processes_give_the_serial_result(inputs, tmp_path):
    """The local executor with worker processes observes in proposal order: the same observations as one process."""
    serial = run_tune(opts(inputs, tmp_path / "serial"))
    parallel = run_tune(opts(inputs, tmp_path / "parallel", workers=2))
    assert timeless(serial) == timeless(parallel) and len(timeless(serial)) == len(serial["top"])
    assert parallel["search"]["evaluated"] == serial["search"]["evaluated"]


def timeless(doc) -> list:
    """The confirmed top candidates' keys and results, without their evaluation times."""
    return [(t["key"], {k: v for k, v in t["result"].items() if k != "eval_s"}) for t in doc["top"]
            if not t["screened"]]


def test_a_screened_tune_confirms_its_pick_on_the_whole_load(inputs, tmp_path):
    """Ranked on 30 % of the load's time, the best is then simulated on all of it: the exhaustive pick, with the
    exhaustive figures; a rerun resumes both stages."""
    whole = run_tune(opts(inputs, tmp_path / "whole"))
    assert whole["search"]["screen"] is None  # 1,500 requests: no automatic screen
    doc = run_tune(opts(inputs, tmp_path / "screened", screen=0.3, finalists=1))
    screen = doc["search"]["screen"]
    assert 0.25 < screen["requests"] / whole["load"]["requests"] < 0.35 and len(screen["spans_s"]) == 12
    assert doc["search"]["evaluated"] == 6 and 1 <= screen["confirmed"] < 6
    assert doc["best"]["key"] == whole["best"]["key"]
    assert timeless(doc)[0] == timeless(whole)[0]  # the whole load's figures, not the screen's
    flags = [t["screened"] for t in doc["top"]]
    assert flags == sorted(flags) and flags.count(False) == min(screen["confirmed"], len(flags))
    assert len((tmp_path / "screened" / "confirmed.jsonl").read_text().splitlines()) == 1 + screen["confirmed"]
    again = run_tune(opts(inputs, tmp_path / "screened", screen=0.3, finalists=1))
    assert again["search"]["resumed"] == 6 and timeless(again) == timeless(doc)


def test_a_misleading_screen_confirms_until_the_pick_is_ahead_of_the_rest(inputs, tmp_path, monkeypatch):
    """The screen ranks the whole load's worst candidate first: it is confirmed, found worse, and the next ones are
    confirmed until the best confirmed ranks ahead of every unconfirmed screen result."""
    import serving_bench.tune.search as search

    whole = run_tune(opts(inputs, tmp_path / "whole"))
    worst = whole["top"][-1]["key"]
    real = search.evaluate

    def lying(ctx, params):
        result = real(ctx, params)
        if "screen_spans" in ctx.load.base.meta and ctx.space.key(params) == worst:
            result = dict(result, feasible=True, capacity_scale=99.0, capacity_rps=99.0 * ctx.offered_rps)
        return result

    monkeypatch.setattr(search, "evaluate", lying)
    doc = run_tune(opts(inputs, tmp_path / "screened", screen=0.5, finalists=1))
    confirmed = [json.loads(line)["key"] for line in
                 (tmp_path / "screened" / "confirmed.jsonl").read_text().splitlines()[1:]]
    assert confirmed[0] == worst and len(confirmed) >= 2
    assert doc["best"]["key"] == whole["best"]["key"] != worst


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_worker_processes_end_with_a_killed_tune(inputs, tmp_path, how):
    """A tune killed outright (SIGKILL: no handler runs, the pool is never shut down) leaves no worker behind; one
    stopped by SIGTERM unwinds as on Ctrl-C: it says where its observations are, exits 130 and leaves none either."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    log = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "serving_bench.cli", "tune", str(inputs["load"]), "--profile",
                             str(inputs["profile"]), "--workers", "2", "--verify-top", "0", "--duration", "600",
                             "--out", str(tmp_path / "out")], stdout=subprocess.DEVNULL, stderr=log)

    def workers() -> list[int]:
        out = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and "multiprocessing-fork" in (entry / "cmdline").read_text() and \
                        (entry / "stat").read_text().split()[3] == str(proc.pid):
                    out.append(int(entry.name))
            except OSError:
                continue
        return out

    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 60
    while len(workers()) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    spawned = workers()
    assert len(spawned) == 2, "the tune's two workers never started"
    os.kill(proc.pid, getattr(signal, how))
    proc.wait(timeout=120)
    log.close()
    if how == "SIGTERM":
        stderr = (tmp_path / "stderr.txt").read_text()
        assert proc.returncode == 130, stderr
        assert "interrupted (SIGTERM)" in stderr and "run the same command again to resume" in stderr, stderr
        assert (tmp_path / "out" / "observations.jsonl").exists()
    else:
        assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    alive = spawned
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in spawned if running(pid)]
    assert not alive, f"workers {alive} outlived their tune"


def test_threads_per_instance_are_simulated_and_recommended(tmp_path, capsys):
    """``tune --threads-per-instance N`` runs every candidate's instances at N threads. The profile (2 cores) serves
    a request in 5 ms at 2 threads per instance and 8 ms at 1; one instance gets both cores by default, so a p50 of
    6.5 ms is met; told 1 thread it is not; told 2 it is, and the recommendation says how to serve it. 0 threads is
    a one-line input error, nothing written."""
    from tune_fixtures import two_thread_profile_json

    (tmp_path / "p.json").write_text(json.dumps(two_thread_profile_json("m")))
    load = write_load(tmp_path / "l.yaml", {"m": 20}, {})
    argv = ["tune", str(load), "--profile", str(tmp_path / "p.json"), "--slo", "m=p50:6.5ms", "--instances", "1",
            "--max-batch-sizes", "1", "--queue-delays-us", "0", "--verify-top", "0"]
    assert cli_main([*argv, "--out", str(tmp_path / "default")]) == 0
    assert cli_main([*argv, "--threads-per-instance", "1", "--out", str(tmp_path / "one")]) == 1
    assert cli_main([*argv, "--threads-per-instance", "2", "--out", str(tmp_path / "two")]) == 0
    doc = json.loads((tmp_path / "two" / "tune.json").read_text())
    assert doc["threads_per_instance"] == 2 and doc["satisfiable"]
    assert "2 runtime threads per instance (serve --threads-per-instance 2)" in doc["recommendation"][0]
    capsys.readouterr()
    assert cli_main([*argv, "--threads-per-instance", "0", "--out", str(tmp_path / "zero")]) == 2
    assert not (tmp_path / "zero").exists()


def test_simulate_and_tune_serve_a_profile_without_a_repository_alike(tmp_path):
    """Without --repo or --config, ``simulate`` and ``tune`` (and ``plan``) start from one config: each model as
    exported and served by Triton — one instance on its first device, dynamic batching up to the largest batch size
    the profile measured (1 for a model measured at batch 1 only: one request per execution)."""
    from serving_bench.load.profile import LoadProfile, build_schedule
    from serving_bench.profiles.schema import Profile
    from serving_bench.sim.cli import serving_config_for
    from serving_bench.tune.run import base_config
    from serving_bench.tune.load import load_from_file

    profile = Profile.load(write_profile(tmp_path / "p.json", {"batched": (2.0, 1.0, 8), "single": (1.0, 0.0, 1)}))
    load_path = write_load(tmp_path / "l.yaml", {"batched": 50, "single": 20}, {}, duration_s=2.0)
    simulated = serving_config_for(None, None, profile, build_schedule(LoadProfile.load(load_path)))
    tuned = base_config(None, profile, load_from_file(load_path))
    assert simulated == tuned
    assert simulated["batched"].max_batch_size == 8 and simulated["batched"].dynamic_batching
    assert simulated["single"].max_batch_size == 1
    assert {m.instances for m in simulated.models} == {(("cpu", 1),)}
