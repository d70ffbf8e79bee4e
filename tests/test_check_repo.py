"""serving-bench check-repo: a good repository passes; each kind of breakage is one line naming file and field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from serving_bench.cli import main
from serving_bench.export.check import check_repo, torchscript_forward_args


@pytest.fixture
def repo(tiny_repo, tmp_path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(tiny_repo[0], copy)
    return copy


def lines(repo: Path) -> list[str]:
    problems, _ = check_repo(repo)
    return [p.line() for p in problems]


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (old, text)
    path.write_text(text.replace(old, new, 1))


def test_exported_repository_is_clean(tiny_repo, capsys):
    repo = tiny_repo[0]
    assert lines(repo) == []
    assert main(["check-repo", str(repo)]) == 0
    assert "entries ok" in capsys.readouterr().out


def test_malformed_config_names_file_line_and_field(repo, capsys):
    config = repo / "tiny_cnn_onnxruntime" / "config.pbtxt"
    text = config.read_text().splitlines()
    text.insert(2, "max_batch_sise: 4")
    config.write_text("\n".join(text) + "\n")
    (problem,) = lines(repo)
    assert problem.startswith(f"{config}: line 3: field max_batch_sise: malformed config.pbtxt")
    assert main(["check-repo", str(repo)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == problem and out[-1].endswith("1 problem(s) in 8 entries")


def test_missing_artifact(repo):
    (repo / "tiny_mlp_torchscript" / "1" / "model.pt").unlink()
    (repo / "tiny_mlp_tvm" / "1" / "model.so").unlink()
    assert lines(repo) == [
        f"{repo}/tiny_mlp_torchscript/1/model.pt: missing: the pytorch_libtorch entry needs its artifact model.pt",
        f"{repo}/tiny_mlp_tvm/1/model.so: missing: the python entry needs its artifact model.so"]


def test_io_names_and_dims_checked_against_the_artifact(repo):
    edit(repo / "tiny_cnn_onnxruntime" / "config.pbtxt", 'name: "input"', 'name: "images"')
    edit(repo / "tiny_mlp_onnxruntime" / "config.pbtxt", "dims: 16", "dims: 17")
    edit(repo / "tiny_mlp_torchscript" / "config.pbtxt", 'name: "input"', 'name: "x"')
    found = lines(repo)
    cnn = f"{repo}/tiny_cnn_onnxruntime/config.pbtxt"
    mlp = f"{repo}/tiny_mlp_onnxruntime/config.pbtxt"
    ts = f"{repo}/tiny_mlp_torchscript/config.pbtxt"
    assert f"{cnn}: input[0].name: 'images' is not a input of model.onnx; expected one of input" in found
    assert f"{mlp}: input[0].dims: [17]: model.onnx has [16]" in found
    assert f"{ts}: input[0].name: 'x' is not a forward argument of model.pt; expected one of input" in found
    # the manifest's record of the exported I/O disagrees too
    assert any(line.startswith(f"{mlp}: input: [('input', 'float32', [17])] differ") for line in found)


def test_changed_artifact_differs_from_manifest(repo):
    (repo / "tiny_cnn_tvm" / "1" / "model.so").write_bytes(b"not the exported library")
    assert lines(repo) == [f"{repo}/tiny_cnn_tvm/1/model.so: sha256 differs from manifest.json "
                           f"entries.tiny_cnn_tvm.sha256; expected the exported file (re-export with --overwrite)"]


def test_broken_ensemble_steps(repo):
    config = repo / "ens" / "config.pbtxt"
    edit(config, 'model_name: "tiny_cnn_torchscript"', 'model_name: "tiny_cnn_openvino"')
    edit(config, 'value: "tiny_cnn_onnxruntime.output"\n    }\n    input_map', 'value: "nowhere"\n    }\n    input_map')
    found = lines(repo)
    assert (f"{config}: ensemble_scheduling.step[1].model_name: 'tiny_cnn_openvino': expected an entry of this "
            f"repository") in found
    assert (f"{config}: ensemble_scheduling.step[2].input_map[output__0]: 'nowhere' is neither an ensemble input nor "
            f"another step's output") in found


def test_unsafe_names_and_semantic_errors(repo):
    bad = repo / "bad name"
    shutil.copytree(repo / "tiny_mlp_onnxruntime", bad)
    edit(repo / "tiny_cnn_tvm" / "config.pbtxt", 'name: "tiny_cnn_tvm"', 'name: "other"')
    edit(repo / "tiny_mlp_tvm" / "config.pbtxt", "count: 1", "count: -1")
    edit(repo / "sleep_python" / "config.pbtxt", "max_batch_size: 4", "max_batch_size: 0")
    found = lines(repo)
    assert any(line.startswith(f"{bad}: folder name: 'bad name' is not a safe model name") for line in found)
    assert (f"{repo}/tiny_cnn_tvm/config.pbtxt: name: 'other' differs from its folder name 'tiny_cnn_tvm'"
            in found)
    assert f"{repo}/tiny_mlp_tvm/config.pbtxt: instance_group[0].count: -1: expected >= 1" in found
    assert (f"{repo}/sleep_python/config.pbtxt: dynamic_batching: set while max_batch_size is 0; expected "
            f"max_batch_size >= 1") in found


def test_missing_entry_listed_in_manifest(repo):
    shutil.rmtree(repo / "tiny_mlp_tvm")
    assert lines(repo) == [f"{repo}/manifest.json: entries.tiny_mlp_tvm: lists an exported entry whose folder is "
                           f"missing"]


def test_torchscript_forward_args_read_without_unpickling(tiny_repo):
    assert torchscript_forward_args(tiny_repo[0] / "tiny_cnn_torchscript" / "1" / "model.pt") == ["input"]


def test_variant_settings_must_match_the_variant(repo):
    """A config whose runtime fields are not its variant's (edited by hand), or whose variant names another
    framework or does not parse, is a problem line naming the parameters."""
    config = repo / "tiny_cnn_onnxruntime" / "config.pbtxt"
    edit(config, 'string_value: "onnxruntime"\n  }\n}\nparameters {\n  key: "precision"',
         'string_value: "onnxruntime"\n  }\n}\nparameters {\n  key: "intra_op_thread_count"\n  value {\n'
         '    string_value: "2"\n  }\n}\nparameters {\n  key: "precision"')
    (problem,) = lines(repo)
    assert problem == (f"{config}: parameters: runtime settings {{'threads': 2, 'execution_mode': 'seq', "
                       f"'graph_optimization_level': 'all'}} differ from variant onnxruntime's "
                       f"{{'execution_mode': 'seq', 'graph_optimization_level': 'all'}}")
    edit(repo / "tiny_mlp_torchscript" / "config.pbtxt", 'key: "variant"\n  value {\n    string_value: "torchscript"',
         'key: "variant"\n  value {\n    string_value: "tvm:intra=2"')
    edit(repo / "tiny_mlp_onnxruntime" / "config.pbtxt", 'key: "variant"\n  value {\n    string_value: "onnxruntime"',
         'key: "variant"\n  value {\n    string_value: "onnxruntime:turbo"')
    found = lines(repo)
    assert f"{repo}/tiny_mlp_torchscript/config.pbtxt: parameters.variant: 'tvm:intra=2' is a tvm variant; expected " \
           f"one of torchscript's" in found
    assert any(p.startswith(f"{repo}/tiny_mlp_onnxruntime/config.pbtxt: parameters.variant: 'turbo' is not a "
                            f"setting of onnxruntime") for p in found)
