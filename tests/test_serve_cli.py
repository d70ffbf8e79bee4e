"""``serving-bench serve``: starts the real server, prints endpoints and a working readiness probe, stops cleanly on
SIGTERM with nothing left; bad options are one line before anything starts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from serving_bench.serving_config import parse_instances

pytestmark = pytest.mark.server


def _serve(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "serving_bench.cli", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _read_until(proc: subprocess.Popen, pattern: str, timeout_s: float = 120.0) -> str:
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return "".join(seen)
    proc.kill()
    raise AssertionError(f"no line matching {pattern!r}; got:\n{''.join(seen)}\n{proc.stderr.read()}")


def _triton_layout_ports() -> int:
    """A gRPC port P with P-1 and P+1 free too (Triton's default layout: HTTP 8000, gRPC 8001, metrics 8002)."""
    from serving_bench.serve.ports import free_port, port_is_free

    for _ in range(50):
        port = free_port()
        if port_is_free(port - 1) and port_is_free(port + 1):
            return port
    pytest.skip("no three consecutive free ports")


def test_serve_prints_endpoints_answers_probe_and_stops_on_sigterm(sleep_repo, tmp_path):
    log = tmp_path / "server.log"
    grpc = _triton_layout_ports()
    proc = _serve(str(sleep_repo), "--models", "sleep_python", "--instances", "sleep_python=2", "--log", str(log),
                  "--http-port", str(grpc - 1), "--grpc-port", str(grpc), "--metrics-port", str(grpc + 1))
    out = _read_until(proc, r"^ready\?  curl")
    server_pid = int(re.search(r"ready \(pid (\d+)\)", out).group(1))
    assert re.search(r"^gRPC    127\.0\.0\.1:\d+$", out, re.M)
    assert re.search(r"sleep_python: python, max_batch_size 32, 2 instance\(s\)", out)
    probe = re.search(r"(http://127\.0\.0\.1:\d+/v2/health/ready)", out.splitlines()[-1]).group(1)
    with urllib.request.urlopen(probe, timeout=5) as reply:
        assert reply.status == 200
    assert len(subprocess.run(["pgrep", "-g", str(server_pid)], capture_output=True, text=True).stdout.split()) >= 3
    assert f"gRPC    127.0.0.1:{grpc}\n" in out

    # the same server as an external one: nothing is started, the facts are printed, exit 0
    external = subprocess.run([sys.executable, "-m", "serving_bench.cli", "serve", "--url", f"127.0.0.1:{grpc}"],
                              capture_output=True, text=True, timeout=60)
    assert external.returncode == 0, external.stderr
    assert f"HTTP    http://127.0.0.1:{grpc - 1}" in external.stdout
    assert "sleep_python: python, max_batch_size 32, 2 instance(s)" in external.stdout

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert "SIGTERM: stopped tritonserver" in proc.stderr.read()
    assert subprocess.run(["pgrep", "-g", str(server_pid)], capture_output=True, text=True).stdout.split() == []
    assert "Started GRPCInferenceService" in log.read_text()


@pytest.mark.parametrize("args, message", [
    (["--instances", "sleep_python=0"], "error: --instances: sleep_python=0: expected MODEL=COUNT with COUNT >= 1"),
    (["--instances", "nope=2"], "error: --instances: nope: not a served model"),
    (["--models", "nope"], "nope: no such model in the repository; available: sleep_python, sleep_zero"),
    (["--url", "no-port"], "error: --url: 'no-port': expected the server's gRPC address as host:port"),
])
def test_bad_options_are_one_line_before_launch(sleep_repo, args, message):
    proc = subprocess.run([sys.executable, "-m", "serving_bench.cli", "serve", str(sleep_repo), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


def test_parse_instances():
    assert parse_instances("a=2, b=1,") == {"a": 2, "b": 1}


def test_unreachable_external_server_is_a_clear_error():
    from serving_bench.serve.ports import free_port

    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "serving_bench.cli", "serve", "--url", f"127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert f"server error: Triton at --url 127.0.0.1:{port} is not answering" in proc.stderr  # no guessed port named
    assert f":{port - 1}" not in proc.stderr


def test_replay_url_finds_the_endpoints_serve_announced(sleep_repo, tmp_path):
    """``serve`` picks free ports; ``replay --url <its gRPC address>`` finds its metrics from what serve announced
    (the issue: replay guessed gRPC + 1, exit 3 "cannot read Triton metrics"), and ``--url`` given its HTTP port
    says so and names the gRPC address. Once serve stops, its announcement is gone."""
    env = {**os.environ, "SERVING_BENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "serving_bench.cli", "serve", str(sleep_repo), "--models",
                             "sleep_python"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out = _read_until(proc, r"^ready\?  curl")
        grpc = re.search(r"^gRPC    (\S+)$", out, re.M).group(1)
        http = re.search(r"^HTTP    http://(\S+)$", out, re.M).group(1)
        metrics = re.search(r"^metrics http://(\S+)/metrics$", out, re.M).group(1)
        if int(metrics.rsplit(":", 1)[1]) == int(grpc.rsplit(":", 1)[1]) + 1:
            pytest.skip("serve's free ports happen to follow Triton's layout: a guess would be right too")
        (tmp_path / "l.yaml").write_text("name: u\nduration: 1s\nseed: 1\nmodels:\n  sleep_python: {rate: 50}\n")

        def replay(url: str, name: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "serving_bench.cli", "replay", str(tmp_path / "l.yaml"),
                                   "--url", url, "--out", str(tmp_path / name), "--no-progress"], capture_output=True,
                                  text=True, timeout=120, env=env)

        done = replay(grpc, "by_grpc")
        assert done.returncode == 0, done.stderr
        telemetry = json.loads((tmp_path / "by_grpc" / "telemetry.json").read_text())
        assert telemetry and (tmp_path / "by_grpc" / "records.parquet").is_file()
        wrong = replay(http, "by_http")
        assert wrong.returncode == 3
        assert (f"Triton at --url {http} is not answering: no 'ready' from its gRPC health service ({http} is the "
                f"http port of the server serve started (pid ") in wrong.stderr and f"its gRPC address is {grpc}" \
            in wrong.stderr, wrong.stderr
        assert not (tmp_path / "by_http").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert list((tmp_path / "cache" / "servers").iterdir()) == []
