"""The real tritonserver: start on loopback, infer over gRPC and HTTP, instance override, clean stop, clear failures."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from serving_bench.errors import InputError, ServerError
from serving_bench.serve.ports import free_ports, port_is_free
from serving_bench.serve.server import Endpoints, ServerOptions, TritonServer

pytestmark = pytest.mark.server


def _server_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_sleep_model_serves_over_grpc_and_http_and_stops_clean(sleep_repo):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with TritonServer(sleep_repo, instances={"sleep_python": 3}) as server:
        assert server.endpoints.grpc_url.startswith("127.0.0.1:")
        pid = server.process.pid
        grpc = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
        inp = grpcclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(grpc.infer("sleep_python", [inp]).as_numpy("output"), x)
        http = httpclient.InferenceServerClient(server.endpoints.http_url)
        hin = httpclient.InferInput("input", list(x.shape), "FP32")
        hin.set_data_from_numpy(x)
        np.testing.assert_array_equal(http.infer("sleep_zero", [hin]).as_numpy("output"), x)
        config = grpc.get_model_config("sleep_python", as_json=True)["config"]
        assert [int(g["count"]) for g in config["instance_group"]] == [3]
        assert len(_server_pids(pid)) >= 4  # server + 3 + 1 stubs
    assert _server_pids(pid) == []


def test_given_port_in_use_is_a_clear_error(sleep_repo):
    with TritonServer(sleep_repo, models=["sleep_zero"]) as server:
        taken = int(server.endpoints.http_url.rsplit(":", 1)[1])
        with pytest.raises(ServerError, match=f"--http-port {taken} is already in use"):
            TritonServer(sleep_repo, options=ServerOptions(http_port=taken)).start()


def test_model_that_fails_to_load_is_named_with_reason(tmp_path):
    from serving_bench.export.sleep import write_sleep_entry

    entry = write_sleep_entry(tmp_path, "broken_sleep", base_ms=0, per_item_ms=0)
    (entry / "1" / "model.py").write_text("raise RuntimeError('deliberately broken runner')\n")
    with pytest.raises(ServerError, match=r"model 'broken_sleep' failed to load: .*deliberately broken runner"):
        TritonServer(tmp_path, options=ServerOptions(startup_timeout_s=60)).start()


def test_unknown_model_lists_available(sleep_repo):
    with pytest.raises(InputError, match="available: sleep_python, sleep_zero"):
        TritonServer(sleep_repo, models=["nope"]).start()


def test_free_ports_are_distinct_and_free():
    """The three ports of one server are chosen together: never the same one twice (one `make test` saw HTTP and
    metrics handed the same port by two calls of free_port)."""
    for _ in range(50):
        ports = free_ports(3)
        assert len(set(ports)) == 3 and all(port_is_free(p) for p in ports)


def test_external_endpoints_follow_triton_port_layout():
    assert Endpoints.from_url("gpu-host:8001") == Endpoints("gpu-host:8001", "gpu-host:8000", "gpu-host:8002")
    with pytest.raises(InputError, match="--url"):
        Endpoints.from_url("not a url")


def test_server_death_during_use_names_the_log(sleep_repo):
    import os
    import signal

    x = np.zeros((1, 4), np.float32)
    server = TritonServer(sleep_repo, models=["sleep_zero"]).start()
    try:
        client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
        inp = grpcclient.InferInput("input", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        with server.guard():
            client.infer("sleep_zero", [inp])
        os.kill(server.process.pid, signal.SIGKILL)
        with pytest.raises(ServerError, match=r"tritonserver died .* while in use.*server log: .*tritonserver\.log"):
            with server.guard():
                client.infer("sleep_zero", [inp], client_timeout=10)
        with pytest.raises(ServerError, match=r"died .* \[ServerError\].*server log: "):  # e.g. the load driver's
            with server.guard():
                raise ServerError("cannot reach Triton at 127.0.0.1:1")
        with pytest.raises(ServerError, match=r"died \(exit code -9, SIGKILL\).*server log: ") as died:
            server.check_alive()
        log = server.log_path
        assert died.value.log_path == log  # the error carries the log it names
    finally:
        server.stop()
    assert log.is_file() and "Started GRPCInferenceService" in log.read_text()  # kept: the error names it
    assert _server_pids(server.process.pid) == []
    log.unlink()
    log.parent.rmdir()


def test_server_goes_when_its_parent_is_killed(sleep_repo, tmp_path):
    """A caller killed without cleanup (SIGKILL, or timeout's SIGTERM) leaves no server (setpriv --pdeathsig)."""
    import shutil
    import signal
    import sys
    import time

    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is missing: the server cannot be tied to its parent's life here")
    script = ("import sys, time\nfrom serving_bench.serve.server import TritonServer\n"
              f"s = TritonServer({str(sleep_repo)!r}, models=['sleep_zero']).start()\n"
              "print(s.pid, s.workdir, flush=True)\ntime.sleep(300)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid_text, workdir = parent.stdout.readline().split()
        pid = int(pid_text)
        assert len(_server_pids(pid)) >= 2
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 30
    while _server_pids(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _server_pids(pid) == []
    shutil.rmtree(workdir, ignore_errors=True)  # nobody was left to remove it
