"""The real ``tritonserver`` (bundled by ``nvidia-pytriton``), started on loopback and stopped with nothing left behind.

    with TritonServer("model_repo/") as server:
        client = tritonclient.grpc.InferenceServerClient(server.endpoints.grpc_url)

What the bundled server needs (DESIGN.md): a backend directory whose ``python`` folder holds the python backend *and*
the ``triton_python_backend_stub`` built for the running Python (we assemble one in the cache folder), the pytriton
libraries and the running interpreter's ``libpython`` on ``LD_LIBRARY_PATH`` (else the stub loads Debian's libpython and
fails with ``'_thread.RLock' object has no attribute '_recursion_count'``), and this environment's ``bin`` first on
``PATH`` so runners import the same torch / onnxruntime / tvm. The stub's Python ignores ``PYTHONPATH``; the runtime
view links the ``serving_bench`` package into each entry folder (which is on the stub's ``sys.path``) instead.

The server runs in its own process group; stopping sends SIGTERM, waits, then kills the whole group (stubs included).
The python backend's shared-memory regions carry a prefix naming this process and server
(:mod:`serving_bench.serve.shm`): they are removed when the server stops, however it ended. Finding the binary and
its environment: :mod:`serving_bench.serve.install`; every control-plane call: :mod:`serving_bench.serve.control`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from serving_bench.errors import InputError, ServerDied, ServerError
from serving_bench.serve.control import Control, metrics_answer
from serving_bench.serve.endpoints import LOOPBACK, Endpoints
from serving_bench.serve.execution_log import Executions, read_execution_logs
from serving_bench.serve.external import ExternalServer
from serving_bench.serve.install import TritonInstall, die_with_parent_prefix, find_tritonserver, mkdir
from serving_bench.serve.load_watch import LoadWatch
from serving_bench.serve.ports import free_ports, port_is_free
from serving_bench.serve.runtime_view import build_runtime_repo
from serving_bench.serve.shm import next_shm_prefix, remove_orphaned_shm_regions, remove_shm_regions

MAX_RESTARTS = 2  # a measurement whose server died mid-step starts a new one and resumes, at most this often
_CRASH_MARK = "Signal (11) received."
_CRASH = re.compile(r"Signal \((\d+)\) received\.")  # Triton's crash handler, before its stack dump
_LOAD_FAILURE = re.compile(r"failed to load '([^']+)' version \d+: (.*?)\"?$")


@dataclass(frozen=True)
class ServerOptions:
    """How the server process is run, beside what it serves: its address (``host``, 127.0.0.1 unless told otherwise;
    each port chosen free unless given, a given port that is taken being an error), ``log_path`` (None: a temporary
    folder, removed after a clean stop and kept after a failure), the readiness deadline (s), Triton's metrics
    interval (ms, its unit) and ``extra_args`` appended to its command line."""

    host: str = LOOPBACK
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    log_path: str | Path | None = None
    startup_timeout_s: float = 300.0
    metrics_interval_ms: int = 500
    extra_args: tuple[str, ...] = ()


class TritonServer:
    """A real tritonserver serving a runtime view of ``repo`` (:mod:`serving_bench.serve.runtime_view`), run as
    ``options`` say. ``models`` limits what is loaded (ensemble members are added); ``instances`` overrides instance
    counts per entry; ``threads_per_instance``: every runner's intra-op threads (None: the default rule,
    :func:`serving_bench.serving_config.default_threads`); ``cuda_graphs``: the batch sizes TorchScript entries on a
    GPU capture; ``validate`` checks the repository first; ``execution_log``: runners log their batches
    (:meth:`executions`)."""

    def __init__(self, repo: str | Path, *, models: Sequence[str] | None = None,
                 instances: Mapping[str, int] | None = None, threads_per_instance: int | None = None,
                 cuda_graphs: str | None = None, validate: bool = True, execution_log: bool = False,
                 options: ServerOptions = ServerOptions()):
        self.repo = Path(repo)
        self.cuda_graphs = cuda_graphs
        self.validate = validate
        self.models = list(models) if models else None
        self.instances = dict(instances or {})
        self.threads_per_instance = threads_per_instance
        self.requested_ports = {"http": options.http_port, "grpc": options.grpc_port,
                                "metrics": options.metrics_port}
        self.host = options.host
        self.user_log = Path(options.log_path) if options.log_path else None
        self.startup_timeout_s = options.startup_timeout_s
        self.metrics_interval_ms = options.metrics_interval_ms
        self.extra_args = list(options.extra_args)
        self.execution_log = execution_log
        self.execution_log_dir: Path | None = None
        self.process: subprocess.Popen | None = None
        self.endpoints: Endpoints | None = None
        self.served_models: list[str] = []
        self.workdir: Path | None = None
        self.log_path: Path | None = None
        self.shm_prefix = next_shm_prefix()
        self._failed = False
        self._stopped = False  # stop() was called: the process ended because we asked
        self._log_seen = 0  # bytes of the log already searched for a crash (_fatal_signal)
        self._log_start = 0  # where the current launch's part of the log begins (its loads: LoadWatch)
        self._crash_signal: int | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def __enter__(self) -> "TritonServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "TritonServer":
        """Build the runtime view, launch the server, wait until it is ready; raise :class:`ServerError` if not."""
        install = find_tritonserver()
        self._stopped = False
        remove_orphaned_shm_regions()
        for name, port in self.requested_ports.items():
            if port is not None and not port_is_free(port, self.host):
                raise ServerError(f"--{name}-port {port} is already in use on {self.host}; choose another or omit it")
        self.workdir = Path(tempfile.mkdtemp(prefix="serving-bench-server-"))
        view = self.workdir / "repo"
        if self.execution_log:
            self.execution_log_dir = mkdir(self.workdir / "executions")
        try:
            self.served_models = build_runtime_repo(self.repo, view, models=self.models, instances=self.instances,
                                                    threads_per_instance=self.threads_per_instance,
                                                    cuda_graphs=self.cuda_graphs, validate=self.validate,
                                                    execution_log=self.execution_log_dir)
        except BaseException:  # bad input: nothing launched, nothing left behind
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
            raise
        self.log_path = self.user_log or self.workdir / "tritonserver.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            for attempt in range(3):
                chosen = iter(free_ports(len(self.requested_ports), self.host))
                ports = {k: v if v is not None else next(chosen) for k, v in self.requested_ports.items()}
                self._launch(install, view, ports)
                try:
                    self._wait_ready()
                    break
                except ServerError as err:
                    hung = isinstance(err, LoadHung)
                    if attempt == 2 or not (hung or self._log_mentions("address already in use") and
                                            not any(self.requested_ports.values())):
                        raise
                    if hung:
                        print(f"note: {err.headline}; starting a new server (log: {self.log_path})", file=sys.stderr,
                              flush=True)
                    self._kill()
        except ServerError:
            self._failed = True  # keep the log the message names
            self.stop()
            raise
        except BaseException:  # Ctrl-C / SIGTERM while starting: leave nothing behind
            self.stop()
            raise
        atexit.register(self._kill)
        return self

    def _launch(self, install: TritonInstall, view: Path, ports: dict[str, int]) -> None:
        args = [str(install.server_bin), f"--model-repository={view}", f"--backend-directory={install.backend_dir}",
                f"--http-address={self.host}", f"--grpc-address={self.host}", f"--metrics-address={self.host}",
                f"--http-port={ports['http']}", f"--grpc-port={ports['grpc']}", f"--metrics-port={ports['metrics']}",
                f"--metrics-interval-ms={self.metrics_interval_ms}", "--exit-timeout-secs=5", "--log-verbose=0",
                f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}"]
        if self.models:
            args.append("--model-control-mode=explicit")
            args += [f"--load-model={name}" for name in self.served_models]
        args += self.extra_args
        log = open(self.log_path, "ab")
        self._log_start = self._log_seen = log.tell()  # a crash or load an earlier launch logged is not this one's
        self._crash_signal = None
        try:
            self.process = subprocess.Popen(die_with_parent_prefix() + args, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=dict(install.env), cwd=self.workdir,
                                            start_new_session=True)
        finally:
            log.close()
        self.endpoints = Endpoints(f"{self.host}:{ports['grpc']}", f"{self.host}:{ports['http']}",
                                   f"{self.host}:{ports['metrics']}")

    def _wait_ready(self) -> None:
        """Ready = the server answers ``ready`` (gRPC) *and* ``/metrics`` answers (the metrics service starts last,
        so a caller that samples telemetry right away would otherwise find it refusing connections). Each poll opens
        a new channel: a channel whose connection was refused waits out gRPC's reconnect backoff."""
        deadline = time.monotonic() + self.startup_timeout_s
        pending = [self._answers_ready, lambda: metrics_answer(self.endpoints.metrics_url)]
        watch = LoadWatch()
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self._failure(ServerError, f"tritonserver exited with code {self.process.returncode}")
            hung = watch.hung(self.process.pid, lambda: self._log_text(since=self._log_start))
            if hung:
                headline = f"the load of {', '.join(sorted(hung))} hung (the log and the server's processes still " \
                           f"for {watch.idle_s:g} s)"
                err = self._failure(LoadHung, headline)
                err.headline = headline
                raise err
            if pending[0]():
                pending.pop(0)
                if not pending:
                    return
                continue
            time.sleep(0.1)
        raise self._failure(ServerError, f"tritonserver not ready after {self.startup_timeout_s:.0f} s")

    def _answers_ready(self) -> bool:
        with Control(self.endpoints.grpc_url, timeout_s=1.0) as control:
            return control.ready()

    def executions(self) -> dict[str, Executions]:
        """Every runner-backed model's executed batches so far (see :mod:`serving_bench.serve.execution_log`); the
        server must have been started with ``execution_log=True``."""
        if self.execution_log_dir is None:
            raise ValueError("this server was started without execution_log=True")
        return read_execution_logs(self.execution_log_dir)

    @property
    def pid(self) -> int | None:
        """Process id of the running server (for telemetry of its process tree); None when not running."""
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def check_alive(self) -> None:
        """Raise :class:`ServerError` naming the log if the server process has died. Cheap (one ``poll``): call it
        from any loop that waits on the server, so a crash ends the wait instead of hanging it."""
        if self.process is not None and self.process.poll() is None and not self._stopped:
            fatal = self._fatal_signal()
            if fatal is None:
                return
            self._failed = True  # Triton's handler caught a crash and can hang on the corrupted heap: end it
            self._kill()
            raise self._failure(ServerDied, f"tritonserver died (signal {fatal} in its log; its crash handler "
                                            "did not exit, so it was killed)")
        code = None if self.process is None else self.process.returncode
        if self.process is None or self._stopped:
            raise self._failure(ServerError, "tritonserver is not running (not started, or stopped)")
        self._failed = True
        raise self._failure(ServerDied, f"tritonserver died ({exit_status(code)})")

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Turn an error raised inside the block (a client's, or a ServerError that only names the address) into
        :class:`ServerError` naming the log when the cause is that the server died (a refused connection to a dead
        server says nothing about why it died)."""
        try:
            yield
        except Exception as err:
            deadline = time.monotonic() + 0.5  # the process may still be exiting when its sockets close
            while self.process is not None and self.process.poll() is None and time.monotonic() < deadline:
                if self._fatal_signal() is not None:  # crashed, its handler hanging: check_alive ends and says so
                    try:
                        self.check_alive()
                    except ServerDied as dead:
                        raise dead from err
                time.sleep(0.02)
            if self.process is not None and self.process.poll() is not None and not self._stopped:
                self._failed = True
                raise self._failure(ServerDied, f"tritonserver died ({exit_status(self.process.returncode)}) "
                                                f"while in use [{type(err).__name__}]") from err
            raise

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the server and every process it started; remove the temporary folder unless it holds a failure log."""
        failed = self._failed or self.process is not None and self.process.poll() not in (None, 0, -signal.SIGTERM)
        self._stopped = True
        self._kill(timeout_s)
        if self.workdir is not None:
            if failed and self.user_log is None:
                shutil.rmtree(self.workdir / "repo", ignore_errors=True)
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _kill(self, timeout_s: float = 20.0) -> None:
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:  # the stubs and anything else in the server's process group
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.poll() is None:
            proc.wait(timeout=5)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:  # SIGKILL is asynchronous: wait until the group is gone
            try:
                os.killpg(proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.02)
        remove_shm_regions(self.shm_prefix)  # a killed server or stub leaves its regions behind

    # -- diagnostics -----------------------------------------------------------------------------------------------
    def _fatal_signal(self) -> int | None:
        """The signal Triton's crash handler logged (``Signal (11) received.``), or None; reads only what the log
        gained since the last look."""
        try:
            size = self.log_path.stat().st_size
        except (OSError, AttributeError):
            return None
        if size != self._log_seen:
            with open(self.log_path, "rb") as log:
                log.seek(max(self._log_seen - len(_CRASH_MARK), 0))
                found = _CRASH.search(log.read().decode(errors="replace"))
            self._log_seen = size
            if found:
                self._crash_signal = int(found.group(1))
        return self._crash_signal

    def _log_text(self, since: int = 0) -> str:
        """The log from byte ``since`` on."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(since)
                return log.read().decode(errors="replace")
        except (OSError, TypeError):
            return ""

    def _log_mentions(self, needle: str) -> bool:
        return needle.lower() in self._log_text().lower()

    def _failure(self, kind: type[ServerError], headline: str) -> ServerError:
        """``kind`` with ``headline``, the log's load failures (else its last lines) and the log's path."""
        text = self._log_text()
        failures = [f"model '{m.group(1)}' failed to load: {m.group(2).strip()}"
                    for m in map(_LOAD_FAILURE.search, text.splitlines()) if m]
        detail = "; ".join(failures) or " | ".join(
            line.strip() for line in text.splitlines()[-5:] if line.strip())
        return kind(f"{headline}: {detail} (server log: {self.log_path})", log_path=self.log_path)


class LoadHung(ServerError):
    """A model load hung while the server started (:mod:`serving_bench.serve.load_watch`): a new server is tried.
    ``headline`` says which, without the log's lines."""

    headline = ""


def exit_status(code: int | None) -> str:
    """``exit code N``, with the signal's name when a signal ended the process (``exit code -9, SIGKILL``)."""
    if code is not None and code < 0:
        try:
            return f"exit code {code}, {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


def connect(repo: str | Path | None = None, *, url: str | None = None, metrics_url: str | None = None,
            **server_kwargs) -> "TritonServer | ExternalServer":
    """The server a command should use: the external one at ``url`` (``host:port``, gRPC; ``metrics_url``: its
    metrics address where known) when given, else a local :class:`TritonServer` for ``repo`` (``server_kwargs`` go
    to it). Use as a context manager."""
    if url:
        return ExternalServer(url, metrics_url=metrics_url)
    if metrics_url:
        raise InputError("--metrics-url", None, "only with --url: the embedded server's metrics address is known")
    if repo is None:
        raise InputError("--repo", None, "expected a model repository to serve, or --url of a running Triton server")
    return TritonServer(repo, **server_kwargs)
