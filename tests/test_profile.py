"""Profiles: JSON round trip, one-line errors, the batch-size interpolation rule, CSV and H200 import, and (server)
measurement + validate on the real Triton with the sleep model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from serving_bench.errors import InputError
from serving_bench.profiles import Dist, Profile
from serving_bench.profiles.importers import import_csv, import_h200_eager


def test_h200_import_is_eager_and_round_trips(tmp_path):
    profile = import_h200_eager()
    md = profile.models["resnet50_fp16"].devices["gpu0"]
    assert md.execution_mode == "eager" and any("EAGER" in n for n in profile.notes)
    assert md.batches[1].median == pytest.approx(4.3834e-3)
    path = profile.save(tmp_path / "h200.json")
    again = Profile.load(path)
    assert again.to_json() == json.loads(path.read_text())
    assert again.models["bert_base_fp32"].devices["gpu0"].batch_sizes == (1, 2, 4, 8, 16, 32, 64, 128)


def test_interpolation_between_measured_batch_sizes_is_comonotone_linear():
    md = import_h200_eager().models["resnet50_fp16"].devices["gpu0"]
    lo, hi, mid = md.batches[64], md.batches[128], md.service(96)
    for u in (0.0, 0.5, 0.9, 1.0):
        assert mid.quantile(u) == pytest.approx((lo.quantile(u) + hi.quantile(u)) / 2)
    with pytest.raises(KeyError):
        md.service(256)


def test_csv_import_samples_and_quantiles(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("batch_size,latency_ms\n1,2.0\n1,4.0\n8,10\n")
    profile = import_csv(path, model="m", device="cpu", cores=4)
    assert profile.models["m"].devices["cpu"].batches[1] == Dist.from_samples([0.002, 0.004])
    path.write_text("batch_size,p50_ms,p90_ms,mean_ms\n1,2,3,2.5\n")
    d = import_csv(path, model="m").models["m"].devices["gpu0"].batches[1]
    assert d.mean == pytest.approx(0.0025) and d.quantile(0.9) == pytest.approx(0.003)
    path.write_text("batch_size,latency_ms\n0,2\n")
    with pytest.raises(InputError, match=r"t.csv: line 2: batch_size: expected a batch size >= 1"):
        import_csv(path, model="m")


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d.update(version=9), r"version: expected 1"),
    (lambda d: d["devices"]["gpu0"].update(kind="tpu"), r"devices.gpu0.kind"),
    (lambda d: d["models"]["resnet50_fp16"]["devices"]["gpu0"]["batches"].update({"2": {"samples_s": []}}),
     r"models.resnet50_fp16.devices.gpu0.batches.2.samples_s"),
    (lambda d: d["models"]["resnet50_fp16"]["devices"]["gpu0"].update(execution_mode="warp"),
     r"models.resnet50_fp16.devices.gpu0.execution_mode"),
])
def test_bad_profile_is_one_line_naming_file_and_field(tmp_path, mutate, where):
    data = import_h200_eager().to_json()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=where) as info:
        Profile.load(path)
    assert "\n" not in info.value.line() and str(path) in info.value.line()


@pytest.mark.server
@pytest.mark.slow
def test_measure_then_validate_on_real_triton(tmp_path):
    """Profile the sleep model on the real server, then validate the simulator against a real replay of it."""
    from serving_bench.export.sleep import write_sleep_entry
    from serving_bench.profiles.measure import measure_profile
    from serving_bench.sim.validate import run_validation

    repo = tmp_path / "repo"
    write_sleep_entry(repo, "sleep_python", base_ms=5.0, per_item_ms=1.0, max_batch_size=8)
    profile = measure_profile(repo, ["sleep_python"], tmp_path / "p.json", batch_sizes=[1, 8], colocation=(1, 2),
                              seconds=1.0)
    md = profile.models["sleep_python"].devices["cpu"]
    assert 0.005 < md.batches[1].mean < 0.010 and 0.012 < md.batches[8].mean < 0.020
    s2 = md.colocation[0](2)
    assert 1.5 < s2 <= 2.0  # sleeping instances share the CPUs almost perfectly
    load = tmp_path / "load.yaml"
    load.write_text("name: v\nduration: 6s\nwarmup: 1s\nseed: 2\nmodels:\n  sleep_python: {rate: 150}\n")
    rows = run_validation(load, repo, tmp_path / "p.json", tmp_path / "val")
    errors = {r["metric"]: r["rel_error"] for r in rows}
    assert abs(errors["throughput"]) < 0.03
    assert abs(errors["p50"]) < 0.15 and abs(errors["p99"]) < 0.35  # a busy 2-core CI machine; figures in docs
    assert (tmp_path / "val" / "validation.csv").is_file() and (tmp_path / "val" / "real" / "records.parquet").is_file()
