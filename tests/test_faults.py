"""Faults on the real server, each as a user meets it: the server killed mid-replay, one model instance (its
python-backend stub) killed mid-replay, Ctrl-C to the whole process group at several moments, a bad ``--out``, a
server killed mid-profile, the disk filling mid-run, a second run into a folder in use, the folder removed mid-run,
a write failing in tune. Every run keeps its records (marked partial), accounts for every request, says why it
stopped, and leaves no process or shared-memory region behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conformance import assert_target_contract

from serving_bench.run.schedule import Schedule
from serving_bench.run.records import load_records
from serving_bench.serve.shm import SHM_DIR, SHM_PREFIX

pytestmark = [pytest.mark.server, pytest.mark.slow]

PROFILE = {"name": "faults", "duration": "12s", "seed": 3, "arrival": {"process": "poisson", "rate": 100},
           "models": {"sleep_python": {"share": 1}}}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    from serving_bench.export.sleep import write_sleep_entry

    path = tmp_path_factory.mktemp("faults_repo")
    write_sleep_entry(path, "sleep_python", base_ms=2.0, per_item_ms=0.5)
    return path


@pytest.fixture()
def profile(tmp_path):
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    return path


@pytest.fixture()
def short_profile(tmp_path):
    """:data:`PROFILE` over 3 s: for the faults met while the run holds its folder (taken before the server
    starts), where what is checked comes after the run's end, not during its schedule."""
    path = tmp_path / "faults_short.yaml"
    path.write_text(yaml.safe_dump({**PROFILE, "duration": "3s"}))
    return path


def _terminal_signals() -> None:
    """Ctrl-C as a terminal's foreground command has it: a test run started in the background (``cmd &`` in a
    script) ignores SIGINT, and a process started with SIGINT ignored keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], tmp_path: Path, env: dict | None = None) -> subprocess.Popen:
    """``serving-bench ARGS`` in a process group of its own (as a shell runs a command), output to a file; ``env``
    added to the environment."""
    log = open(tmp_path / "cli.log", "w")
    return subprocess.Popen([sys.executable, "-m", "serving_bench.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=tmp_path, preexec_fn=_terminal_signals,
                            env={**os.environ, **(env or {})})


def _output(tmp_path: Path) -> str:
    return (tmp_path / "cli.log").read_text()


def _children(pid: int, name: str) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _server_of(proc: subprocess.Popen) -> int:
    found: list[int] = []

    def started() -> bool:
        found[:] = _children(proc.pid, "tritonserver")
        return bool(found)
    _wait_for(started)
    return found[0]


def _serving(server_pid: int) -> bool:
    """True once the server's stub serves (the stub is a child of the server)."""
    return bool(_children(server_pid, "triton_python_backend_stub"))


def _our_shm_regions(pid: int) -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(f"{SHM_PREFIX}{pid}_*"))


def _check_results(out: Path, reason_prefix: str) -> dict:
    records = load_records(out)
    c = assert_target_contract(Schedule.load(out / "schedule.npz"), records)
    assert records.info.partial is True and records.info.stop_reason.startswith(reason_prefix), \
        records.info.stop_reason
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True and summary["valid"] is False
    assert c["sent"] == c["ok"] + c["failed"] + c["timeout"]
    return c


def test_server_killed_mid_replay_names_the_death_and_leaves_nothing(repo, profile, tmp_path):
    out = tmp_path / "out"
    proc = _start(["replay", str(profile), "--repo", str(repo), "--out", str(out), "--no-progress"], tmp_path)
    server = _server_of(proc)
    _wait_for(lambda: _serving(server))
    time.sleep(4.0)  # mid-replay
    os.kill(server, signal.SIGKILL)
    assert proc.wait(timeout=60) == 3, _output(tmp_path)
    text = _output(tmp_path)
    assert "tritonserver died (exit code -9, SIGKILL)" in text and "server log:" in text, text
    c = _check_results(out, "server died")
    assert c["ok"] > 50 and c["not_sent"] > 100
    assert not _our_shm_regions(proc.pid), "shared-memory regions left behind"
    assert not _children(proc.pid, "triton")


