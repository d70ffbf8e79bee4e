"""Bad input, every command: one line ``error: <file or option>: <field>: <what was expected>``, exit status 2, and
nothing written where the command would have written. No server starts: input is checked before anything runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from serving_bench.cli import main as cli
from tune_fixtures import write_profile

GOOD_LOAD = "name: ok\nduration: 2s\nseed: 1\nmodels:\n  m: {rate: 10, slo: {p99: 40ms}}\n"
SERVING = "models:\n  m: {max_batch_size: 8, dynamic_batching: true, instances: [[cpu, 1]]}\n"


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
    ("simulate: negative replications", _files(**{"l.yaml": GOOD_LOAD}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--replications", "-1", "--out", "FOLDER/out"], "out"),
    ("validate: confidence above 1", _files(**{"l.yaml": GOOD_LOAD}),
     ["validate", "FOLDER/l.yaml", "--profile", "PROFILE", "--repo", "FOLDER", "--confidence", "1.5",
      "--out", "FOLDER/out"], "out"),
    ("tune: negative host spread", _files(**{"l.yaml": GOOD_LOAD}),
     ["tune", "FOLDER/l.yaml", "--profile", "PROFILE", "--host-spread", "-0.1", "--out", "FOLDER/out"], "out"),
    ("tune: confidence without replications", _files(**{"l.yaml": GOOD_LOAD}),
     ["tune", "FOLDER/l.yaml", "--profile", "PROFILE", "--confidence", "0.9", "--replications", "0",
      "--out", "FOLDER/out"], "out"),
    ("rate beyond the schedule bound", _files(**{"l.yaml": GOOD_LOAD.replace("rate: 10", "rate: 1e9")}),
     ["replay", "FOLDER/l.yaml", "--out", "FOLDER/out"], "out"),
    ("rate of 3e6 over 20 s", _files(**{"l.yaml": GOOD_LOAD.replace("rate: 10", "rate: 3e6").replace("2s", "20s")}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--out", "FOLDER/out"], "out"),
    ("duration beyond the schedule bound", _files(**{"l.yaml": GOOD_LOAD.replace("2s", "1e9")}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--out", "FOLDER/out"], "out"),
    ("validate: schedule beyond --max-requests", _files(**{"l.yaml": GOOD_LOAD}),
     ["validate", "FOLDER/l.yaml", "--profile", "PROFILE", "--repo", "FOLDER", "--max-requests", "5",
      "--out", "FOLDER/out"], "out"),
    ("replay: --max-requests 0", _files(**{"l.yaml": GOOD_LOAD}),
     ["replay", "FOLDER/l.yaml", "--max-requests", "0", "--out", "FOLDER/out"], "out"),
    ("replay: --metrics-url without --url", _files(**{"l.yaml": GOOD_LOAD}),
     ["replay", "FOLDER/l.yaml", "--metrics-url", "127.0.0.1:8002", "--out", "FOLDER/out"], "out"),
    ("replay: bad --metrics-url", _files(**{"l.yaml": GOOD_LOAD}),
     ["replay", "FOLDER/l.yaml", "--url", "127.0.0.1:8001", "--metrics-url", "nowhere", "--out", "FOLDER/out"],
     "out"),
    ("out inside a file", _files(**{"l.yaml": GOOD_LOAD, "afile": "keep me"}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--out", "FOLDER/afile/out"], None),
    ("serving yaml: unknown top-level key", _files(**{"l.yaml": GOOD_LOAD, "s.yaml": SERVING + "modles: {}\n"}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--config", "FOLDER/s.yaml", "--out", "FOLDER/out"], "out"),
    ("serving yaml: 10000 instances", _files(**{"l.yaml": GOOD_LOAD, "s.yaml": SERVING.replace("1]]", "10000]]")}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--config", "FOLDER/s.yaml", "--out", "FOLDER/out"], "out"),
    ("serving yaml: max_batch_size 0, batch-4 requests",
     _files(**{"l.yaml": GOOD_LOAD.replace("rate: 10", "rate: 10, batch: 4"),
               "s.yaml": SERVING.replace("max_batch_size: 8, dynamic_batching: true, ", "max_batch_size: 0, ")}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--config", "FOLDER/s.yaml", "--out", "FOLDER/out"], "out"),
    ("serving yaml: batch-16 requests above max_batch_size 8",
     _files(**{"l.yaml": GOOD_LOAD.replace("rate: 10", "rate: 10, batch: 16"), "s.yaml": SERVING}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--config", "FOLDER/s.yaml", "--out", "FOLDER/out"], "out"),
    ("serving yaml: dynamic batching without a batch dimension",
     _files(**{"l.yaml": GOOD_LOAD, "s.yaml": SERVING.replace("max_batch_size: 8", "max_batch_size: 0")}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--config", "FOLDER/s.yaml", "--out", "FOLDER/out"], "out"),
    ("serving yaml: preferred size above max_batch_size",
     _files(**{"l.yaml": GOOD_LOAD, "s.yaml": SERVING.replace("true, ", "true, preferred_batch_sizes: [16], ")}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--config", "FOLDER/s.yaml", "--out", "FOLDER/out"], "out"),
    ("serving yaml: queue delay without dynamic batching",
     _files(**{"l.yaml": GOOD_LOAD, "s.yaml": SERVING.replace("dynamic_batching: true", "max_queue_delay_us: 100")}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--config", "FOLDER/s.yaml", "--out", "FOLDER/out"], "out"),
    ("serving yaml: a count that is a boolean",
     _files(**{"l.yaml": GOOD_LOAD, "s.yaml": SERVING.replace("8,", "true,")}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--config", "FOLDER/s.yaml", "--out", "FOLDER/out"], "out"),
    ("serving yaml: an ensemble of an unlisted model",
     _files(**{"l.yaml": GOOD_LOAD, "s.yaml": SERVING + "ensembles: {e: [m, other]}\n"}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--config", "FOLDER/s.yaml", "--out", "FOLDER/out"], "out"),
    ("serving yaml: max_batch_size beyond the profile's",
     _files(**{"l.yaml": GOOD_LOAD, "s.yaml": SERVING.replace("max_batch_size: 8", "max_batch_size: 2000000000")}),
     ["simulate", "FOLDER/l.yaml", "--profile", "PROFILE", "--config", "FOLDER/s.yaml", "--out", "FOLDER/out"], "out"),
    ("tune: --duration 1e9", _files(**{"l.yaml": GOOD_LOAD}),
     ["tune", "FOLDER/l.yaml", "--profile", "PROFILE", "--duration", "1e9", "--out", "FOLDER/out"], "out"),
    ("tune: --duration -1", _files(**{"l.yaml": GOOD_LOAD}),
     ["tune", "FOLDER/l.yaml", "--profile", "PROFILE", "--duration", "-1", "--out", "FOLDER/out"], "out"),
    ("tune: --max-scale 0.5", _files(**{"l.yaml": GOOD_LOAD}),
     ["tune", "FOLDER/l.yaml", "--profile", "PROFILE", "--max-scale", "0.5", "--out", "FOLDER/out"], "out"),
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


# -- the output folder, checked and held before any work ----------------------------------------------------------

def _mount_tmpfs(path, size: str, read_only: bool = False) -> None:
    """A real small (or read-only) file system at ``path``: a tmpfs, which needs root; skipped with the reason
    elsewhere. The caller unmounts it (:func:`_unmount`)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8); this run has neither")
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


