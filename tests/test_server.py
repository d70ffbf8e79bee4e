"""The real tritonserver: start on loopback, infer over gRPC and HTTP, instance override, clean stop, clear failures."""

from __future__ import annotations

import subprocess
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from serving_bench.errors import InputError, ServerError
from serving_bench.serve.endpoints import Endpoints
from serving_bench.serve.ports import free_ports, port_is_free
from serving_bench.serve.server import ServerOptions, TritonServer

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


HANGING_RUNNER = """import time

class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3600)  # waits, as a load stuck on a lock does: no CPU, nothing logged
"""
SLOW_RUNNER = """import time

class TritonPythonModel:
    def initialize(self, args):
        end = time.process_time() + 4.0  # a load that takes long and works: 4 s of CPU
        while time.process_time() < end:
            pass

    def execute(self, requests):
        return []
"""


def test_a_model_load_that_hangs_is_tried_on_new_servers_then_named(tmp_path, monkeypatch, capfd):
    """A runner whose initialize waits forever: each of three servers is given up once its log and processes were
    still for the idle time (2 s and 0.1 CPU-s here; 45 s and 0.5 by default), two notes on stderr, then a
    ServerError naming the model."""
    from serving_bench.export.sleep import write_sleep_entry
    from serving_bench.serve import load_watch

    monkeypatch.setattr(load_watch, "IDLE_S", 2.0)
    monkeypatch.setattr(load_watch, "CPU_S", 0.1)
    entry = write_sleep_entry(tmp_path, "hanging_sleep", base_ms=0, per_item_ms=0)
    (entry / "1" / "model.py").write_text(HANGING_RUNNER)
    start = time.monotonic()
    with pytest.raises(ServerError,
                       match=r"the load of hanging_sleep hung \(the log and the server's processes still"):
        TritonServer(tmp_path, options=ServerOptions(startup_timeout_s=120)).start()
    assert time.monotonic() - start < 90
    notes = capfd.readouterr().err
    assert notes.count("hung (the log and the server's processes still for 2 s); starting a new server") == 2


def test_a_model_load_that_takes_long_but_works_is_not_a_hang(tmp_path, monkeypatch):
    """A runner whose initialize computes for 4 s, twice the idle time: its CPU shows the load moves (0.1 CPU-s in
    2 s is enough); it loads."""
    from serving_bench.export.sleep import write_sleep_entry
    from serving_bench.serve import load_watch

    monkeypatch.setattr(load_watch, "IDLE_S", 2.0)
    monkeypatch.setattr(load_watch, "CPU_S", 0.1)
    entry = write_sleep_entry(tmp_path, "slow_sleep", base_ms=0, per_item_ms=0)
    (entry / "1" / "model.py").write_text(SLOW_RUNNER)
    with TritonServer(tmp_path, options=ServerOptions(startup_timeout_s=60)) as server:
        assert server.served_models == ["slow_sleep"]


def test_pending_models_by_the_log():
    """A model is pending from its first instance initializing until it loads or fails to load."""
    from serving_bench.serve.load_watch import pending_models

    log = ('I1206 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: tiny_mlp_torchscript_0_0"\n'
           'I1206 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: tiny_cnn_torchscript_0_1"\n'
           'I1206 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: m_2_0_0 (CPU device 0)"\n'
           "I1206 model_lifecycle.cc:839] \"successfully loaded 'tiny_cnn_torchscript'\"\n")
    assert pending_models(log) == {"tiny_mlp_torchscript", "m_2"}
    assert pending_models(log + "E1206 \"failed to load 'm_2' version 1: ...\"\n") == {"tiny_mlp_torchscript"}


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
