"""``scripts/gpu_check.sh`` in its reduced CPU plan: the whole script, real server, real closed-loop runs (no GPU
figures exist here: the CPU plan says so)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--cpu", "--quick", "--out", str(out), *args], capture_output=True,
                          text=True, timeout=400, cwd=ROOT)


@pytest.mark.server
@pytest.mark.slow
def test_cpu_plan_measures_sweep_and_pair(tmp_path):
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [result_file] = tmp_path.glob("gpu_check_*_cpu*.json")
    result = json.loads(result_file.read_text())
    assert result["plan"]["mode"] == "cpu" and result["skipped"] == [] and result["complete"] is True
    labels = [r["label"] for r in result["runs"]]
    assert labels == ["tiny_cnn_torchscript x1", "tiny_mlp_torchscript x1",
                      "pair tiny_cnn_torchscript + tiny_mlp_torchscript", "tiny_cnn_torchscript x2"]
    for run in result["runs"]:
        for name, m in run["models"].items():
            assert m["ok"] > 10 and m["failed"] == 0 and m["throughput_rps"] > 0, (run["label"], name, m)
            assert 0 < m["p50_ms"] <= m["p99_ms"]
            assert m["server_compute_ms"] > 0
        assert run["gpu"]["available"] is False and "NVML" in run["gpu"]["reason"]
    assert set(result["runs"][2]["models"]) == {"tiny_cnn_torchscript", "tiny_mlp_torchscript"}
    assert result["runs"][3]["instances"] == 2 and result["runs"][3]["concurrency"] == {"tiny_cnn_torchscript": 4}
    md = result_file.with_suffix(".md").read_text()
    assert "| tiny_cnn_torchscript x2 | tiny_cnn_torchscript | 2 | no |" in md
    assert "these figures say nothing about a GPU" in md
    assert all(r["parity_error"] <= 1e-4 for r in result["runs"] if "parity_error" in r)
    assert sum("parity_error" in r for r in result["runs"]) == 3


def test_steps_that_do_not_fit_the_budget_are_listed_as_skipped(tmp_path):
    proc = _run(tmp_path, "--budget-s", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(next(tmp_path.glob("gpu_check_*.json")).read_text())
    assert result["runs"] == []
    assert [s["step"] for s in result["skipped"]] == ["pair", "tiny_cnn_torchscript x2"]
    assert all(s["reason"].startswith("time budget") for s in result["skipped"])
