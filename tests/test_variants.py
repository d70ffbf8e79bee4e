"""Variants: the id and its grammar, the settings in the config and back, exports that share an artifact, what
cannot run here skipped with its reason, the runtimes applying the settings, and the int8 gate on real quantised
models (one passing, two really broken)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from serving_bench.errors import InputError
from serving_bench.export.api import export_models
from serving_bench.export.frameworks import ExportOptions, load_predictor
from serving_bench.export.quantize import RANGE_TOLERANCE, int8_gate, quantize_int8
from serving_bench.export.repository import ModelConfig, load_manifest, read_config
from serving_bench.export.variants import Variant, auto_variants, loader_settings, parse_variants, variant_of
from serving_bench.models import MODELS, ModelSpec, TensorSpec, get_model
from serving_bench.telemetry.energy import PROXY, EnergyMeter, rapl_joules

ROOT = Path(__file__).resolve().parents[1]


def test_id_is_canonical_and_parses_back():
    v = Variant.parse("onnxruntime:int8,intra=2,opt=basic")
    assert v.id == "onnxruntime:opt=basic,intra=2,int8" and Variant.parse(v.id) == v
    assert Variant.parse("onnxruntime:opt=all,mode=seq,fp32") == Variant("onnxruntime")  # defaults drop out
    assert Variant("onnxruntime").id == "onnxruntime" and Variant("onnxruntime").is_default
    for text in ("onnxruntime:opt=disable,mode=par,intra=1,inter=3", "torchscript:intra=2,inter=1",
                 "tvm:intra=2,trials=64", "torchscript:graphs,fp16", "tensorrt:fp16"):
        assert Variant.parse(text).id == text


def test_entry_names_are_safe_and_distinct():
    from serving_bench.export.repository import check_entry_name

    variants = parse_variants("onnxruntime onnxruntime:int8 onnxruntime:opt=basic,intra=2 onnxruntime:intra=2,"
                              "opt=basic onnxruntime:mode=par,inter=2 tvm:trials=64,intra=2 torchscript:graphs")
    assert len(variants) == 6  # the fourth is the third, written in another order
    names = [v.entry_name("resnet50") for v in variants]
    assert names[:3] == ["resnet50_onnxruntime", "resnet50_onnxruntime_int8", "resnet50_onnxruntime_opt-basic_intra-2"]
    assert len(set(names)) == len(names) and all(check_entry_name(n) for n in names)


@pytest.mark.parametrize("text, expected", [
    ("onnx", "--variants: onnx: unknown framework 'onnx'; expected one of torchscript, onnxruntime, tvm, tensorrt"),
    ("onnxruntime:intra=0", "--variants: onnxruntime:intra=0: intra='0': expected an integer >= 1"),
    ("onnxruntime:inter=2", "--variants: onnxruntime:inter=2: inter=N needs mode=par"),
    ("tvm:int8", "--variants: tvm:int8: 'int8' is not a setting of tvm; expected intra=N, trials=N, fp32, fp16"),
    ("onnxruntime:opt=max", "--variants: onnxruntime:opt=max: opt='max': expected one of disable, basic, extended"),
    ("onnxruntime:intra=1,intra=2", "--variants: onnxruntime:intra=1,intra=2: intra threads given twice"),
    ("onnxruntime:fp16,int8", "--variants: onnxruntime:fp16,int8: precision given twice"),
    ("tensorrt:intra=2", "--variants: tensorrt:intra=2: 'intra=2' is not a setting of tensorrt; expected fp32, fp16"),
    ("", "--variants: expected at least one variant"),
])
def test_bad_variants_are_one_line(text, expected):
    with pytest.raises(InputError) as err:
        parse_variants(text)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_settings_go_to_the_native_config_fields_and_back():
    """What the exporter writes is what a runner reads: the fields Triton's own backends read."""
    for text in ("onnxruntime:opt=disable,mode=par,intra=2,inter=3", "onnxruntime:opt=extended",
                 "onnxruntime:opt=basic,intra=1", "torchscript:intra=1,inter=2", "tvm:intra=2"):
        v = Variant.parse(text)
        config = ModelConfig()
        config.parameters["intra_op_thread_count"].string_value = "7"  # another variant's, replaced
        v.apply_to_config(config)
        params = {k: p.string_value for k, p in config.parameters.items()}
        assert loader_settings(v.framework, params, config.optimization.graph.level) == v.loader_settings()
        assert variant_of(v.framework, params) == v
    ort = Variant.parse("onnxruntime:opt=basic,mode=par,intra=2,inter=3")
    config = ModelConfig()
    ort.apply_to_config(config)
    assert config.optimization.graph.level == -1  # Triton's onnxruntime backend: -1 basic, 1 extended, 2 disable
    assert {k: p.string_value for k, p in config.parameters.items()} == {
        "variant": ort.id, "intra_op_thread_count": "2", "inter_op_thread_count": "3", "execution_mode": "1"}
    torch_config = ModelConfig()
    Variant.parse("torchscript:intra=1,inter=2").apply_to_config(torch_config)
    assert torch_config.parameters["INTRA_OP_THREAD_COUNT"].string_value == "1"
    assert torch_config.parameters["INTER_OP_THREAD_COUNT"].string_value == "2"


