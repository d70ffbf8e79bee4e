"""Faults on the real server, each as a user meets it: the server killed mid-replay, one model instance (its
python-backend stub) killed mid-replay, Ctrl-C to the whole process group at several moments, a bad ``--out``, a
server killed mid-profile. Every run keeps its records (marked partial), accounts for every request, says why it
stopped, and leaves no process or shared-memory region behind."""

from __future__ import annotations

import json
import os
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


def _terminal_signals() -> None:
    """Ctrl-C as a terminal's foreground command has it: a test run started in the background (``cmd &`` in a
    script) ignores SIGINT, and a process started with SIGINT ignored keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    """``serving-bench ARGS`` in a process group of its own (as a shell runs a command), output to a file."""
    log = open(tmp_path / "cli.log", "w")
    return subprocess.Popen([sys.executable, "-m", "serving_bench.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=tmp_path, preexec_fn=_terminal_signals)


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
                   "1,4", "--colocation", "1", "--seconds", "1"], tmp_path)
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