def test_model_instance_killed_mid_replay_fails_fast_and_exits_non_zero(repo, profile, tmp_path):
    out = tmp_path / "out"
    started = time.monotonic()
    proc = _start(["replay", str(profile), "--repo", str(repo), "--out", str(out), "--no-progress"], tmp_path)
    server = _server_of(proc)
    _wait_for(lambda: _serving(server))
    time.sleep(4.0)
    stub = _children(server, "triton_python_backend_stub")[0]
    os.kill(stub, signal.SIGKILL)
    killed = time.monotonic()
    assert proc.wait(timeout=90) == 3, _output(tmp_path)
    # stopped at the death, without waiting for the schedule's end (12 s) or the requests' 30 s deadline
    assert time.monotonic() - killed < 12.0, time.monotonic() - started
    text = _output(tmp_path)
    assert "model instance died" in text and "sleep_python_0_0" in text, text
    c = _check_results(out, "model instance died")
    assert c["ok"] > 50 and c["not_sent"] > 100
    assert not _our_shm_regions(proc.pid), "shared-memory regions left behind"


@pytest.mark.parametrize("moment", ["server starting", "senders starting", "mid-run"])
def test_ctrl_c_to_the_process_group_keeps_every_request_accounted(repo, profile, tmp_path, moment):
    out = tmp_path / "out"
    proc = _start(["replay", str(profile), "--repo", str(repo), "--out", str(out), "--no-progress"], tmp_path)
    server = _server_of(proc)
    if moment != "server starting":
        _wait_for(lambda: _serving(server))
        if moment == "mid-run":
            time.sleep(4.0)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    assert proc.wait(timeout=60) == 130, _output(tmp_path)
    c = _check_results(out, "interrupted (Ctrl-C)")
    if moment == "mid-run":
        assert c["ok"] > 50 and c["not_sent"] > 100
    else:
        assert c["sent"] == 0 or moment == "senders starting"
    assert not _our_shm_regions(proc.pid)
    assert not _children(proc.pid, "triton")