def _unmount(path) -> None:
    subprocess.run(["umount", str(path)], check=False)


@pytest.fixture()
def read_only_folder(tmp_path):
    """An existing folder no file can be written in: a read-only tmpfs as root, a mode-0555 folder otherwise."""
    folder = tmp_path / "read_only"
    if os.geteuid() == 0:
        _mount_tmpfs(folder, "64m", read_only=True)
        yield folder
        _unmount(folder)
    else:
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)


@pytest.mark.parametrize("command", ["replay", "simulate", "tune", "validate"])
def test_an_unwritable_out_is_refused_before_any_work(command, read_only_folder, tmp_path, capsys):
    """``--out`` where nothing can be written, itself or below it: one line naming it, exit 2, before the schedule is
    built or a server started (the issue's replay ran its whole schedule first and lost it)."""
    (tmp_path / "l.yaml").write_text(GOOD_LOAD)
    profile = write_profile(tmp_path / "p.json", {"m": (4.0, 1.0, 8)})
    extra = {"replay": ["--repo", str(tmp_path)], "simulate": ["--profile", str(profile)],
             "tune": ["--profile", str(profile)], "validate": ["--profile", str(profile), "--repo", str(tmp_path)]}
    for out in (read_only_folder, read_only_folder / "results"):
        assert cli([command, str(tmp_path / "l.yaml"), *extra[command], "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --out: {out}") and "cannot" in err[0], err
    assert list(read_only_folder.iterdir()) == []


def test_an_out_without_room_for_the_run_is_refused(tmp_path, capsys):
    """A file system with less free space than the run's results need (400 bytes per request and a fixed 1 MB:
    ``run.results.results_bytes``): refused up front with both figures and the estimate's basis."""
    small = tmp_path / "small"
    _mount_tmpfs(small, "2m")
    try:
        (tmp_path / "l.yaml").write_text(GOOD_LOAD.replace("rate: 10", "rate: 2000"))  # 4,000 requests: 2.6 MB
        profile = write_profile(tmp_path / "p.json", {"m": (0.1, 0.01, 8)})
        assert cli(["simulate", str(tmp_path / "l.yaml"), "--profile", str(profile), "--out",
                    str(small / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.fullmatch(
            rf"error: --out: {small}/out: 2\.\d+ MB free on its file system, the run needs about 2\.6 MB "
            r"\(4,0\d\d requests: 400 bytes per request, 8 kB per second of telemetry\); free some space or choose "
            r"another folder", err[0]), err
        assert list(small.iterdir()) == []
        (tmp_path / "l.yaml").write_text(GOOD_LOAD.replace("rate: 10", "rate: 200"))  # what fits is run
        assert cli(["simulate", str(tmp_path / "l.yaml"), "--profile", str(profile), "--out",
                    str(small / "out")]) == 0
        assert (small / "out" / "records.parquet").is_file()
    finally:
        _unmount(small)


@pytest.mark.parametrize("source", ["--repo", "--csv", "--import-h200"])
def test_profile_refuses_an_unwritable_out_before_measuring(source, read_only_folder, tmp_path, capsys):
    """``profile --out FILE`` where FILE cannot be written (a read-only folder, or one to create inside it), or a
    folder stands in its place: one line naming ``--out``, exit 2, before a server starts or a file is read (the
    repository here lacks the entry, the CSV is broken: those errors would come first otherwise)."""
    (tmp_path / "t.csv").write_text("batch_size,latency_ms\n0,2\n")
    args = {"--repo": ["--repo", str(tmp_path), "--models", "absent"],
            "--csv": ["--csv", str(tmp_path / "t.csv"), "--model", "m"], "--import-h200": ["--import-h200"]}[source]
    for out in (read_only_folder / "h.json", read_only_folder / "sub" / "h.json", read_only_folder):
        assert cli(["profile", *args, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --out: {out}"), err
        assert "cannot" in err[0] or "is a folder" in err[0], err
    assert list(read_only_folder.iterdir()) == []


def test_profile_keeps_a_profile_it_could_not_write_and_names_where(tmp_path, capsys, monkeypatch):
    """A full disk: refused up front (one line, exit 2). A disk that fills after ``--out`` was checked (room for
    the hold's lock, a page, not for the profile): the profile goes to the cache folder's ``rescued/``, the one
    error line names it, exit 4; nothing is left where it was asked."""
    small = tmp_path / "small"
    _mount_tmpfs(small, "64k")
    monkeypatch.setenv("SERVING_BENCH_CACHE", str(tmp_path / "cache"))
    try:
        with open(small / "filler", "wb", buffering=0) as fh:  # the file system full to the last byte
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError:
                pass
            assert cli(["profile", "--import-h200", "--out", str(small / "h.json")]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert err == [f"error: --out: {small / 'h.json'}: cannot write there: No space left on device"], err
            fh.truncate(fh.tell() - 4096)
        assert cli(["profile", "--import-h200", "--out", str(small / "h.json")]) == 4
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "No space left on device" in err[0], err
        kept = re.search(r"what was measured is saved in (\S+)$", err[0])
        assert kept and Path(kept.group(1)).is_relative_to(tmp_path / "cache" / "rescued"), err
        assert json.loads((Path(kept.group(1)) / "h.json").read_text())["format"] == "serving-bench-profile"
        assert sorted(p.name for p in small.iterdir()) == ["filler"]
    finally:
        _unmount(small)


def _holder(folder) -> subprocess.Popen:
    """Another process holding ``folder`` as a run does (``files.hold_folder``), until it is killed."""
    code = ("import sys, time\nfrom serving_bench.files import hold_folder\nheld = hold_folder(sys.argv[1])\n"
            "print('held', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_folder_held_by_a_live_run_is_refused_and_freed_when_it_dies(tmp_path, capsys):
    """The hold is a lock the kernel frees with its holder: while the holder lives a second run into the same folder
    is one line naming it (pid, command) and exit 2; once it is killed (SIGKILL: no chance to clean up) the same
    run goes ahead."""
    (tmp_path / "l.yaml").write_text(GOOD_LOAD)
    profile = write_profile(tmp_path / "p.json", {"m": (4.0, 1.0, 8)})
    argv = ["simulate", str(tmp_path / "l.yaml"), "--profile", str(profile), "--out", str(tmp_path / "out")]
    holder = _holder(tmp_path / "out")
    try:
        assert cli(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --out: {tmp_path / 'out'} is in use by another run "
                                                   f"(pid {holder.pid} since "), err
        assert list((tmp_path / "out").iterdir()) == []
    finally:
        holder.kill()
        holder.wait()
    assert cli(argv) == 0
    assert (tmp_path / "out" / "summary.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.yaml", "out", "p.json"]  # the lock went with the run
