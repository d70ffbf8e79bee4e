"""Measurement sessions on real Triton: closed- and open-loop runs through the real target, the server's own
per-batch statistics, and steps that resume on a new server when one dies (used by
:mod:`serving_bench.calibrate.measure`).

A :class:`Session` holds one server (embedded, with the runners' execution logs or Triton's request trace, or
external); each run is a :class:`~serving_bench.calibrate.runs.LoopRun` (latencies, send/done times on
``time.perf_counter``'s clock, the statistics extension's counters over the run and, where known, the executed
batches).

An external server is measured as it serves, or, where it allows model control (``--model-control-mode=explicit``),
with each model reloaded for the session's instance count — and runtime threads, where its configuration names them
(:data:`THREAD_PARAMETERS`) — and reloaded as it was when the session ends (:func:`reloaded`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
import tempfile
import time
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Mapping, Sequence

import numpy as np
import psutil

from serving_bench.errors import InputError, ServerDied, ServerError
from serving_bench.export.repository import ModelConfig
from serving_bench.load.driver import TritonTarget
from serving_bench.calibrate.runs import LoopRun, Trace
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop
from serving_bench.serve.announce import LOCAL_HOSTS
from serving_bench.serve.control import Control
from serving_bench.serve.server import MAX_RESTARTS, ServerOptions, TritonServer, connect

TRACE_LEVEL = "TIMESTAMPS"  # per request: arrival, queue, compute start/end, response (only with trace=True)
# config parameters that set an instance's runtime threads: serving-bench's runners, Triton's ONNX Runtime and PyTorch
# backends
THREAD_PARAMETERS = ("threads_per_instance", "intra_op_thread_count", "INTRA_OP_THREAD_COUNT")
STUB = "triton_python_backend_stub"  # the process the python backend runs each model instance in


# tritonserver arguments that trace every request (its trace file comes with trace_args)
TRACE_ARGS = ("--trace-config", f"level={TRACE_LEVEL}", "--trace-config", "rate=1", "--trace-config",
              "triton,log-frequency=0")


def trace_args(trace_file: Path) -> tuple[str, ...]:
    """tritonserver arguments that trace every request into ``trace_file``."""
    return TRACE_ARGS + ("--trace-config", f"triton,file={trace_file}")


class Session:
    """A server under measurement: ``endpoints``; ``server``: the embedded :class:`TritonServer` (each run then
    carries the host CPU it cost and, where the server's runners log executed batches, its batches), else None;
    ``traced``: the server traces requests (its batches are attached to the runs by :meth:`attach_trace` once the
    trace file is complete); ``pid``: an external server's process where it runs on this machine
    (:func:`local_server_pid`: each run then carries the host CPU it cost), else None."""

    def __init__(self, endpoints, server: TritonServer | None = None, traced: bool = False, pid: int | None = None):
        self.endpoints = endpoints
        self.server = server
        self.traced = traced
        self.pid = pid
        self.url = endpoints.grpc_url
        self.runs: list[LoopRun] = []

    def run(self, loads: Mapping[str, tuple[int, int]], seconds: float) -> LoopRun:
        """Closed loop for ``seconds``: model -> (rows per request, concurrency), all models at once. A run that
        got fewer than 5 answers per model (a stalled shared machine) is repeated once, twice as long."""
        rows = {m: loads[m][0] for m in loads}
        for attempt in (1, 2):
            schedule = Schedule.closed_loop(rows, 100_000, {"duration_s": seconds * attempt})
            mode = ClosedLoop(concurrency={m: loads[m][1] for m in loads}, duration_s=seconds * attempt)
            try:
                return self._collect(TritonTarget(self.endpoints, mode=mode, source="profile measurement"), schedule,
                                     rows)
            except InputError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def open_loop(self, model: str, rows: int, times: np.ndarray) -> LoopRun:
        """Open loop: requests of ``rows`` rows sent at ``times`` (seconds from the run's start, increasing)."""
        return self.replay(Schedule.at_times(times, model, rows))

    def replay(self, schedule: Schedule) -> LoopRun:
        """Open loop: the schedule's requests at their times (each model's requests of one size)."""
        rows_of = {m: int(schedule.batch[schedule.model == i][0]) for i, m in enumerate(schedule.models)
                   if (schedule.model == i).any()}
        return self._collect(TritonTarget(self.endpoints, source="profile measurement"), schedule, rows_of)

    def _collect(self, target, schedule: Schedule, rows_of: Mapping[str, int]) -> LoopRun:
        names = tuple(rows_of)
        times_before = self.model_times(names)
        instances_before = self.instance_cpu(names)
        cpu_before = self.cpu_seconds()
        start = time.perf_counter()
        records = target.run(schedule)
        end = time.perf_counter()
        cpu_after = self.cpu_seconds()
        instances_after = self.instance_cpu(names)
        times_after = self.model_times(names)
        if records.info.partial:  # the server or a model instance died: measure this step on a new one
            raise ServerDied(f"the measurement run stopped early: {records.info.stop_reason}")
        t0 = records.info.t0_s or 0.0
        table = records.table
        latency, sent, done = {}, {}, {}
        for m in names:
            rows = table[(table["model"].astype(str) == m) & (table["status"].astype(str) == "ok")]
            if len(rows) < 5:
                bad = table[(table["model"].astype(str) == m) & (table["status"].astype(str) != "ok")]
                why = (f"{bad['status'].astype(str).iloc[0]}: {bad['error'].astype(str).iloc[0]}" if len(bad)
                       else "no more requests were answered in the run's time")
                raise InputError("profile measurement", m, f"only {len(rows)} requests of {rows_of[m]} rows "
                                 f"succeeded ({why})")
            rows = rows.sort_values("sent_s")
            latency[m] = (rows["done_s"] - rows["intended_s"]).to_numpy()  # closed loop: intended = sent
            sent[m] = t0 + rows["sent_s"].to_numpy()
            done[m] = t0 + rows["done_s"].to_numpy()
        executions = None
        if self.server is not None and self.server.execution_log_dir is not None:
            executions = {m: ex.window(start, end) for m, ex in self.server.executions().items() if m in names}
        run = LoopRun(latency, dict(records.info.server_stats), (start, end), sent, done, executions,
                      cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None,
                      records.info.sender, {m: times_after[m].minus(times_before[m]) for m in names},
                      None if instances_before is None or instances_after is None else
                      sum(cpu - instances_before.get(pid, 0.0) for pid, cpu in instances_after.items()))
        self.runs.append(run)
        return run

    def cpu_seconds(self) -> float | None:
        """CPU seconds used so far by the embedded server, its stubs and the client — this process and its sender
        processes once they have ended (a native sender is always a process of its own): everything a request costs
        on the host's cores. An external server's where it runs on this machine (``pid``), else None."""
        pid = self.server.pid if self.server is not None else self.pid
        if pid is None:
            return None
        try:
            server = psutil.Process(pid)
            total = 0.0
            for p in [server, *server.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
            me = psutil.Process().cpu_times()  # children_*: the ended (waited-for) sender processes of the runs
            return total + me.user + me.system + me.children_user + me.children_system
        except psutil.Error:  # a process ended meanwhile: no figure for this run
            return None

    def instance_cpu(self, models: Sequence[str]) -> dict[int, float] | None:
        """CPU seconds so far of each process of an external server on this machine that runs an instance of one of
        ``models`` on its own — the python backend's stubs (:data:`STUB`; their command line names the model's
        ``model.py``) — by pid; None without such a server or processes (a native backend's instances are threads
        of the server)."""
        if self.pid is None:
            return None
        try:
            out = {}
            for process in psutil.Process(self.pid).children(recursive=True):
                command = process.cmdline()
                if command and command[0].endswith(STUB) and len(command) > 1 and \
                        Path(command[1]).parent.parent.name in models:
                    t = process.cpu_times()
                    out[process.pid] = t.user + t.system
            return out or None
        except psutil.Error:  # a process ended meanwhile: no figure for this run
            return None

    def attach_trace(self, trace_file: Path) -> str | None:
        """Give this session's runs the batches Triton's trace recorded; a note when the trace is unusable."""
        try:
            executions = Trace.load(trace_file)
        except InputError as err:
            return f"no request trace ({err.line()}): service samples of that server are client latency - overhead"
        for run in self.runs:
            run.executions = {m: ex.window(*run.window) for m, ex in executions.items()}
        return None

    def execution_time(self, model: str, rows: int, concurrency: int, seconds: float) -> float:
        """Mean compute time (s) of the executed batches of exactly ``rows`` rows in a closed loop of ``rows``-row
        requests at ``concurrency`` (:meth:`LoopRun.batch_compute_s`: batches the batcher merged from several
        requests do not count; 0 if none ran)."""
        return self.run({model: (rows, concurrency)}, seconds).batch_compute_s(model, rows)

    def model_times(self, models: Sequence[str]) -> dict:
        """The statistics extension's cumulative counters of ``models``
        (:class:`~serving_bench.serve.control.ModelTimes`)."""
        with Control(self.url) as control:
            return control.model_times(models)

    @contextlib.contextmanager
    def untraced(self) -> Iterator[None]:
        """Request tracing off inside the block (Triton's trace settings, restored after): with tracing on, the
        bundled tritonserver 2.51 aborted (``std::length_error`` in ``TRITONBACKEND_ResponseNew``) in most demo
        profiles while fast models ran many merged batch-1 requests; runs that need only statistics run untraced."""
        if not self.traced:
            yield
            return
        with Control(self.url) as control:
            control.set_trace_level("OFF")
            try:
                yield
            finally:
                control.set_trace_level(TRACE_LEVEL)


Step = tuple[object, Callable[[Session], object]]  # (key, what to measure in a session) -> results[key]


def run_steps(steps: Sequence[Step], results: dict, open_session: Callable[[], ContextManager[Session]],
              log: Callable[[str], None], notes: list[str], phase: str, max_restarts: int = MAX_RESTARTS) -> None:
    """Measure each step not yet in ``results`` in order, in sessions from ``open_session``. When the server (or a
    model instance) dies during a step, a new one is started and the phase resumes at that step (at most
    ``max_restarts`` times; the step's partial work is discarded); each restart is logged and added to ``notes``."""
    restarts = 0
    while True:
        current = None
        try:
            with open_session() as session:
                for key, measure in steps:
                    if key not in results:
                        current = key
                        results[key] = measure(session)
            return
        except ServerDied as err:
            if restarts >= max_restarts:
                raise
            restarts += 1
            note = (f"{phase}: the server died at step {current} ({err}); started a new one and resumed at that step "
                    f"(restart {restarts} of at most {max_restarts})")
            log(f"note: {note}")
            notes.append(note)


@dataclass(frozen=True)
class ServerSetup:
    """The server a session measures on: ``instances`` of every one of ``models`` of ``repo`` at ``threads`` runtime
    threads each, and ``ensembles`` of them; Triton's request trace on with ``trace``, CUDA graphs as
    ``serve --cuda-graphs`` says; or the external server at ``url``: as it is, or with ``reload`` (it allows model
    control) its ``models`` reloaded with ``instances`` each at ``threads`` (:func:`reloaded`)."""

    repo: Path
    models: tuple[str, ...]
    instances: int = 1
    threads: int = 1
    trace: bool = False
    cuda_graphs: str | None = None
    url: str | None = None
    ensembles: tuple[str, ...] = ()
    reload: bool = False


@contextlib.contextmanager
def open_session(setup: ServerSetup, notes: list[str], log: Callable[[str], None]) -> Iterator[Session]:
    """A session on a new embedded server as ``setup`` says — execution logs on, or Triton's request trace
    (attached to the runs once the server stopped, a note in ``notes`` where it is unusable) — or on the external
    server at its ``url`` (its models reloaded as ``setup`` says where it asks to, and as they were after)."""
    trace = setup.trace
    with tempfile.TemporaryDirectory(prefix="serving-bench-profile-") as tmp:
        trace_file = Path(tmp) / "trace.json"
        server = connect(setup.repo, url=setup.url, models=[*setup.models, *setup.ensembles],
                         instances={m: setup.instances for m in setup.models}, threads_per_instance=setup.threads,
                         execution_log=not trace, cuda_graphs=setup.cuda_graphs,
                         options=ServerOptions(extra_args=trace_args(trace_file) if trace else ()))
        embedded = isinstance(server, TritonServer)
        session = None
        try:
            with server, server.guard():  # a server that died mid-step: ServerDied naming its log
                session = Session(server.endpoints, server if embedded and not trace else None,
                                  traced=trace and embedded, pid=None if embedded else local_server_pid(setup.url))
                if embedded or not setup.reload:
                    yield session
                else:
                    with reloaded(session.url, setup.models, setup.instances, setup.threads, log):
                        yield session
        finally:
            if trace and embedded and session is not None:  # the trace file is complete once the server stopped
                note = session.attach_trace(trace_file)
                if note:
                    notes.append(note)
                    log(f"note: {note}")


@dataclass(frozen=True)
class ExternalServing:
    """How an external server serves the measured models: ``instances`` of each and its runtime ``threads`` per
    instance (None where its configuration does not say: :func:`served_threads`); ``refusal``: why it does not allow
    model control (None: it does, and a measurement reloads its models with other counts: :func:`reloaded`)."""

    instances: Mapping[str, int]
    threads: Mapping[str, int | None]
    refusal: str | None


def inspect_external(url: str, models: Sequence[str], source: str = "--models") -> ExternalServing:
    """What the server at gRPC ``url`` serves ``models`` with, and whether it allows model control: the first model
    is loaded again with its own configuration (a reload that changes nothing), which Triton refuses unless it runs
    with ``--model-control-mode=explicit``. A model it does not serve is an :class:`InputError` naming ``source``."""
    with Control(url) as control:
        served = control.served_models()
        missing = [m for m in models if m not in served]
        if missing:
            raise InputError(source, missing[0], f"not served by the server at {url}; served models: "
                             f"{', '.join(served) or 'none'}")
        configs = {m: control.model_config(m) for m in models}
        try:
            control.load_model(models[0], configs[models[0]])
            refusal = None
        except ServerError as err:
            refusal = str(err)
    instances = {m: max(sum(g.count or 1 for g in c.instance_group), 1) for m, c in configs.items()}
    return ExternalServing(instances, {m: served_threads(c) for m, c in configs.items()}, refusal)


def local_server_pid(url: str) -> int | None:
    """The process listening on ``url``'s gRPC port where ``url`` is this machine and the process is visible here
    (its CPU is then measured as the embedded server's is), else None."""
    host, _, port = url.rpartition(":")
    if host.strip("[]") not in LOCAL_HOSTS or not port.isdigit():
        return None
    try:
        listening = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):  # not allowed to list sockets here: the CPU stays unknown
        return None
    return next((c.pid for c in listening if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == int(port)
                 and c.pid), None)


def served_threads(config: ModelConfig) -> int | None:
    """The runtime threads per instance a served configuration sets (the first of :data:`THREAD_PARAMETERS` it
    holds as a whole number), else None."""
    for name in THREAD_PARAMETERS:
        value = config.parameters[name].string_value if name in config.parameters else ""
        if value.strip().isdigit() and int(value) > 0:
            return int(value)
    return None


def reconfigured(config: ModelConfig, instances: int, threads: int | None) -> ModelConfig:
    """A copy of a served ``config`` with ``instances`` in each instance group (as ``serve --instances`` sets them)
    and, where it names them (:data:`THREAD_PARAMETERS`), ``threads`` runtime threads per instance."""
    out = ModelConfig()
    out.CopyFrom(config)
    if not out.instance_group:
        out.instance_group.add()
    for group in out.instance_group:
        group.count = instances
    if threads is not None:
        for name in THREAD_PARAMETERS:
            if name in out.parameters:
                out.parameters[name].string_value = str(int(threads))
    return out


@contextlib.contextmanager
def reloaded(url: str, models: Sequence[str], instances: int, threads: int | None,
             log: Callable[[str], None]) -> Iterator[None]:
    """Inside the block the external server at ``url`` serves each of ``models`` with ``instances`` instances at
    ``threads`` runtime threads (:func:`reconfigured`; Triton's model control: ``load_model`` with a config override);
    after it, each one changed is loaded again with the configuration it had (a server gone meanwhile is left as
    it is). A refusal is a :class:`ServerError` saying the server must allow model control."""
    with Control(url) as control:
        before = {m: control.model_config(m) for m in models}
        changed = []
        try:
            for m in models:
                wanted = reconfigured(before[m], instances, threads)
                if wanted != before[m]:
                    try:
                        control.load_model(m, wanted)
                    except ServerError as err:
                        raise ServerError(f"could not reload {m} with {instances} instance(s) on {url} ({err}); the "
                                          "server must run with --model-control-mode=explicit") from None
                    changed.append(m)
            if changed:
                log(f"{url}: reloaded {', '.join(changed)} with {instances} instance(s) each"
                    + (f" at {threads} thread(s)" if threads is not None else ""))
            yield
        finally:
            for m in changed:
                with contextlib.suppress(ServerError):
                    control.load_model(m, before[m])
