"""MLPerf-style scenarios and the peak-QPS search on both targets — the real server and the simulator — through the
Target protocol (the M/D/1 sleep model: 8 ms per request; open loop for Server/Offline, closed loop for
SingleStream)."""

from __future__ import annotations

import numpy as np
import pytest
from conformance import assert_target_contract

from serving_bench.load.driver import TritonTarget
from serving_bench.load.profile import LoadProfile
from serving_bench.load.scenarios import Offline, Server, SingleStream, peak_qps

@pytest.fixture(scope="module", params=[pytest.param("triton", marks=pytest.mark.server), "sim"])
def target(request, tmp_path_factory):
    from serving_bench.export.sleep import write_sleep_entry
    from serving_bench.profiles.schema import Profile
    from serving_bench.serve.server import TritonServer
    from serving_bench.serving_config import ServingConfig
    from serving_bench.sim.target import SimTarget
    from tune_fixtures import profile_json

    repo = tmp_path_factory.mktemp("scenario_repo")
    write_sleep_entry(repo, "sleep_md1", base_ms=8.0, per_item_ms=0.0, max_batch_size=1)  # capacity ~110 req/s
    write_sleep_entry(repo, "sleep_zero", base_ms=0.0, per_item_ms=0.0)
    if request.param == "sim":
        profile = Profile.from_json(profile_json({"sleep_md1": (8.0, 0.0, 1), "sleep_zero": (0.1, 0.0, 32)}))
        yield SimTarget(profile, ServingConfig.from_repo(repo))
        return
    with TritonServer(repo) as server:
        yield TritonTarget(server)


def profile(model, p99="60ms"):
    return LoadProfile.from_mapping({"duration": 10, "seed": 1, "arrival": {"process": "poisson", "rate": 1},
                                     "models": {model: {"share": 1, "slo": {"p99": p99}}}}, "scenario.yaml")


def test_server_scenario_validity(target):
    prof = profile("sleep_md1")
    easy = Server(qps=30, min_duration_s=1.5, min_queries=30)
    schedule = easy.schedule(prof)
    assert schedule.duration_s >= 1.5 and len(schedule) >= 30
    assert easy.schedule(prof).equals(schedule)  # seeded
    gaps = np.diff(schedule.arrival_s)
    assert abs(gaps.mean() - 1 / 30) < 4 * (1 / 30) / np.sqrt(len(gaps))
    result = easy.judge(prof, schedule, target.run(schedule))
    assert_target_contract(schedule, result.records)
    assert result.valid, result.reasons
    overload = Server(qps=220, min_duration_s=1.5, min_queries=30).run(target, prof)
    assert not overload.valid and any("p99" in r for r in overload.reasons)


def test_offline_and_single_stream(target):
    offline = Offline(queries=200).run(target, profile("sleep_zero"))
    assert offline.valid and offline.figure["throughput_rps"] > 50
    assert (offline.records.table["intended_s"] == 0).all()
    single = SingleStream(min_duration_s=1.0, min_queries=40).run(target, profile("sleep_md1"))
    assert single.valid, single.reasons
    assert 0.008 <= single.figure["p90_s"] < 0.05
    sent = single.records.table["sent_s"].to_numpy()
    done = single.records.table["done_s"].to_numpy()
    assert np.all(sent[1:] >= done[:-1])  # one at a time


@pytest.mark.exclusive
def test_peak_qps_search_brackets_the_capacity(target):
    result = peak_qps(target, profile("sleep_md1"), Server(25, min_duration_s=1.2, min_queries=20),
                      tolerance=0.2, max_steps=8)
    assert result.qps is not None and 40 <= result.qps <= 125, result.steps
    valid = [s["qps"] for s in result.steps if s["valid"]]
    invalid = [s["qps"] for s in result.steps if not s["valid"]]
    assert max(valid) == result.qps and min(invalid) > result.qps
