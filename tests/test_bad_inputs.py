"""Bad input, every command: one line ``error: <file or option>: <field>: <what was expected>``, exit status 2, and
nothing written where the command would have written. No server starts: input is checked before anything runs."""

from __future__ import annotations

import json

import pytest

from serving_bench.cli import main as cli
from tune_fixtures import write_load, write_profile

GOOD_LOAD = "name: ok\nduration: 2s\nseed: 1\nmodels:\n  m: {rate: 10, slo: {p99: 40ms}}\n"


def _files(**files):
    """A case's input files: name -> text (written into the test's folder)."""
    return files


# (case id, files to write, argv (FOLDER is the test's folder), where the command would write)
CASES = [
    ("yaml syntax", _files(**{"l.yaml": "name: [x\n"}), ["replay", "FOLDER/l.yaml", "--out", "FOLDER/out"], "out"),
    ("unknown arrival process", _files(**{"l.yaml": GOOD_LOAD.replace("models:", "arrival: {process: zipf}\nmodels:")}),
     ["replay", "FOLDER/l.yaml", "--out", "FOLDER/out"], "out"),
    ("negative rate", _files(**{"l.yaml": GOOD_LOAD.replace("rate: 10", "rate: -3")}),
     ["replay", "FOLDER/l.yaml", "--out", "FOLDER/out"], "out"),
    ("no models", _files(**{"l.yaml": "name: x\nduration: 2s\nmodels: {}\n"}),
     ["replay", "FOLDER/l.yaml", "--out", "FOLDER/out"], "out"),
    ("share not a number", _files(**{"l.yaml": GOOD_LOAD.replace("rate: 10", "share: lots")}),
     ["replay", "FOLDER/l.yaml", "--out", "FOLDER/out"], "out"),
    ("bad duration", _files(**{"l.yaml": GOOD_LOAD.replace("2s", "two seconds")}),
     ["replay", "FOLDER/l.yaml", "--out", "FOLDER/out"], "out"),
    ("missing trace", _files(**{"l.yaml": "name: t\nduration: 2s\narrival: {process: trace, path: nope.csv}\n"
                                          "models:\n  m: {share: 1}\n"}),
     ["replay", "FOLDER/l.yaml", "--out", "FOLDER/out"], "out"),
    ("malformed trace", _files(**{"l.yaml": "name: t\nduration: 2s\narrival: {process: trace, path: t.csv}\n"
                                            "models:\n  m: {share: 1}\n", "t.csv": "when,what\nsoon,m\n"}),
     ["replay", "FOLDER/l.yaml", "--out", "FOLDER/out"], "out"),
    ("missing load profile", _files(), ["replay", "FOLDER/none.yaml", "--out", "FOLDER/out"], "out"),
    ("out is a file", _files(**{"l.yaml": GOOD_LOAD, "out": "keep me"}),
     ["replay", "FOLDER/l.yaml", "--out", "FOLDER/out"], None),
    ("missing repo", _files(**{"l.yaml": GOOD_LOAD}),
     ["replay", "FOLDER/l.yaml", "--repo", "FOLDER/norepo", "--out", "FOLDER/out"], "out"),
    ("bad timeout", _files(**{"l.yaml": GOOD_LOAD}),
     ["replay", "FOLDER/l.yaml", "--timeout", "soon", "--out", "FOLDER/out"], "out"),
    ("zero concurrency", _files(**{"l.yaml": GOOD_LOAD}),
     ["replay", "FOLDER/l.yaml", "--concurrency", "0", "--out", "FOLDER/out"], "out"),
    ("bad instances", _files(**{"l.yaml": GOOD_LOAD}),
     ["replay", "FOLDER/l.yaml", "--instances", "m:2", "--out", "FOLDER/out"], "out"),
    ("bad url", _files(**{"l.yaml": GOOD_LOAD}),
     ["replay", "FOLDER/l.yaml", "--url", "not a url", "--out", "FOLDER/out"], "out"),
    ("profile missing", _files(**{"l.yaml": GOOD_LOAD}),
     ["simulate", "FOLDER/l.yaml", "--profile", "FOLDER/none.json", "--out", "FOLDER/out"], "out"),
    ("profile not json", _files(**{"l.yaml": GOOD_LOAD, "p.json": "{nope"}),
     ["simulate", "FOLDER/l.yaml", "--profile", "FOLDER/p.json", "--out", "FOLDER/out"], "out"),
    ("profile wrong version", _files(**{"l.yaml": GOOD_LOAD, "p.json": json.dumps({"format": "serving-bench-profile",
                                                                                 "version": 7})}),
     ["simulate", "FOLDER/l.yaml", "--profile", "FOLDER/p.json", "--out", "FOLDER/out"], "out"),
    ("profile lacks the model", _files(**{"l.yaml": GOOD_LOAD.replace(" m:", " other:")}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--out", "FOLDER/out"], "out"),
    ("profile bad law", _files(**{"l.yaml": GOOD_LOAD}),
     ["simulate", "FOLDER/l.yaml", "--profile", "BADLAW", "--out", "FOLDER/out"], "out"),
    ("simulate: threads per instance 0", _files(**{"l.yaml": GOOD_LOAD}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--threads-per-instance", "0", "--out", "FOLDER/out"],
     "out"),
    ("validate: threads per instance 0", _files(**{"l.yaml": GOOD_LOAD}),
     ["validate", "FOLDER/l.yaml", "--profile", "PROFILE", "--repo", "FOLDER", "--threads-per-instance", "0",
      "--out", "FOLDER/out"], "out"),
    ("profile: rounds 0", _files(), ["profile", "--repo", "FOLDER", "--models", "m", "--rounds", "0", "--out",
                                     "FOLDER/p_out.json"], "p_out.json"),
    ("profile: bad batch sizes", _files(), ["profile", "--repo", "FOLDER", "--models", "m", "--batch-sizes", "0,x",
                                            "--out", "FOLDER/p_out.json"], "p_out.json"),
    ("profile: missing entry", _files(), ["profile", "--repo", "FOLDER", "--models", "m", "--out",
                                          "FOLDER/p_out.json"], "p_out.json"),
    ("profile: bad csv", _files(**{"t.csv": "batch_size,latency_ms\n0,2\n"}),
     ["profile", "--csv", "FOLDER/t.csv", "--model", "m", "--out", "FOLDER/p_out.json"], "p_out.json"),
    ("export: unknown model", _files(), ["export", "--models", "resnet9000", "--frameworks", "onnxruntime",
                                         "--repo", "FOLDER/repo"], "repo"),
    ("export: unknown framework", _files(), ["export", "--models", "tiny_mlp", "--frameworks", "caffe",
                                             "--repo", "FOLDER/repo"], "repo"),
    ("export: name escaping the repo", _files(), ["export", "--models", "tiny_mlp", "--frameworks", "onnxruntime",
                                                  "--ensemble", "../evil=tiny_mlp_onnxruntime,tiny_mlp_onnxruntime",
                                                  "--repo", "FOLDER/repo"], "repo"),
    ("export: max batch 0", _files(), ["export", "--models", "tiny_mlp", "--frameworks", "onnxruntime",
                                       "--max-batch-size", "-1", "--repo", "FOLDER/repo"], "repo"),
    ("tune: bad slo", _files(**{"l.yaml": GOOD_LOAD}),
     ["tune", "FOLDER/l.yaml", "--profile", "PROFILE", "--slo", "m:p99<fast", "--out", "FOLDER/out"], "out"),
    ("tune: no finalists", _files(**{"l.yaml": GOOD_LOAD}),
     ["tune", "FOLDER/l.yaml", "--profile", "PROFILE", "--finalists", "0", "--out", "FOLDER/out"], "out"),
    ("tune: unknown model", _files(**{"l.yaml": GOOD_LOAD}),
     ["tune", "FOLDER/l.yaml", "--profile", "PROFILE", "--models", "zz", "--out", "FOLDER/out"], "out"),
    ("plan: forecast missing", _files(), ["plan", "FOLDER/none.yaml"], None),
    ("check-repo: missing repo", _files(), ["check-repo", "FOLDER/norepo"], None),
]


@pytest.mark.parametrize("case, files, argv, writes", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_written(case, files, argv, writes, tmp_path, capsys):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    profile = write_profile(tmp_path / "good_profile.json", {"m": (4.0, 1.0, 8)})
    bad_law = json.loads(profile.read_text())
    bad_law["devices"]["cpu"]["law"] = {"name": "pool_eff"}
    (tmp_path / "bad_law.json").write_text(json.dumps(bad_law))
    argv = [a.replace("FOLDER", str(tmp_path)).replace("BADLAW", str(tmp_path / "bad_law.json"))
            .replace("PROFILE", str(profile)) for a in argv]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cli(argv) == 2, case
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "something was written"
    if writes:
        assert not (tmp_path / writes).exists() or (tmp_path / writes).read_text() == "keep me"
