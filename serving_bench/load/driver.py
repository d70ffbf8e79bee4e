"""The real target: ``TritonTarget`` sends a Schedule to a real Triton over gRPC and records what happened to every
request — the orchestration around the senders (:mod:`serving_bench.load.sender`).

Modes (:mod:`serving_bench.run.target`): **open loop** — each request leaves at its scheduled time, whatever is in
flight (optionally capped: ``max_in_flight`` with ``on_cap="wait"`` — it leaves late and the lateness is recorded —
or ``"drop"`` — it is not sent, status ``not_sent``, error ``dropped: ...``); **closed loop** — ``concurrency``
requests in flight per model, the next one sent when one returns (perf_analyzer's concurrency mode); requests are
taken from the schedule in order, their arrival times ignored, and ``intended_s`` is set to the send time; requests
never reached by the end of ``duration_s`` are dropped from the records.

The driver owns the clock: ``time.perf_counter`` (CLOCK_MONOTONIC, shared by every process on the machine), seconds
from the run start ``t0``. Targets never time themselves. Every scheduled request ends with exactly one status:
``ok``; ``error`` (the server or transport answered with an error, or the call was cancelled when the run stopped);
``timeout`` (no answer within ``timeout_s``, the gRPC deadline); ``rejected`` (the server refused it: queue full);
``not_sent``. A stop — Ctrl-C, the server gone, a ``stop()`` — ends sending at once; in-flight requests get
``grace_s`` to finish, then are cancelled; the records are marked ``partial`` with ``stop_reason``. A model instance
that died (the python backend answers ``Stub process '...' is not healthy``: the instance never recovers, and Triton
keeps the model ready) stops the run the same way, but requests still in flight are cancelled at once rather than
left to their deadline (``stop_reason`` starts with :data:`INSTANCE_DIED`). A Ctrl-C or SIGTERM at any moment of
``run`` — while the senders start, during the run, while they drain — stops it cleanly and raises
:class:`~serving_bench.interrupts.RunInterrupted` carrying the records of what was sent so far.

The senders run in a thread of the calling process (``senders=0``) or in ``senders=N`` spawned processes — each owns
every N-th request, all use the same ``t0``, outcomes meet in shared memory. The sender is native
(:mod:`serving_bench.load.native`: a C++ process per sender, ``senders=0`` meaning one) where it is built, the Python
one (:mod:`serving_bench.load.sender`) otherwise or when asked for; both fill the same arrays and report through the
same messages, and their failures are judged by one judge (:mod:`serving_bench.load.outcomes`).
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from serving_bench.errors import ServerError
from serving_bench.interrupts import RunInterrupted, deferred_interrupts
from serving_bench.load.collapse import flag_queue_policy_collapse
from serving_bench.load.payloads import Payloads, fetch_specs, prepare_payloads
from serving_bench.load.native import NativeSender, choose_sender
from serving_bench.load.outcomes import (ERROR, IN_FLIGHT, INSTANCE_DIED, NOT_SENT, OK, REJECTED, SERVER_UNAVAILABLE,
                                         TIMEOUT, Arrays)
from serving_bench.load.sender import LocalValue, Share, sender_main
from serving_bench.run.records import STATUSES, Records, RunInfo, new_table
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop, OpenLoop
from serving_bench.serve.control import Control, stats_delta
from serving_bench.serve.endpoints import Endpoints
from serving_bench.serve.server import TritonServer

__all__ = ["TritonTarget", "SendOptions", "Progress", "INSTANCE_DIED", "SERVER_DIED"]

SERVER_DIED = "server died"  # stop_reason prefix when the server process is gone


@dataclass(frozen=True)
class Progress:
    """A live view of a run for progress bars: counts, completion rate and p99 (from intended time) of the
    completions in the last ``window_s``."""

    elapsed_s: float
    scheduled: int
    sent: int
    finished: int
    in_flight: int
    ok: int
    failed: int
    rate_rps: float
    p99_s: float | None


@dataclass(frozen=True)
class SendOptions:
    """How requests are sent: ``timeout_s`` per-request deadline (the gRPC deadline); ``grace_s`` the time in-flight
    requests get to finish after a stop before they are cancelled; ``senders`` sender processes (0 = a thread in
    this process; N > 0 Python sender processes need the calling script to have the ``if __name__ == "__main__":``
    guard, as multiprocessing's spawn requires); ``sender`` ``"native"``, ``"python"`` or ``None`` (native where it
    is built, python otherwise; a native sender is always a process, so ``senders=0`` runs one)."""

    timeout_s: float = 30.0
    grace_s: float = 5.0
    senders: int = 0
    sender: str | None = None


class TritonTarget:
    """Runs a :class:`Schedule` against a real Triton server; ``run(schedule, mode=None) -> Records``.

    ``endpoints``: an ``Endpoints``, a ``TritonServer`` (its death then stops the run at once), an
    ``ExternalServer`` or a gRPC ``host:port``. ``mode``: the default mode of :meth:`run`, :class:`OpenLoop` (default)
    or :class:`ClosedLoop`. ``send``: deadline, stop grace and senders (:class:`SendOptions`; ``sender_note`` says
    which sender runs and why). ``alive``: raises :class:`ServerError` when the server is gone (default: a local
    server's ``check_alive``). ``progress``: called about every ``progress_interval_s`` with a :class:`Progress` from
    a monitor thread. ``source`` names the schedule's file in error messages. ``stop()`` ends a run early (partial
    records); so do Ctrl-C and the server dying.
    """

    name = "triton"

    def __init__(self, endpoints: Any, *, mode: OpenLoop | ClosedLoop | None = None,
                 send: SendOptions = SendOptions(), alive: Callable[[], None] | None = None,
                 progress: Callable[[Progress], None] | None = None, progress_interval_s: float = 0.5,
                 source: str | None = None):
        self.url, server = _grpc_url(endpoints)
        self.sender, self.sender_note = choose_sender(send.sender)
        self.alive = alive or (server.check_alive if server is not None else None)
        self.mode = mode or OpenLoop()
        self.timeout_s = float(send.timeout_s)
        self.senders = max(0, int(send.senders))
        self.grace_s = float(send.grace_s)
        self.progress = progress
        self.progress_interval_s = progress_interval_s
        self.source = source
        self._stop = threading.Event()
        self.specs: dict[str, Any] = {}
        self._prepared: tuple[Schedule, Payloads] | None = None  # the last schedule prepare() serialized

    def with_mode(self, mode: OpenLoop | ClosedLoop) -> "TritonTarget":
        """The same target with another default load mode."""
        other = copy.copy(self)
        other.mode = mode
        other._stop = threading.Event()
        return other

    def stop(self) -> None:
        """Ask a running :meth:`run` to stop (thread-safe)."""
        self._stop.set()

    def _stats(self, models: Sequence[str] | None = None) -> dict:
        """Triton's cumulative statistics for ``models`` (default: every served model)."""
        with Control(self.url) as control:
            return control.statistics(models)

    # -- preparation (before the clock) ------------------------------------------------------------------------
    def prepare(self, schedule: Schedule) -> Payloads:
        """Check the schedule's models against the server and serialize every request it needs
        (:mod:`serving_bench.load.payloads`).

        Called by :meth:`run`; call it first to fail early (the result is reused by the next ``run`` of the same
        schedule). Raises :class:`InputError` (unknown model: the list of served ones; impossible batch size; bad
        input files) before anything is sent."""
        if self._prepared is not None and self._prepared[0] is schedule:
            return self._prepared[1]
        source = self.source or schedule.meta.get("profile") or "schedule"
        self.specs = fetch_specs(self.url, schedule.models, source)
        payloads = prepare_payloads(schedule, self.specs, source)
        self._prepared = (schedule, payloads)
        return payloads

    # -- the run -------------------------------------------------------------------------------------------------
    def run(self, schedule: Schedule, mode: OpenLoop | ClosedLoop | None = None) -> Records:
        """Send ``schedule`` in ``mode`` (default: the target's) and return its records (one row per request, see
        :mod:`serving_bench.run.records`)."""
        mode = mode or self.mode
        prepared = self.prepare(schedule)
        self._prepared = None  # payloads are not kept beyond the run
        payloads, index, warmup = prepared.payloads, prepared.index, prepared.warmup
        n = len(schedule)
        closed = isinstance(mode, ClosedLoop)
        duration = float(mode.duration_s or schedule.duration_s) if closed else schedule.duration_s
        concurrency = mode.per_model(schedule.models) if closed else {}
        native = self.sender == "native" and n > 0
        processes = min(max(self.senders, 1) if native else self.senders, n) if n else 0
        senders = max(1, processes)
        shares = []
        for k in range(senders):
            rows = np.arange(k, n, senders, dtype=np.int64)
            per = {m: _split(concurrency.get(name, 0), senders, k) for m, name in enumerate(schedule.models)}
            shares.append(Share(self.url, rows, schedule.arrival_s, schedule.model, index, payloads,
                                warmup if k == 0 else warmup[:1], mode.name,
                                None if closed or mode.max_in_flight is None
                                else max(1, _split(mode.max_in_flight, senders, k)),
                                "wait" if closed else mode.on_cap,
                                {m: c for m, c in per.items() if c > 0}, duration, self.timeout_s, self.grace_s))
        arrays, shm = Arrays.allocate(n, shared=processes > 0)
        self._stop.clear()
        try:
            with deferred_interrupts(on_signal=lambda _reason: self._stop.set()) as signals:
                errors, reasons, elapsed, stats_before = self._execute(shares, arrays, shm, n, schedule, native)
                if signals.reason:
                    reasons.append(signals.reason + (" before the start" if elapsed == 0.0 else ""))
                elif self._stop.is_set() and not reasons:
                    reasons.append("stopped")
                table, partial, stop_reason, dropped = self._table(schedule, arrays, errors, reasons, closed)
        finally:
            if shm is not None:
                del arrays
                shm.close()
                shm.unlink()
        try:
            server_stats = stats_delta(stats_before, self._stats(list(self.specs))) if stats_before else {}
        except Exception:  # the server may be gone (that is recorded already)
            server_stats = {}
        records = Records(table, RunInfo(
            target=self.name, meta={**schedule.meta, **prepared.facts}, partial=partial, stop_reason=stop_reason,
            dropped=dropped, server_stats=server_stats, mode=mode.name, senders=processes,
            sender="native" if native else "python", url=self.url,
            elapsed_s=elapsed, timeout_s=self.timeout_s, t0_unix=self.t0_unix, t0_s=self.t0_s,
            sender_cpu_s=self.sender_cpu_s, concurrency=concurrency if closed else None))
        records = flag_queue_policy_collapse(records)
        if signals.reason:
            raise RunInterrupted(records)
        return records

    def _execute(self, shares: list[Share], arrays: Arrays, shm, n: int, schedule: Schedule, native: bool):
        """Start the senders, give them a common t0, watch (progress, server liveness, a stop) until they finish.
        A stop before the start sends nothing; a sender that fails before the start is a :class:`ServerError`, one
        that fails later ends the run (partial). Returns the error texts by row, the stop reasons, the seconds the
        run lasted and Triton's statistics at the start."""
        crew = _Crew.hire(shares, arrays, shm, n, native)
        t0 = time.perf_counter()
        stats_before: dict = {}
        try:
            crew.start(shares)
            self._await_ready(crew)
            started = not self._stop.is_set()  # stopped before the start: nothing is sent
            if started:
                stats_before = self._stats(list(self.specs))  # after the warm-up requests
                t0 = time.perf_counter() + 0.02
                crew.t0.value = t0
                crew.go.set()
            watch = self._watch(crew, arrays, schedule, t0, finished=0 if started else len(crew.workers))
            elapsed = time.perf_counter() - t0 if started else 0.0
        finally:
            crew.release()
        if any(r.startswith(SERVER_UNAVAILABLE) for r in watch.reasons) and self.alive is not None:
            watch.reasons[:0] = self._server_death()  # the transport noticed first; say why the server is gone
        if self.progress is not None:
            self.progress(_progress(arrays, schedule, elapsed))
        self.t0_unix = time.time() + (t0 - time.perf_counter())
        self.t0_s = t0
        self.sender_cpu_s = watch.sender_cpu_s
        return watch.errors, watch.reasons, elapsed, stats_before

    def _await_ready(self, crew: "_Crew") -> None:
        """Wait until every sender said it is ready (its warm-up done), or a stop; :class:`ServerError` when one
        failed or exited first, or none was ready within 120 s."""
        ready = 0
        failures: list[str] = []
        deadline = time.monotonic() + 120.0
        while ready < len(crew.workers) and not failures and not self._stop.is_set():
            try:
                kind, payload = crew.messages.get(timeout=0.2)
            except queue.Empty:
                dead = [w for w in crew.workers if not w.is_alive()]
                if dead or time.monotonic() > deadline:
                    failures.append("a sender process exited before it was ready (senders > 0 start new "
                                    "Python processes: the calling script needs `if __name__ == '__main__':`)"
                                    if dead and not crew.native else "a native sender exited before it was ready"
                                    if dead else "the senders were not ready within 120 s")
                continue
            if kind == "ready":
                ready += 1
            else:
                failures.append(payload if kind == "failed" else str(payload))
        if failures:
            raise ServerError(failures[0])

    def _watch(self, crew: "_Crew", arrays: Arrays, schedule: Schedule, t0: float, finished: int) -> "_Watched":
        """Collect the senders' reports until all ``len(crew.workers) - finished`` left have finished; stop them
        all when one lost the server, on a stop request, or when the server died; report progress meanwhile."""
        watched = _Watched()
        last_progress = 0.0
        stop = crew.stop
        while finished < len(crew.workers):
            try:
                kind, payload = crew.messages.get(timeout=0.1)
            except queue.Empty:
                kind = None
            if kind == "done":
                finished += 1
                errs, reason, cpu = payload
                watched.sender_cpu_s += cpu
                watched.errors.update(errs)
                if reason:
                    watched.reasons.append(reason)
                    stop.set()  # one sender lost the server: stop the others too
            elif kind == "failed":
                finished += 1
                watched.reasons.append(f"a sender failed: {payload}")
                stop.set()
            if self._stop.is_set() and not stop.is_set():
                stop.set()
            if self.alive is not None and not stop.is_set():
                try:
                    self.alive()
                except ServerError as err:
                    watched.reasons.append(f"{SERVER_DIED}: {err}")
                    stop.set()
            now = time.perf_counter()
            if self.progress is not None and now - last_progress >= self.progress_interval_s:
                last_progress = now
                self.progress(_progress(arrays, schedule, now - t0))
        return watched

    def _server_death(self, wait_s: float = 1.0) -> list[str]:
        """``["server died: ..."]`` (naming its exit code and log) when the local server process is gone, waiting up
        to ``wait_s`` for a process that is still exiting; ``[]`` when it is alive."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.alive()
            except ServerError as err:
                return [f"{SERVER_DIED}: {err}"]
            if time.monotonic() > deadline:
                return []
            time.sleep(0.05)

    def _table(self, schedule: Schedule, arrays: Arrays, errors: dict[int, str], reasons: list[str],
               closed: bool) -> tuple[pd.DataFrame, bool, str | None, int]:
        """The records table from the senders' arrays and error texts; with ``partial``, ``stop_reason`` and the
        number of requests dropped at the cap."""
        records = new_table(schedule)
        status = arrays.status.copy()
        leftover = status == IN_FLIGHT  # cannot happen unless a sender died mid-request
        status[leftover] = ERROR
        for i in np.flatnonzero(leftover):
            errors.setdefault(int(i), "lost: the sender ended before the response")
        records["sent_s"] = arrays.sent.copy()
        records["done_s"] = arrays.done.copy()
        records["status"] = pd.Categorical.from_codes(status.astype(np.int8), categories=list(STATUSES))
        if errors:
            idx = np.fromiter(errors.keys(), dtype=np.int64)
            err = records["error"].to_numpy()
            err[idx] = list(errors.values())
            records["error"] = err
        stopped = [r for r in reasons if r]
        if len(stopped) > 1:  # the senders' plain "stopped" only echoes the reason the parent gave
            stopped = [r for r in stopped if r != "stopped"]
        if closed:
            # arrivals are not used in a closed loop: the request was "intended" when a worker sent it; requests
            # never reached are not part of the run
            reached = ~np.isnan(records["sent_s"].to_numpy()) | (records["error"].to_numpy() != "")
            records = records[reached].reset_index(drop=True)
            records["intended_s"] = records["sent_s"]
            records["request_id"] = np.arange(len(records), dtype=np.int64)
        return (records, bool(stopped), "; ".join(dict.fromkeys(stopped)) if stopped else None,
                int(sum(1 for e in errors.values() if e.startswith("dropped:"))))


@dataclass
class _Watched:
    """What the senders reported: error texts by row, stop reasons, their CPU seconds."""

    errors: dict[int, str] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    sender_cpu_s: float = 0.0


@dataclass
class _Crew:
    """The senders of one run and what they talk through: ``messages`` (their reports), ``go`` (the common start),
    ``stop``, ``t0`` (the start time, shared) and, for sender processes, ``inboxes`` (each one's share, sent after
    it started)."""

    workers: list[Any]
    messages: Any
    go: Any
    stop: Any
    t0: Any
    native: bool
    threaded: bool
    inboxes: list[Any] = field(default_factory=list)

    @classmethod
    def hire(cls, shares: list[Share], arrays: Arrays, shm, n: int, native: bool) -> "_Crew":
        """Native sender processes, sender threads (no shared memory) or Python sender processes, not started."""
        threaded = shm is None
        if native or threaded:  # talked to by threads of this process
            messages, go, stop, t0 = queue.Queue(), threading.Event(), threading.Event(), LocalValue()
            if native:
                workers: list[Any] = [NativeSender(s, arrays, shm.name, messages, go, t0, stop) for s in shares]
            else:
                workers = [threading.Thread(target=sender_main, name="serving-bench-sender",
                                            args=(s, arrays, None, n, messages, go, t0, stop), daemon=True)
                           for s in shares]
            return cls(workers, messages, go, stop, t0, native, threaded)
        ctx = mp.get_context("spawn")
        messages, go, stop, t0 = ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Value("d", 0.0)
        # a share (every payload) goes through a queue after the start, not with the process: a child that dies
        # before reading its start-up data would otherwise block Process.start() on a full pipe for ever
        inboxes = [ctx.Queue() for _ in shares]
        workers = [ctx.Process(target=sender_main, name="serving-bench-sender",
                               args=(box, None, shm.name, n, messages, go, t0, stop), daemon=True)
                   for box in inboxes]
        return cls(workers, messages, go, stop, t0, native, threaded, inboxes)

    def start(self, shares: list[Share]) -> None:
        for w, inbox, share in zip(self.workers, self.inboxes or [None] * len(self.workers), shares):
            w.start()
            if inbox is not None:
                inbox.put(share)

    def release(self) -> None:
        """Stop and join every started sender (killing a process that does not end within 30 s)."""
        self.stop.set()
        self.go.set()
        for w in self.workers:
            if w.ident is not None:  # started
                w.join(timeout=30)
                if not self.threaded and w.is_alive():
                    w.kill()


def _split(total: int, parts: int, k: int) -> int:
    return total // parts + (1 if k < total % parts else 0)


def _grpc_url(endpoints: Any) -> tuple[str, TritonServer | None]:
    """The gRPC address, and the local server whose death ends a run (an external one is not watched: checking it
    costs a request)."""
    server = endpoints if isinstance(endpoints, TritonServer) else None
    endpoints = getattr(endpoints, "endpoints", endpoints)
    if isinstance(endpoints, Endpoints):
        return endpoints.grpc_url, server
    if isinstance(endpoints, str):
        return Endpoints.from_url(endpoints).grpc_url, None
    raise TypeError(f"expected Endpoints, TritonServer or 'host:port', got {type(endpoints).__name__}")


def _progress(arrays: Arrays, schedule: Schedule, elapsed: float, window_s: float = 2.0) -> Progress:
    status = arrays.status
    sent = int(np.count_nonzero(~np.isnan(arrays.sent)))
    finished_mask = (status != NOT_SENT) & (status != IN_FLIGHT)
    ok_mask = status == OK
    done = arrays.done
    recent = ok_mask & (done >= elapsed - window_s)
    n_recent = int(recent.sum())
    p99 = None
    if n_recent:
        lat = done[recent] - schedule.arrival_s[recent]
        p99 = float(np.percentile(lat, 99))
    return Progress(elapsed, len(status), sent, int(finished_mask.sum()), int((status == IN_FLIGHT).sum()),
                    int(ok_mask.sum()), int(((status == ERROR) | (status == REJECTED) | (status == TIMEOUT)).sum()),
                    n_recent / min(window_s, max(elapsed, 1e-9)), p99)


