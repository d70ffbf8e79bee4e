"""``scripts/gpu_campaign.sh`` in its CPU plan, end to end (real exports, real tritonserver, threads, a compiled
module, the dataset's files), then ``benchmarks/gpu_fidelity.py`` reading that dataset: what a GPU session will run
and what will evaluate its dataset, checked where no GPU is (the CPU plan's figures say nothing about a GPU).

The Python is this test's own (``sys.executable``, passed with ``--python``): a git worktree without ``.venv`` runs
it as well as a full checkout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_campaign.sh"
ENTRIES = ("tiny_cnn_torchscript", "tiny_mlp_torchscript", "tiny_cnn_onnxruntime")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("campaign")
    proc = subprocess.run(["bash", str(SCRIPT), "--python", sys.executable, "--cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    [folder] = out.iterdir()
    return folder


@pytest.mark.server
@pytest.mark.slow
def test_cpu_plan_measures_every_step_into_at_most_eight_files(dataset):
    assert sorted(p.name for p in dataset.iterdir()) == ["campaign.log", "dataset.json", "dataset.md", "raw.npz"]
    data = json.loads((dataset / "dataset.json").read_text())
    assert data["format"] == "serving-bench gpu campaign 1" and data["complete"] is True
    assert data["plan"]["mode"] == "cpu" and dataset.name == f"{data['date']}_{data['machine']['machine']}"
    assert [(s["step"], s["status"]) for s in data["steps"]] == [
        ("export", "done"), ("threads eager", "done"), *((f"triton eager: {p}", "done") for p in (
            "solo", "co-located", "open loops", "cold starts", "k=2")), ("threads compiled", "done")]
    labels = [r["label"] for r in data["runs"]]
    for e in ENTRIES:  # threads: each alone per batch size, at 2 threads; Triton: one at a time, x1, x2
        assert {f"{e} b1 (eager, threads)", f"{e} b4 (eager, threads)", f"{e} x2 (eager, threads)",
                f"{e} b1 one at a time (eager)",
                f"{e} b4 one at a time (eager)", f"{e} x1 (eager)"} <= set(labels)
    assert sum(label.startswith("pair ") for label in labels) == 6  # three pairs, threads and Triton
    assert {"all together (eager)", "tiny_ensemble x1 (eager)", "tiny_cnn_torchscript cold starts (eager)",
            "tiny_cnn_torchscript b1 (compiled, threads)", "tiny_cnn_torchscript x2 (compiled, threads)"} <= set(labels)
    assert sum(label.startswith("open loop at ") for label in labels) == 3
    raw = np.load(dataset / "raw.npz", allow_pickle=False)
    for run in data["runs"]:
        for name, m in run["models"].items():
            assert m["throughput_rps"] > 0 and 0 < m["p50_ms"] <= m["p99_ms"], (run["label"], name, m)
        assert run["gpu"]["available"] is False and "NVML" in run["gpu"]["reason"]
        if run["kind"] == "triton":
            for name in run["rows"]:
                sent, done = raw[f"r{run['index']}/{name}/sent_s"], raw[f"r{run['index']}/{name}/done_s"]
                assert len(sent) == len(done) > 0 and np.all(done >= sent)
    solo = next(r for r in data["runs"] if r["label"] == "tiny_mlp_torchscript b1 one at a time (eager)")
    assert solo["role"] == "profile" and solo["models"]["tiny_mlp_torchscript"]["batches"] > 0
    assert len(raw[f"r{solo['index']}/tiny_mlp_torchscript/x_start_s"]) >= solo["models"]["tiny_mlp_torchscript"][
        "batches"]
    ensemble = next(r for r in data["runs"] if r["label"] == "tiny_ensemble one at a time (eager)")
    assert f"r{ensemble['index']}/tiny_ensemble_combiner/x_start_s" in raw.files  # the members' batches are kept too
    x2 = next(r for r in data["runs"] if r["label"] == "tiny_cnn_onnxruntime x2 (eager)")
    assert x2["instances"] == {"tiny_cnn_onnxruntime": 2} and x2["clients"] == {"tiny_cnn_onnxruntime": 4}
    compiled = data["entries"]["tiny_cnn_torchscript"]
    assert compiled["compile_s"] > 0 and compiled["compiled_vs_eager"] <= 1e-5
    assert "these figures say nothing about a GPU" in (dataset / "dataset.md").read_text()


@pytest.mark.server
@pytest.mark.slow
def test_the_fidelity_benchmark_reads_the_campaign_dataset(dataset, tmp_path):
    """The dataset's solo profiles (the one-at-a-time runs through the profile's estimators, the cold starts, the
    one-thread runs) predict its cases; the last line says these are no GPU figures."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_fidelity.py"), "--quick", "--data",
                           str(dataset), "--out", str(tmp_path)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-2]
    assert last.startswith("CPU-plan leave-out (a check, no GPU figures): throughput ")
    [result] = tmp_path.glob("gpu_fidelity_quick_*.json")
    rows = json.loads(result.read_text())["rows"]
    predicted = {(r["kind"], r["label"]) for r in rows}
    assert ("triton", "all together (eager)") in predicted and ("triton", "tiny_ensemble x1 (eager)") in predicted
    assert ("triton", "open loop at 0.9 of all together's rates (eager)") in predicted
    assert ("threads", "tiny_cnn_torchscript x2 (compiled, threads)") in predicted
    assert {r["source"] for r in rows} == {"solo", "k<=4"}
    assert all(r["simulated"]["p50_ms"] > 0 for r in rows if r["source"] == "solo")