def test_auto_variants_follow_the_host():
    cpu = auto_variants(["torchscript", "onnxruntime", "tvm"], gpu=False, tvm_trials=64)
    assert [v.id for v in cpu] == ["torchscript", "onnxruntime", "onnxruntime:opt=basic", "onnxruntime:int8", "tvm",
                                   "tvm:trials=64"]
    gpu = [v.id for v in auto_variants(["torchscript", "onnxruntime"], gpu=True)]
    assert "torchscript:graphs" in gpu and "torchscript:fp16" in gpu and "onnxruntime:int8" not in gpu


def test_variants_share_the_artifact_and_skip_what_cannot_run_here(tmp_path):
    repo = tmp_path / "repo"
    lines: list[str] = []
    records = export_models("tiny_mlp", options=ExportOptions(max_batch_size=2), repo=repo, log=lines.append,
                            variants="onnxruntime,onnxruntime:opt=basic,intra=2,onnxruntime:mode=par,inter=2,"
                                     "torchscript:intra=1,torchscript:fp16,torchscript:graphs")
    status = {r["name"]: r for r in records}
    base, shared = status["tiny_mlp_onnxruntime"], status["tiny_mlp_onnxruntime_opt-basic_intra-2"]
    assert base["status"] == shared["status"] == "exported" and shared["artifact_shared_with"] == base["name"]
    assert shared["sha256"] == base["sha256"] and shared["parity_error"] <= 1e-4
    onnx_a, onnx_b = repo / base["name"] / base["artifact"], repo / shared["name"] / shared["artifact"]
    assert os.stat(onnx_a).st_ino == os.stat(onnx_b).st_ino  # one file, two entries
    assert read_config(repo / shared["name"] / "config.pbtxt").parameters["variant"].string_value == \
        "onnxruntime:opt=basic,intra=2"
    manifest = load_manifest(repo)["entries"]
    assert manifest["tiny_mlp_onnxruntime_mode-par_inter-2"]["variant"] == "onnxruntime:mode=par,inter=2"
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the fp16 and CUDA-graph variants really ran")
    for name, what in (("tiny_mlp_torchscript_fp16", "fp16"), ("tiny_mlp_torchscript_graphs", "CUDA graphs")):
        reason = status[name]["reason"]
        assert status[name]["status"] == "skipped" and reason.startswith(what) and "only on a GPU" in reason
        assert not (repo / name).exists() and manifest[name]["status"] == "skipped"
    assert any(line.startswith("tiny_mlp_torchscript_fp16: skipped: fp16 variants run only on a GPU")
               for line in lines)


def test_served_view_keeps_the_variant_settings_over_the_server_threads(tmp_path):
    """The runtime view of a native entry keeps its variant's fields; the runner reads them (the entry's intra-op
    threads win over ``threads_per_instance``, tests/test_variants_served.py counts the threads it runs)."""
    from serving_bench.serve.runtime_view import build_runtime_repo

    repo = tmp_path / "repo"
    export_models("tiny_mlp", options=ExportOptions(max_batch_size=2), repo=repo,
                  variants="onnxruntime:opt=basic,intra=2")
    build_runtime_repo(repo, tmp_path / "view", threads_per_instance=1)
    served = read_config(tmp_path / "view" / "tiny_mlp_onnxruntime_opt-basic_intra-2" / "config.pbtxt")
    params = {k: p.string_value for k, p in served.parameters.items()}
    assert served.backend == "python" and params["threads_per_instance"] == "1"
    assert loader_settings(params["framework"], params, served.optimization.graph.level) == {
        "threads": 2, "execution_mode": "seq", "graph_optimization_level": "basic"}


