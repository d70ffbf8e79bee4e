"""The profile of variant entries on the real tritonserver: each entry's variant id and zoo model, the threads its
variant fixes, its memory per instance and its CPU-seconds per request (the proxy on a host without RAPL); and the
memory k instances are predicted to hold against a real server of k instances."""

from __future__ import annotations

import os

import pytest

from serving_bench.calibrate.measure import measure_profile
from serving_bench.calibrate.plan import MeasureConfig
from serving_bench.calibrate.session import Session
from serving_bench.export.api import export_models
from serving_bench.export.frameworks import ExportOptions
from serving_bench.profiles.entries import ModelOnDevice
from serving_bench.serve.server import TritonServer
from serving_bench.telemetry.instances import footprint_bytes, instance_memory, instance_processes

pytestmark = pytest.mark.server

DEFAULT, ONE = "tiny_cnn_onnxruntime", "tiny_cnn_onnxruntime_intra-1"
BATCH = 4


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("variants") / "repo"
    records = export_models("tiny_cnn", options=ExportOptions(max_batch_size=BATCH), repo=repo,
                            variants="onnxruntime,onnxruntime:intra=1")
    assert [r["status"] for r in records] == ["exported"] * 2, records
    return repo


def test_a_profile_of_variant_entries_records_each_variant_its_memory_and_energy(repo, tmp_path):
    """At 2 threads per instance the default entry is measured again at 1 (other_threads); the intra=1 entry runs
    1 whatever the server says, so its profile says 1 and holds no other table."""
    profile = measure_profile(repo, [DEFAULT, ONE], tmp_path / "p.json", MeasureConfig(
        batch_sizes=(1, BATCH), calibrate=0, pairs=False, seconds=0.5, idle_rounds=1, threads=2))
    default, one = profile.models[DEFAULT], profile.models[ONE]
    assert (default.model, default.variant, one.model, one.variant) == ("tiny_cnn", "onnxruntime", "tiny_cnn",
                                                                      "onnxruntime:intra=1")
    md, md1 = default.devices["cpu"], one.devices["cpu"]
    assert (md.threads, sorted(md.other_threads), md1.threads, dict(md1.other_threads)) == (2, [1], 1, {})
    for m in (md, md1):
        assert 20e6 < m.memory_bytes <= m.memory_peak_bytes < 2e9
        assert m.memory_unique_bytes is None or 5e6 < m.memory_unique_bytes < m.memory_bytes
        assert sorted(m.energy.per_request) == [1, BATCH] and all(v > 0 for v in m.energy.cpu_s.values())
        assert sorted(m.memory_by_batch) == [1, BATCH] and m.memory_by_batch[BATCH] == m.memory_at()
        assert all(20e6 < rss <= m.memory_peak_bytes for rss, _ in m.memory_by_batch.values())
        if m.energy.measure == "cpu_seconds_proxy":
            assert m.energy.unit == "CPU-s" and m.energy.per_request == m.energy.cpu_s
    assert any("energy per request measured as" in n for n in profile.notes)


def _memory_after_largest_batches(server: TritonServer, name: str, clients: int) -> None:
    """Requests of the largest size from ``clients`` clients for a while (every instance gets some)."""
    Session(server.endpoints, server).run({name: (BATCH, clients)}, 2.0)


def test_k_instances_hold_the_predicted_memory_within_ten_percent(repo):
    """One instance's RSS and USS after requests of the largest size predict three instances' memory
    (3 * USS + RSS - USS); a server of three instances, each having served such requests, holds within 10 % of it:
    the union of the three processes' resident page frames (each page once). Where page frames cannot be read (not
    root) the truth cannot be measured: skipped, saying so."""
    if os.geteuid() != 0:
        pytest.skip("the union of resident page frames needs root (/proc/PID/pagemap hides frames otherwise)")
    with TritonServer(repo, models=[DEFAULT], instances={DEFAULT: 1}, threads_per_instance=1) as server:
        _memory_after_largest_batches(server, DEFAULT, 1)
        alone = instance_memory(server.pid).by_model()[DEFAULT]
    md = ModelOnDevice("n/a", {1: None}, memory_bytes=int(alone["rss_bytes"]),
                       memory_unique_bytes=int(alone["uss_bytes"]))
    predicted = md.memory_for(3)
    with TritonServer(repo, models=[DEFAULT], instances={DEFAULT: 3}, threads_per_instance=1) as server:
        _memory_after_largest_batches(server, DEFAULT, 3)
        pids = [p.pid for p in instance_processes(server.pid)]
        assert len(pids) == 3
        measured, how = footprint_bytes(pids)
    assert measured is not None, how
    assert abs(predicted - measured) <= 0.10 * measured, (
        f"predicted {predicted / 1e6:.0f} MB for 3 instances (RSS {alone['rss_bytes'] / 1e6:.0f} MB, USS "
        f"{alone['uss_bytes'] / 1e6:.0f} MB), measured {measured / 1e6:.0f} MB ({how})")