def test_out_naming_a_file_is_one_line_and_exit_2(repo, profile, tmp_path, capsys):
    from serving_bench.cli import main as cli

    target = tmp_path / "a_file"
    target.write_text("keep me")
    assert cli(["replay", str(profile), "--repo", str(repo), "--out", str(target), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --out: {target} is a file; expected a results folder (new, empty, or --overwrite)"
    assert target.read_text() == "keep me"


def test_profile_resumes_on_a_new_server_when_the_server_dies(repo, tmp_path):
    out = tmp_path / "p.json"
    proc = _start(["profile", "--repo", str(repo), "--models", "sleep_python", "--out", str(out), "--batch-sizes",
                   "1,4", "--colocation", "1", "--seconds", "1", "--calibrate", "0"], tmp_path)
    server = _server_of(proc)
    _wait_for(lambda: "batch 1:" in _output(tmp_path))  # the first step is done, the second runs
    os.kill(server, signal.SIGKILL)
    assert proc.wait(timeout=180) == 0, _output(tmp_path)
    text = _output(tmp_path)
    assert "the server died at step" in text and "restart 1 of at most 2" in text, text
    profile = json.loads(out.read_text())
    assert any("the server died at step" in n for n in profile["notes"])
    assert set(profile["models"]["sleep_python"]["devices"]["cpu"]["batches"]) == {"1", "4"}


def test_a_crash_whose_handler_hangs_is_a_death_not_a_hang(repo):
    """Triton's crash handler can hang on a corrupted heap (the trace use-after-free, docs/serve.md): a server whose
    log says ``Signal (11) received.`` is dead even while its process lingers — killed, and named as died."""
    from serving_bench.errors import ServerDied
    from serving_bench.serve.server import TritonServer

    with TritonServer(repo) as server:
        server.check_alive()
        with open(server.log_path, "a") as log:
            log.write("Signal (11) received.\n 0# 0x000056512B62A52D in tritonserver\n")
        with pytest.raises(ServerDied, match=r"died \(signal 11 in its log"):
            server.check_alive()
        assert server.process.poll() is not None


# -- results that cannot be written where asked ---------------------------------------------------------------------

def _mounted_tmpfs(path: Path, size: str) -> None:
    """A real small file system at ``path`` (a tmpfs: root only; skipped with the reason elsewhere)."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is provoked on a small tmpfs, which needs root to mount")
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


def _fill(folder: Path) -> None:
    """Fill ``folder``'s file system to the last byte."""
    with open(folder / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass


def _lock_of(out: Path) -> Path:
    return out.parent / f".{out.name}.serving-bench-lock"


def _rescued(tmp_path: Path, text: str) -> Path:
    """The folder the one error line says the results were saved in (under this test's cache folder)."""
    lines = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, text
    match = re.search(r"what was measured is saved in (\S+), marked partial$", lines[0])
    assert match, lines[0]
    folder = Path(match.group(1))
    assert folder.is_relative_to(tmp_path / "cache" / "rescued"), folder
    return folder


@pytest.mark.parametrize("command", ["replay", "simulate"])
def test_disk_full_mid_run_keeps_the_results_elsewhere_marked_partial(command, repo, short_profile, tmp_path):
    """The output folder had room when checked, then the disk filled while the run ran (the issue: a replay left
    only ``records.parquet``, not marked partial; ``simulate`` an empty folder). The results go to the cache
    folder's ``rescued/``, marked partial, every request accounted for; the one error line says where; exit 4 (not
    3, a server failure, nor tune's 1); nothing half-written is left where they were asked."""
    disk = tmp_path / "disk"
    _mounted_tmpfs(disk, "4m" if command == "replay" else "110m")
    proc = None
    try:
        out = disk / "out"
        if command == "replay":
            args = ["replay", str(short_profile), "--repo", str(repo), "--out", str(out), "--no-progress"]
        else:  # 240,000 requests, a few seconds to simulate: results of ~27 MB, 97 MB estimated
            (tmp_path / "big.yaml").write_text("name: big\nduration: 6s\nseed: 3\nmodels:\n"
                                               "  sleep_python: {rate: 40000}\n")
            (tmp_path / "p.json").write_text(json.dumps(_sleep_profile_json()))
            args = ["simulate", str(tmp_path / "big.yaml"), "--profile", str(tmp_path / "p.json"), "--out", str(out)]
        proc = _start(args, tmp_path, env={"SERVING_BENCH_CACHE": str(tmp_path / "cache")})
        _wait_for(lambda: _lock_of(out).exists() or proc.poll() is not None)  # held: the run goes on
        _fill(disk)
        assert proc.wait(timeout=120) == 4, _output(tmp_path)
        rescued = _rescued(tmp_path, _output(tmp_path))
        assert "No space left on device" in _output(tmp_path)
        records = load_records(rescued)
        c = assert_target_contract(Schedule.load(rescued / "schedule.npz"), records)
        assert records.info.partial and "could not be written" in records.info.stop_reason
        assert json.loads((rescued / "summary.json").read_text())["partial"] is True
        assert c["ok"] == c["sent"] > 0
        assert not out.exists() or not any(out.iterdir())
        assert not _lock_of(out).exists()
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        subprocess.run(["umount", str(disk)], check=False)


def _sleep_profile_json() -> dict:
    """A simulator profile of the sleep model (2 ms + 0.5 ms per item), batches 1..32, on two cores."""
    batches = {str(b): {"constant_s": 0.002 + 0.0005 * b} for b in range(1, 33)}
    return {"format": "serving-bench-profile", "version": 1, "source": "tests", "overhead": {"constant_s": 0.0},
            "devices": {"cpu": {"kind": "cpu", "name": "test", "cores": 2}},
            "models": {"sleep_python": {"framework": "python", "precision": "fp32", "devices": {"cpu": {
                "execution_mode": "n/a", "threads": 1, "batches": batches}}}}}


def test_a_second_replay_into_a_folder_in_use_is_refused(repo, short_profile, tmp_path, capsys):
    """``replay A --out X &`` then ``replay B --out X``: B is refused at once, one line naming A, exit 2; A keeps
    its results (the issue: both said "results in X" and A's rows were gone)."""
    from serving_bench.cli import main as cli

    out = tmp_path / "X"
    first = _start(["replay", str(short_profile), "--repo", str(repo), "--out", str(out), "--no-progress"], tmp_path)
    _wait_for(lambda: _lock_of(out).exists())
    assert cli(["replay", str(short_profile), "--repo", str(repo), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --out: {out} is in use by another run (pid {first.pid} "), err
    assert first.wait(timeout=120) == 0, _output(tmp_path)
    records = load_records(out)
    assert len(records) == len(Schedule.load(out / "schedule.npz")) and not records.info.partial


def test_the_results_folder_removed_mid_replay_is_written_again(repo, short_profile, tmp_path):
    """The folder removed while the run runs: the results are written where they were asked, whole."""
    out = tmp_path / "out"
    proc = _start(["replay", str(short_profile), "--repo", str(repo), "--out", str(out), "--no-progress"], tmp_path)
    _wait_for(lambda: out.is_dir() and _lock_of(out).exists())
    shutil.rmtree(out)
    assert proc.wait(timeout=120) == 0, _output(tmp_path)
    assert_target_contract(Schedule.load(out / "schedule.npz"), load_records(out))


def test_a_tune_write_that_fails_is_one_line_and_exit_4_not_1(tmp_path):
    """tune's exit 1 says no configuration meets the SLOs; a write that fails in its folder is one line naming the
    file and where the observations are, exit 4."""
    from tune_fixtures import write_load, write_profile

    out = tmp_path / "tune"
    (out / "observations.jsonl").mkdir(parents=True)  # where the checkpoint must go, a file cannot be written
    load = write_load(tmp_path / "l.yaml", {"m": 50}, {"m": 40})
    profile = write_profile(tmp_path / "p.json", {"m": (4.0, 1.0, 8)})
    done = subprocess.run([sys.executable, "-m", "serving_bench.cli", "tune", str(load), "--profile", str(profile),
                           "--out", str(out), "--max-evals", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 4, done.stderr
    err = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and f"cannot write {out / 'observations.jsonl'}" in err[0], done.stderr


def test_the_simulator_answers_an_oversize_request_as_triton_does(tmp_path):
    """Triton refuses a request above max_batch_size, and a batched one where max_batch_size is 0 (INVALID_ARGUMENT);
    the simulator answers the same requests with the same status and, where it knows the shapes' words, the same
    text (``serving_config.triton_batch_answer``)."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from serving_bench.export.sleep import write_sleep_entry
    from serving_bench.profiles.schema import Profile
    from serving_bench.serve.server import TritonServer
    from serving_bench.serving_config import ServingConfig
    from serving_bench.sim.target import SimTarget

    repo = tmp_path / "repo"
    write_sleep_entry(repo, "batches4", base_ms=1.0, per_item_ms=0.0, max_batch_size=4)
    write_sleep_entry(repo, "nobatch", base_ms=1.0, per_item_ms=0.0, max_batch_size=0)
    answers = {}
    with TritonServer(repo) as server:
        client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
        for name, shape in (("batches4", [8, 4]), ("nobatch", [8, 4])):
            tensor = grpcclient.InferInput("input", shape, "FP32")
            tensor.set_data_from_numpy(np.zeros(shape, np.float32))
            with pytest.raises(InferenceServerException) as refused:
                client.infer(name, [tensor])
            answers[name] = f"{refused.value.status().rsplit('.', 1)[-1]}: {refused.value.message()}"
        client.close()
    config = ServingConfig.from_repo(repo)
    profile_json = _sleep_profile_json()
    for name in ("batches4", "nobatch"):
        profile_json["models"][name] = profile_json["models"]["sleep_python"]
    (tmp_path / "p.json").write_text(json.dumps(profile_json))
    schedule = Schedule(np.array([0.0, 0.1, 0.2, 0.3]), np.array([0, 0, 1, 1]), ("batches4", "nobatch"),
                        np.zeros(4), np.array([1, 8, 1, 8]), {"duration_s": 0.4})
    table = SimTarget(Profile.load(tmp_path / "p.json"), config).run(schedule).table
    assert table["status"].astype(str).tolist() == ["ok", "error", "ok", "error"]
    assert table["error"][1] == answers["batches4"]
    prefix = "INVALID_ARGUMENT: [request id: <id_unknown>] unexpected shape for "
    assert answers["nobatch"].startswith(prefix) and table["error"][3].startswith(prefix)
    assert "'nobatch'" in answers["nobatch"] and "'nobatch'" in table["error"][3]