def test_variants_and_frameworks_are_exclusive_and_checked_first(tmp_path):
    with pytest.raises(InputError, match="either --frameworks or --variants"):
        export_models("tiny_mlp", "onnxruntime", tmp_path / "r", variants="onnxruntime:int8")
    with pytest.raises(InputError, match="give the precision in each variant"):
        export_models("tiny_mlp", options=ExportOptions(precision="fp16"), repo=tmp_path / "r", variants="onnxruntime")
    with pytest.raises(InputError, match=r"tvm:trials=64"):
        export_models("tiny_mlp", options=ExportOptions(tvm_tune_trials=64), repo=tmp_path / "r", variants="tvm")
    assert not (tmp_path / "r").exists()


def test_cli_variants(tmp_path, capsys):
    from serving_bench.cli import main

    repo = tmp_path / "r"
    assert main(["export", "--models", "tiny_mlp", "--variants", "onnxruntime:intra=1 onnxruntime:int8", "--repo",
                 str(repo), "--max-batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "tiny_mlp_onnxruntime_intra-1: exported (parity" in out
    assert "tiny_mlp_onnxruntime_int8: exported (int8 gate passed: range error" in out
    assert "2 exported, 0 skipped, 0 failed" in out
    assert main(["export", "--models", "tiny_mlp", "--variants", "onnxruntime:turbo", "--repo", str(repo)]) == 2
    assert "--variants: onnxruntime:turbo: 'turbo' is not a setting of onnxruntime" in capsys.readouterr().err


# -- the runtimes apply the settings ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_artifacts(tmp_path_factory):
    repo = tmp_path_factory.mktemp("artifacts")
    records = export_models("tiny_cnn", "onnxruntime,torchscript,tvm", repo, options=ExportOptions(max_batch_size=4))
    assert all(r["status"] == "exported" for r in records)
    return repo


def test_onnxruntime_session_takes_every_setting(tiny_artifacts):
    import onnxruntime as ort

    predict = load_predictor("onnxruntime", tiny_artifacts / "tiny_cnn_onnxruntime" / "1", ["input"], ["output"],
                             **Variant.parse("onnxruntime:opt=basic,mode=par,intra=2,inter=3").loader_settings())
    options = predict.session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 3)
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL


PROBE = """
import json, sys
from serving_bench.export.frameworks import load_predictor
from serving_bench.export.variants import Variant
from serving_bench.models import get_model
variant = Variant.parse(sys.argv[2])
spec = get_model("tiny_cnn")
predict = load_predictor(variant.framework, sys.argv[1], spec.input_names, spec.output_names,
                         **variant.loader_settings())
predict(spec.make_inputs(2, 0))
if variant.framework == "torchscript":
    import torch
    print(json.dumps([torch.get_num_threads(), torch.get_num_interop_threads()]))
else:
    import tvm
    print(json.dumps([int(tvm.get_global_func("runtime.NumThreads")())]))
"""


@pytest.mark.parametrize("entry, variant, expected", [
    ("tiny_cnn_torchscript", "torchscript:intra=1,inter=3", [1, 3]),
    ("tiny_cnn_torchscript", "torchscript:intra=2,inter=1", [2, 1]),
    ("tiny_cnn_tvm", "tvm:intra=2", [2]),  # TVM's own default here is 1 (half the logical cores)
    ("tiny_cnn_tvm", "tvm:intra=1", [1]),
])
def test_process_wide_thread_settings_take_effect_in_a_fresh_process(tiny_artifacts, entry, variant, expected):
    """torch's and TVM's thread counts belong to the process, as in a served instance's own stub process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_NUM_THREADS", None)
    env.pop("TVM_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", PROBE, str(tiny_artifacts / entry / "1"), variant], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == expected


# -- the int8 gate ----------------------------------------------------------------------------------------------------

def test_int8_gate_passes_a_proper_quantisation_and_rejects_wrong_weight_scales(tmp_path):
    """A real int8 graph of tiny_cnn passes; the same graph with its first convolution's weight scale four times too
    large (what a wrong calibration does) is a real model that computes something else, and the gate says so."""
    import onnx
    from onnx import numpy_helper

    from serving_bench.export.onnx_file import write_onnx

    spec = get_model("tiny_cnn")
    module = spec.create(0)
    fp32 = write_onnx(module, spec, tmp_path / "fp32.onnx", 8, 0)
    (tmp_path / "good").mkdir()
    quantize_int8(fp32, tmp_path / "good" / "model.onnx")
    good = int8_gate(load_predictor("onnxruntime", tmp_path / "good", ["input"], ["output"]), module, spec, 8)
    assert good.passed and good.range_error <= RANGE_TOLERANCE and good.top1_agreement >= 0.9 and good.rows == 32

    graph = onnx.load(str(tmp_path / "good" / "model.onnx"))
    scales = [i for i in graph.graph.initializer if i.name.endswith("weight_scale")]
    assert scales, "the quantised graph has no weight scales"
    scales[0].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scales[0]) * np.float32(4), scales[0].name))
    (tmp_path / "bad").mkdir()
    onnx.save(graph, str(tmp_path / "bad" / "model.onnx"))
    bad = int8_gate(load_predictor("onnxruntime", tmp_path / "bad", ["input"], ["output"]), module, spec, 8)
    assert not bad.passed and bad.range_error > 10 * RANGE_TOLERANCE and bad.top1_agreement < 0.5  # 0.73, 0.03
    assert bad.reason().startswith("int8 accuracy gate failed: range error")


class OutlierMLP:
    """16 -> 32 -> 10 with one first-layer weight of 500 on a hidden unit the second layer ignores: the fp32 function
    does not see it, but one scale per tensor does (every other weight of that layer, and every other hidden
    activation, rounds to zero in int8) — the outlier-channel failure of per-tensor int8."""

    def __new__(cls):
        import torch

        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        with torch.no_grad():
            model[0].weight[31, 0] = 500.0
            model[2].weight[:, 31] = 0.0
        return model


def _outlier_spec() -> ModelSpec:
    return ModelSpec("outlier_mlp", "16 -> 10 with an outlier weight (tests)",
                     inputs=(TensorSpec("input", "float32", (16,)),), outputs=(TensorSpec("output", "float32", (10,)),),
                     build=OutlierMLP)


def test_gate_rejects_a_model_whose_quantisation_fails_and_it_is_never_served(tmp_path, monkeypatch, capsys):
    """The whole path: the export reports the rejection (manifest, CLI line), writes no entry, removes an older one
    of that name, and check-repo is clean."""
    from serving_bench.cli import main
    from serving_bench.export.check import check_repo

    monkeypatch.setitem(MODELS, "outlier_mlp", _outlier_spec)
    repo = tmp_path / "repo"
    (repo / "outlier_mlp_onnxruntime_int8").mkdir(parents=True)  # an older entry of that name
    assert main(["export", "--models", "outlier_mlp", "--variants", "onnxruntime,onnxruntime:int8", "--repo",
                 str(repo), "--max-batch-size", "8", "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert "outlier_mlp_onnxruntime: exported (parity" in out
    assert "outlier_mlp_onnxruntime_int8: rejected: int8 accuracy gate failed: range error" in out
    assert "1 exported, 0 skipped, 1 rejected by the int8 gate, 0 failed" in out
    record = load_manifest(repo)["entries"]["outlier_mlp_onnxruntime_int8"]
    assert record["status"] == "rejected" and record["variant"] == "onnxruntime:int8"
    assert record["gate"]["range_error"] > 5 * RANGE_TOLERANCE and not record["gate"]["passed"]  # 0.54
    assert record["gate"]["top1_agreement"] < 0.9  # 0.375
    assert sorted(p.name for p in repo.iterdir()) == ["manifest.json", "outlier_mlp_onnxruntime"]
    assert check_repo(repo)[0] == []


# -- energy -----------------------------------------------------------------------------------------------------------

def test_energy_reads_the_counters_here_or_names_the_proxy():
    with EnergyMeter(pids=[os.getpid()], gpu=True) as meter:
        total = 0.0
        for i in range(3_000_000):  # ~0.2 s of this process's CPU
            total += i * 0.5
    reading = meter.reading
    assert 0.05 < reading.cpu_s <= reading.elapsed_s * (os.cpu_count() or 1) + 0.05
    per = reading.per_request(10)
    assert per["cpu_s"] == pytest.approx(reading.cpu_s / 10)
    if reading.measure == PROXY:
        assert reading.energy_j is None and per["energy_j"] is None
        assert "RAPL" in reading.host_source and reading.gpu_source  # why no counter was read
    else:
        assert reading.energy_j > 0


def test_rapl_wraparound():
    span = 262_143_328_850
    assert rapl_joules({"intel-rapl:0": (1_000_000, span)}, {"intel-rapl:0": (3_500_000, span)}) == 2.5
    assert rapl_joules({"intel-rapl:0": (span - 1_000_000, span)}, {"intel-rapl:0": (500_000, span)}) == 1.5

