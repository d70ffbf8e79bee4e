"""The driver: sends a Schedule to a real Triton over gRPC and records what happened to every request.

One core (:func:`_sender_main` / :class:`_Sender`), used by every mode: non-blocking gRPC calls started from a
timing thread, their outcomes recorded by a completion thread as they come out of gRPC's completion queue
(:mod:`serving_bench.load.infer_channel`):

* **open loop** — each request leaves at its scheduled time, whatever is in flight (optionally capped:
  ``max_in_flight`` with ``on_cap="wait"`` — it leaves late and the lateness is recorded — or ``"drop"`` — it is
  not sent, status ``not_sent``, error ``dropped: ...``);
* **closed loop** — ``concurrency`` requests in flight per model, the next one sent when one returns (perf_analyzer's
  concurrency mode); requests are taken from the schedule in order, their arrival times ignored, and ``intended_s``
  is set to the send time; requests never reached by the end of ``duration_s`` are dropped from the records.

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

Why it looks like this (measured on 2 cores against a no-op python model, figures in ``docs/load.md``): the client
must cost less per request than the server for a Python load generator to keep up with a C++ one. ``grpc.aio``
spent most of the sender's CPU on per-call machinery (a task, coroutines, a loop wake-up per completion); the
completion-queue calls skip all of it. The timing thread sleeps with ``time.sleep`` (``clock_nanosleep``) and 1 µs
timer slack, so it wakes within tens of microseconds (asyncio's epoll waits in whole milliseconds). The garbage
collector's long-lived objects are frozen before the start (a full collection takes ~30 ms with numpy, pandas and
gRPC loaded). Requests are serialized up front and sent as bytes (no protobuf or tensor work on the clock). The
sender runs in a thread of the calling process (``senders=0``) or in ``senders=N`` spawned processes — each owns
every N-th request, all use the same ``t0``, outcomes meet in shared memory. A process of its own keeps the timing
loop away from the caller's threads (telemetry sampling, the progress bar: each holds the GIL for about a
millisecond at a time); several help when one Python process cannot keep up with the rate.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import math
import multiprocessing as mp
import queue
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from serving_bench.errors import InputError, ServerError
from serving_bench.interrupts import RunInterrupted, deferred_interrupts
from serving_bench.load.collapse import flag_queue_policy_collapse
from serving_bench.load.schedule import Schedule
from serving_bench.records import STATUSES, new_records

OK, ERROR, TIMEOUT, REJECTED, NOT_SENT = (STATUSES.index(s) for s in ("ok", "error", "timeout", "rejected",
                                                                       "not_sent"))
IN_FLIGHT = 100  # internal, never left in finished records
INSTANCE_DIED = "model instance died"  # stop_reason prefix when the python backend reports a dead stub
SERVER_DIED = "server died"  # stop_reason prefix when the server process is gone
OK_CODE = 0  # gRPC status OK
GRPC_OPTIONS = (("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1))


# -- modes -----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpenLoop:
    """Send each request at its scheduled time. ``max_in_flight`` caps outstanding requests (``None``: no cap);
    at the cap a request waits (``on_cap="wait"``, it leaves late) or is dropped (``"drop"``, status ``not_sent``)."""

    name = "open"
    max_in_flight: int | None = None
    on_cap: str = "wait"

    def __post_init__(self):
        if self.on_cap not in ("wait", "drop"):
            raise ValueError(f"on_cap must be 'wait' or 'drop', got {self.on_cap!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")


@dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` requests in flight per model (an int for every model, or a mapping model -> int) for
    ``duration_s`` (default: the schedule's duration) or until the schedule's requests run out."""

    name = "closed"
    concurrency: int | Mapping[str, int] = 1
    duration_s: float | None = None

    def per_model(self, models: Sequence[str]) -> dict[str, int]:
        if isinstance(self.concurrency, Mapping):
            return {m: int(self.concurrency.get(m, 0)) for m in models}
        return {m: int(self.concurrency) for m in models}


MODES = {"open": OpenLoop, "closed": ClosedLoop}


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


# -- timing ------------------------------------------------------------------------------------------------------------

def _tight_timer_slack() -> None:
    """Ask Linux for 1 µs timer slack on this thread (default 50 µs); harmless where it is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, nanoseconds
    except (OSError, AttributeError):
        pass


STOP_POLL_S = 0.02  # how often a sender looks at the run's stop event (and the longest single sleep)
# The timing thread and the completion thread share the GIL. A thread that wants it waits for the holder to let go,
# and only after the switch interval (Python's default 5 ms) forces a hand-over: a busy completion thread, which lets
# go and takes it back between completions, could keep the timing thread waiting that long. Set for the run.
SWITCH_INTERVAL_S = 2e-4


# -- what one sender does ----------------------------------------------------------------------------------------------

@dataclass
class _Share:
    """One sender's part of the run (plain data: sent to a sender process as is)."""

    url: str
    rows: np.ndarray              # schedule rows this sender owns, in arrival order
    arrival_s: np.ndarray         # all rows
    model: np.ndarray             # all rows
    payload: np.ndarray           # all rows: index into payloads
    payloads: list[bytes]
    warmup: list[int]             # payload indices to send once before the clock starts (one per model)
    mode: str
    max_in_flight: int | None
    on_cap: str
    concurrency: dict[int, int]   # closed loop: model index -> workers in this sender
    closed_duration_s: float
    timeout_s: float
    grace_s: float


@dataclass
class _Arrays:
    """Per-request outcome, written by the senders and read by the parent (numpy views; shared memory across
    processes)."""

    sent: np.ndarray
    done: np.ndarray
    status: np.ndarray

    @classmethod
    def allocate(cls, n: int, shared: bool) -> tuple["_Arrays", Any]:
        if not shared:
            arrays = cls(np.full(n, np.nan), np.full(n, np.nan), np.full(n, NOT_SENT, dtype=np.int8))
            return arrays, None
        from multiprocessing import shared_memory

        size = max(1, n) * (8 + 8 + 1)
        shm = shared_memory.SharedMemory(create=True, size=size)
        arrays = cls.attach(shm.buf, n)
        arrays.sent[:] = np.nan
        arrays.done[:] = np.nan
        arrays.status[:] = NOT_SENT
        return arrays, shm

    @classmethod
    def attach(cls, buf, n: int) -> "_Arrays":
        m = max(1, n)
        return cls(np.ndarray((n,), np.float64, buf, 0), np.ndarray((n,), np.float64, buf, 8 * m),
                   np.ndarray((n,), np.int8, buf, 16 * m))


_WAKE = object()  # tag of the call that wakes the completion thread at the end


class _Sender:
    """The core: one gRPC channel, the rows of one share, two threads.

    The sending thread (the caller of :meth:`run`) sleeps until each request's time and starts the call
    (:meth:`_send`, non-blocking); the completion thread polls the channel and records each outcome the moment it
    comes out (:meth:`_finish`), and in a closed loop starts the worker's next request right there. Counters shared
    by the two threads change under ``lock``; every other shared value has a single writer."""

    def __init__(self, share: _Share, arrays: _Arrays, t0: float, stop: Any):
        self.share = share
        self.arrays = arrays
        self.t0 = t0
        self.stop_event = stop
        self.errors: dict[int, str] = {}
        self.stopping = False
        self.cancel_at_once = False  # a stop whose in-flight requests cannot be answered any more
        self.stop_reason: str | None = None
        self.unavailable_streak = 0
        self.lock = threading.Lock()
        self.sent = 0                  # calls started (under lock)
        self.finished = 0              # outcomes recorded (under lock)
        self.live: dict[int, Any] = {}  # request -> call, while in flight (for cancelling at a stop)
        self.slot_free = threading.Event()
        self.waiting_for_slot = False
        self.closed = share.mode != "open"
        self.queues: dict[int, deque] = {}
        self.end = math.inf
        self.payload_of = [share.payloads[k] for k in share.payload.tolist()] if self.closed else []
        self.model_of = share.model.tolist() if self.closed else []
        self.next_stop_poll = 0.0
        self.crash: str | None = None

    def connect(self) -> None:
        import grpc

        from serving_bench.load.infer_channel import InferChannel

        self.channel = InferChannel(self.share.url, GRPC_OPTIONS)
        try:
            self.channel.ready(10.0)
            for k in self.share.warmup:
                self.channel.infer_blocking(self.share.payloads[k], max(self.share.timeout_s, 30.0))
        except (grpc.FutureTimeoutError, grpc.RpcError) as err:
            self.channel.close()
            raise ServerError(f"cannot reach Triton at {self.share.url} before the run: {_describe(err)}") from None

    def run(self) -> None:
        completer = threading.Thread(target=self._completions, name="serving-bench-completions", daemon=True)
        completer.start()
        clean = False
        try:
            if self.closed:
                self._closed_loop()
            else:
                self._open_loop()
            clean = self._drain()
        finally:
            try:
                self.channel.wake(_WAKE)
            except ValueError:
                pass
            completer.join(timeout=5.0)
            if clean and not completer.is_alive():
                self.channel.close()  # otherwise a stuck call would make close() wait forever: leave it to exit
        if self.crash:
            raise RuntimeError(f"the completion thread failed: {self.crash}")

    # -- sending thread ----------------------------------------------------------------------------------------
    def _open_loop(self) -> None:
        share, pc, sleep = self.share, time.perf_counter, time.sleep
        rows = share.rows.tolist()
        when = (self.t0 + share.arrival_s[share.rows]).tolist()
        payloads = [share.payloads[k] for k in share.payload[share.rows].tolist()]
        cap = share.max_in_flight
        for i, at, payload in zip(rows, when, payloads):
            now = pc()
            while now < at:  # never early; long gaps are slept in pieces to notice a stop
                sleep(min(at - now, STOP_POLL_S))
                now = pc()
                if self._should_stop(now):
                    return
            if self._should_stop(now):
                return
            if cap is not None and self.sent - self.finished >= cap:
                if share.on_cap == "drop":
                    self.errors[i] = f"dropped: max_in_flight={cap} requests were outstanding"
                    continue
                if not self._wait_for_slot(cap):
                    return
            self._send(i, payload)

    def _wait_for_slot(self, cap: int) -> bool:
        self.waiting_for_slot = True
        try:
            while self.sent - self.finished >= cap:
                self.slot_free.clear()
                if self.sent - self.finished >= cap:
                    self.slot_free.wait(STOP_POLL_S)
                if self._should_stop(time.perf_counter()):
                    return False
            return True
        finally:
            self.waiting_for_slot = False

    def _closed_loop(self) -> None:
        share = self.share
        self.end = self.t0 + share.closed_duration_s
        self.queues = {m: deque() for m in share.concurrency}
        for i in share.rows.tolist():
            q = self.queues.get(self.model_of[i])
            if q is not None:
                q.append(i)
        for m, workers in share.concurrency.items():
            for _ in range(workers):
                self._next(m)
        while not self._should_stop(time.perf_counter()) and time.perf_counter() < self.end \
                and any(self.queues.values()):
            time.sleep(0.005)

    def _should_stop(self, now: float) -> bool:
        if not self.stopping and now >= self.next_stop_poll:
            self.next_stop_poll = now + STOP_POLL_S
            if self.stop_event.is_set():
                self._stop("stopped")
        return self.stopping

    def _drain(self) -> bool:
        """Wait for in-flight requests (each bounded by its deadline); after a stop, only ``grace_s``; then cancel
        what is left. True when every started call has its outcome."""
        share, pc = self.share, time.perf_counter
        stopped = self.stopping
        deadline = pc() + (share.grace_s if stopped else share.timeout_s + 5.0)
        while self.finished < self.sent and pc() < deadline and not self.cancel_at_once:
            time.sleep(0.002)
            if not stopped and self._should_stop(pc()):
                stopped = True
                deadline = min(deadline, pc() + share.grace_s)
        if self.finished >= self.sent:
            return True
        for call in list(self.live.values()):
            self.channel.cancel(call, "the run stopped before the response")
        deadline = pc() + 5.0
        while self.finished < self.sent and pc() < deadline:
            time.sleep(0.002)
        if not stopped:  # requests outlived their own deadline: the transport is stuck
            self.stop_reason = self.stop_reason or "requests outlived their deadline"
        return self.finished >= self.sent

    # -- either thread -------------------------------------------------------------------------------------------
    def _send(self, i: int, payload: bytes) -> None:
        """Start request ``i`` (its outcome is recorded by :meth:`_finish`)."""
        arrays = self.arrays
        arrays.status[i] = IN_FLIGHT
        arrays.sent[i] = time.perf_counter() - self.t0
        with self.lock:
            self.sent += 1
        try:
            call = self.channel.start(payload, self.share.timeout_s, i)
        except ValueError as err:  # the channel is closed or the call could not start
            arrays.status[i] = ERROR
            self.errors[i] = f"error: the call did not start: {err}"
            with self.lock:
                self.finished += 1
            return
        self.live[i] = call
        if arrays.status[i] != IN_FLIGHT:  # it finished before it was filed
            self.live.pop(i, None)

    def _next(self, m: int) -> None:
        """Closed loop: the next request of model ``m``'s queue, unless the run is over."""
        q = self.queues[m]
        if self.stopping or time.perf_counter() >= self.end:
            return
        try:
            i = q.popleft()
        except IndexError:
            return
        self._send(i, self.payload_of[i])

    # -- completion thread ---------------------------------------------------------------------------------------
    def _completions(self) -> None:
        poll = self.channel.next
        while True:
            try:
                outcome = poll()
            except RuntimeError as err:
                self.crash = str(err)
                self._stop(f"internal error: {err}")
                return
            if outcome is None:
                continue
            tag, code, details = outcome
            if tag is _WAKE:
                return
            try:
                self._finish(tag, code, details)
            except BaseException as err:  # never leave the sending thread waiting: record and stop
                self.crash = self.crash or f"{type(err).__name__}: {err}"
                self._stop(f"internal error: {self.crash}")
                with self.lock:
                    self.finished += 1

    def _finish(self, i: int, code: int, details: str) -> None:
        """Record the one outcome of request ``i``."""
        arrays = self.arrays
        arrays.done[i] = time.perf_counter() - self.t0
        if code == OK_CODE:
            arrays.status[i] = OK
            self.unavailable_streak = 0
        else:
            self._failed(i, code, details or "")
        self.live.pop(i, None)
        if self.closed:
            self._next(self.model_of[i])  # before counting this one: in flight never reads 0 between the two
        with self.lock:
            self.finished += 1
        if self.waiting_for_slot:
            self.slot_free.set()

    def _failed(self, i: int, code: int, details: str) -> None:
        import grpc

        from serving_bench.load.infer_channel import STATUS_CODES

        arrays, status = self.arrays, STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN)
        if status == grpc.StatusCode.DEADLINE_EXCEEDED:
            arrays.done[i] = math.nan  # no response
            arrays.status[i] = TIMEOUT
            self.errors[i] = f"timeout: no response within {self.share.timeout_s:g} s"
        elif "timeout expired" in details.lower():  # Triton's queue policy dropped it (default_timeout_us)
            arrays.done[i] = math.nan  # no answer, as the simulator records it
            arrays.status[i] = TIMEOUT
            self.errors[i] = f"timeout: {status.name}: {details}"
        elif status == grpc.StatusCode.CANCELLED:
            arrays.done[i] = math.nan
            arrays.status[i] = ERROR
            self.errors[i] = "cancelled: the run stopped before the response"
        elif "is not healthy" in details:  # the python backend: this model instance's stub process died
            arrays.status[i] = ERROR
            self.errors[i] = f"{status.name}: {details}"
            self._stop(f"{INSTANCE_DIED}: {details}", at_once=True)
        else:
            rejected = status == grpc.StatusCode.RESOURCE_EXHAUSTED or "queue" in details.lower()
            arrays.status[i] = REJECTED if rejected else ERROR
            self.errors[i] = f"{status.name}: {details}"
            if status == grpc.StatusCode.UNAVAILABLE and not rejected:
                self._note_unavailable(details)

    def _note_unavailable(self, details: str) -> None:
        """The server is gone when the transport says so (refused, reset, closed) or a run of requests fail."""
        self.unavailable_streak += 1
        lost = any(s in details.lower() for s in ("connect", "refused", "reset", "socket closed", "broken pipe",
                                                  "unavailable", "eof"))
        if lost or self.unavailable_streak >= 20:
            self._stop(f"server unavailable: {details}")

    def _stop(self, reason: str, at_once: bool = False) -> None:
        """Stop sending; ``at_once``: cancel what is in flight without waiting for it (it cannot be answered)."""
        if not self.stopping:
            self.stop_reason = reason
            self.stopping = True
            self.slot_free.set()
        self.cancel_at_once = self.cancel_at_once or at_once


def _describe(err: BaseException) -> str:
    details = getattr(err, "details", None)
    if callable(details):
        code = err.code()
        return f"{code.name}: {details()}"
    return type(err).__name__


def _sender_main(share: _Share, arrays: _Arrays | None, shm_name: str | None, n: int, messages, go, t0_value,
                 stop) -> None:
    """Entry point of one sender (a thread, or a spawned process): connect and warm up, report ready, wait for the
    common ``t0``, run, report the error texts."""
    shm = None
    if arrays is None:  # a sender process: attach to the parent's shared arrays
        from multiprocessing import shared_memory

        for sig in (signal.SIGINT, signal.SIGTERM):  # the parent handles them and tells us through ``stop``
            signal.signal(sig, signal.SIG_IGN)
        shm = shared_memory.SharedMemory(name=shm_name)
        arrays = _Arrays.attach(shm.buf, n)
    _tight_timer_slack()
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    sender = None
    try:
        sender = _Sender(share, arrays, 0.0, stop)
        sender.connect()
        # a full garbage collection walks every object (~30 ms with numpy/pandas/grpc loaded): do one now and move
        # everything that exists into the permanent generation, so collections during the run stay small
        gc.collect()
        gc.freeze()
        messages.put(("ready", None))
        while not go.wait(0.1) or stop.is_set():
            if stop.is_set():
                messages.put(("done", ({}, "stopped before the start", 0.0)))
                return
        sender.t0 = t0_value.value
        cpu = time.process_time()
        sender.run()
        cpu = time.process_time() - cpu  # the whole process: this sender's threads and gRPC's own
        messages.put(("done", (sender.errors, sender.stop_reason, cpu)))
    except BaseException as err:  # report, never hang the parent
        messages.put(("failed", f"{type(err).__name__}: {err}"))
    finally:
        gc.unfreeze()
        sys.setswitchinterval(switch_interval)
        if shm is not None:
            del arrays
            shm.close()


class _Value:
    def __init__(self):
        self.value = 0.0

# -- the target ----------------------------------------------------------------------------------------------------

class TritonTarget:
    """Runs a :class:`Schedule` against a real Triton server; ``run(schedule) -> records``.

    ``endpoints``: an ``Endpoints``, a ``TritonServer`` (its death then stops the run at once) or a gRPC
    ``host:port``. ``mode``: :class:`OpenLoop` (default) or :class:`ClosedLoop`. ``timeout_s``: per-request deadline.
    ``senders``: sender processes (0 = a thread in this process; N > 0 need the calling script to have the
    ``if __name__ == "__main__":`` guard, as multiprocessing's spawn requires). ``progress``: called about every
    ``progress_interval_s`` with a :class:`Progress` from a monitor thread. ``stop()`` ends a run early (partial
    records); so do Ctrl-C and the server dying.
    """

    name = "triton"

    def __init__(self, endpoints: Any, *, mode: OpenLoop | ClosedLoop | None = None, timeout_s: float = 30.0,
                 senders: int = 0, grace_s: float = 5.0, alive: Callable[[], None] | None = None,
                 progress: Callable[[Progress], None] | None = None, progress_interval_s: float = 0.5,
                 source: str | None = None):
        self.url, server = _grpc_url(endpoints)
        self.alive = alive or (server.check_alive if server is not None else None)
        self.mode = mode or OpenLoop()
        self.timeout_s = float(timeout_s)
        self.senders = max(0, int(senders))
        self.grace_s = float(grace_s)
        self.progress = progress
        self.progress_interval_s = progress_interval_s
        self.source = source
        self._stop = threading.Event()
        self.specs: dict[str, Any] = {}
        self._prepared: tuple[Schedule, tuple] | None = None  # the last schedule prepare() serialized

    def with_mode(self, mode: OpenLoop | ClosedLoop) -> "TritonTarget":
        """The same target with another load mode."""
        import copy

        other = copy.copy(self)
        other.mode = mode
        other._stop = threading.Event()
        return other

    def stop(self) -> None:
        """Ask a running :meth:`run` to stop (thread-safe)."""
        self._stop.set()

    def _stats(self, models: Sequence[str] | None = None) -> dict:
        """Triton's cumulative statistics for ``models`` (default: every served model)."""
        return asyncio.run(_statistics(self.url, models))

    # -- preparation (before the clock) ------------------------------------------------------------------------
    def prepare(self, schedule: Schedule) -> tuple[list[bytes], np.ndarray, list[int], dict]:
        """Check the schedule's models against the server and serialize every request it needs.

        Called by :meth:`run`; call it first to fail early (the result is reused by the next ``run`` of the same
        schedule). Returns ``(payloads, payload index per request, one warm-up payload per model, facts)``; raises
        :class:`InputError` (unknown model: the list of served ones; impossible batch size; bad input files)
        before anything is sent."""
        from serving_bench.load.inputs import ModelSpec, SampleBank, check_batch, infer_request

        if self._prepared is not None and self._prepared[0] is schedule:
            return self._prepared[1]
        source = self.source or schedule.meta.get("profile") or "schedule"
        specs = asyncio.run(_fetch_specs(self.url, schedule.models, source))
        self.specs = specs
        inputs_meta = schedule.meta.get("inputs", {})
        seed = int(schedule.meta.get("seed", 0))
        payloads: list[bytes] = []
        index = np.zeros(len(schedule), dtype=np.int64)
        warmup: list[int] = []
        for m, name in enumerate(schedule.models):
            rows = np.flatnonzero(schedule.model == m)
            if not len(rows):
                continue
            spec: ModelSpec = specs[name]
            info = inputs_meta.get(name, {})
            samples = int(info.get("samples", 16))
            bank = SampleBank(spec, samples=samples, seed=int(info.get("seed", seed)), files=info.get("files"),
                              shapes=info.get("shapes"), source=source)
            for b in np.unique(schedule.batch[rows]):
                check_batch(spec, int(b), source)
            keys = schedule.sample[rows].astype(np.int64) * 100003 + schedule.batch[rows]
            unique, inverse = np.unique(keys, return_inverse=True)
            base = len(payloads)
            for key in unique:
                sample, batch = divmod(int(key), 100003)
                payloads.append(infer_request(spec, bank.batch(sample, batch)))
            index[rows] = base + inverse
            warmup.append(base)
        facts = {"ensembles": {n: list(s.ensemble_members) for n, s in specs.items() if s.ensemble_members},
                 "platforms": {n: s.platform for n, s in specs.items()},
                 "instances": {n: s.instances for n, s in specs.items()},
                 "queue_policies": {n: list(s.queue_policy) for n, s in specs.items() if s.queue_policy}}
        self._prepared = (schedule, (payloads, index, warmup, facts))
        return payloads, index, warmup, facts

    # -- the run -------------------------------------------------------------------------------------------------
    def run(self, schedule: Schedule) -> pd.DataFrame:
        """Send ``schedule`` and return its records (one row per request, see :mod:`serving_bench.records`)."""
        payloads, index, warmup, facts = self.prepare(schedule)
        self._prepared = None  # payloads are not kept beyond the run
        n = len(schedule)
        closed = isinstance(self.mode, ClosedLoop)
        duration = float(self.mode.duration_s or schedule.duration_s) if closed else schedule.duration_s
        concurrency = self.mode.per_model(schedule.models) if closed else {}
        processes = min(self.senders, n) if n else 0
        senders = max(1, processes)
        shares = []
        for k in range(senders):
            rows = np.arange(k, n, senders, dtype=np.int64)
            per = {m: _split(concurrency.get(name, 0), senders, k) for m, name in enumerate(schedule.models)}
            shares.append(_Share(self.url, rows, schedule.arrival_s, schedule.model, index, payloads,
                                 warmup if k == 0 else warmup[:1], self.mode.name,
                                 None if closed or self.mode.max_in_flight is None
                                 else max(1, _split(self.mode.max_in_flight, senders, k)),
                                 "wait" if closed else self.mode.on_cap,
                                 {m: c for m, c in per.items() if c > 0}, duration, self.timeout_s, self.grace_s))
        arrays, shm = _Arrays.allocate(n, shared=processes > 0)
        self._stop.clear()
        try:
            with deferred_interrupts(on_signal=lambda _reason: self._stop.set()) as signals:
                errors, reasons, elapsed, stats_before = self._execute(shares, arrays, shm, n, schedule)
                if signals.reason:
                    reasons.append(signals.reason + (" before the start" if elapsed == 0.0 else ""))
                elif self._stop.is_set() and not reasons:
                    reasons.append("stopped")
                records = self._records(schedule, arrays, errors, reasons, closed)
        finally:
            if shm is not None:
                del arrays
                shm.close()
                shm.unlink()
        try:
            stats_after = asyncio.run(_statistics(self.url, list(self.specs))) if stats_before else {}
            records.attrs["server_stats"] = _stats_delta(stats_before, stats_after)
        except Exception:  # the server may be gone (that is recorded already)
            records.attrs["server_stats"] = {}
        records.attrs["meta"].update(facts)
        records.attrs.update(mode=self.mode.name, senders=processes, url=self.url, elapsed_s=elapsed,
                             timeout_s=self.timeout_s, t0_unix=self.t0_unix, t0_s=self.t0_s,
                             sender_cpu_s=self.sender_cpu_s)
        if closed:
            records.attrs["concurrency"] = concurrency
        flag_queue_policy_collapse(records)
        if signals.reason:
            raise RunInterrupted(records)
        return records

    def _execute(self, shares: list[_Share], arrays: _Arrays, shm, n: int, schedule: Schedule):
        """Start the senders, give them a common t0, watch (progress, server liveness, a stop) until they finish.
        A stop before the start sends nothing; a sender that fails before the start is a :class:`ServerError`, one
        that fails later ends the run (partial)."""
        threaded = shm is None
        if threaded:
            messages: Any = queue.Queue()
            go: Any = threading.Event()
            stop: Any = threading.Event()
            t0_value: Any = _Value()
            workers = [threading.Thread(target=_sender_main, name="serving-bench-sender",
                                        args=(s, arrays, None, n, messages, go, t0_value, stop), daemon=True)
                       for s in shares]
        else:
            ctx = mp.get_context("spawn")
            messages, go, stop, t0_value = ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Value("d", 0.0)
            workers = [ctx.Process(target=_sender_main, name="serving-bench-sender",
                                   args=(s, None, shm.name, n, messages, go, t0_value, stop), daemon=True)
                       for s in shares]
        errors: dict[int, str] = {}
        reasons: list[str] = []
        failures: list[str] = []
        t0 = time.perf_counter()
        stats_before: dict = {}
        sender_cpu = 0.0
        try:
            for w in workers:
                w.start()
            ready = 0
            deadline = time.monotonic() + 120.0
            while ready < len(workers) and not failures and not self._stop.is_set():
                try:
                    kind, payload = messages.get(timeout=0.2)
                except queue.Empty:
                    dead = [w for w in workers if not w.is_alive()]
                    if dead or time.monotonic() > deadline:
                        failures.append("a sender process exited before it was ready (senders > 0 start new "
                                        "Python processes: the calling script needs `if __name__ == '__main__':`)"
                                        if dead else "the senders were not ready within 120 s")
                    continue
                if kind == "ready":
                    ready += 1
                else:
                    failures.append(payload if kind == "failed" else str(payload))
            if failures:
                raise ServerError(failures[0])
            started = not self._stop.is_set()  # stopped before the start: nothing is sent
            finished = 0 if started else len(workers)
            if started:
                stats_before = asyncio.run(_statistics(self.url, list(self.specs)))  # after the warm-up requests
                t0 = time.perf_counter() + 0.02
                t0_value.value = t0
                go.set()
            last_progress = 0.0
            while finished < len(workers):
                try:
                    kind, payload = messages.get(timeout=0.1)
                except queue.Empty:
                    kind = None
                if kind == "done":
                    finished += 1
                    errs, reason, cpu = payload
                    sender_cpu += cpu
                    errors.update(errs)
                    if reason:
                        reasons.append(reason)
                        stop.set()  # one sender lost the server: stop the others too
                elif kind == "failed":
                    finished += 1
                    reasons.append(f"a sender failed: {payload}")
                    stop.set()
                if self._stop.is_set() and not stop.is_set():
                    stop.set()
                if self.alive is not None and not stop.is_set():
                    try:
                        self.alive()
                    except ServerError as err:
                        reasons.append(f"{SERVER_DIED}: {err}")
                        stop.set()
                now = time.perf_counter()
                if self.progress is not None and now - last_progress >= self.progress_interval_s:
                    last_progress = now
                    self.progress(_progress(arrays, schedule, now - t0))
            elapsed = time.perf_counter() - t0 if started else 0.0
        finally:
            stop.set()
            go.set()
            for w in workers:
                if w.ident is not None:  # started
                    w.join(timeout=30)
                    if not threaded and w.is_alive():
                        w.kill()
        if any(r.startswith("server unavailable") for r in reasons) and self.alive is not None:
            reasons[:0] = self._server_death()  # the transport noticed first; say why the server is gone
        if self.progress is not None:
            self.progress(_progress(arrays, schedule, elapsed))
        self.t0_unix = time.time() + (t0 - time.perf_counter())
        self.t0_s = t0
        self.sender_cpu_s = sender_cpu
        return errors, reasons, elapsed, stats_before

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

    def _records(self, schedule: Schedule, arrays: _Arrays, errors: dict[int, str], reasons: list[str],
                 closed: bool) -> pd.DataFrame:
        records = new_records(schedule, target=self.name)
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
            records.attrs.update(target=self.name, partial=False, meta=dict(schedule.meta))
        records.attrs["partial"] = bool(stopped)
        records.attrs["stop_reason"] = "; ".join(dict.fromkeys(stopped)) if stopped else None
        records.attrs["dropped"] = int(sum(1 for e in errors.values() if e.startswith("dropped:")))
        return records


def _split(total: int, parts: int, k: int) -> int:
    return total // parts + (1 if k < total % parts else 0)


def _grpc_url(endpoints: Any) -> tuple[str, Any]:
    server = None
    if hasattr(endpoints, "endpoints") and hasattr(endpoints, "check_alive"):
        server = endpoints
        endpoints = server.endpoints
    if hasattr(endpoints, "grpc_url"):
        return endpoints.grpc_url, server
    if isinstance(endpoints, str):
        from serving_bench.serve.server import Endpoints

        return Endpoints.from_url(endpoints).grpc_url, None
    raise TypeError(f"expected Endpoints, TritonServer or 'host:port', got {type(endpoints).__name__}")


def _progress(arrays: _Arrays, schedule: Schedule, elapsed: float, window_s: float = 2.0) -> Progress:
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


# -- control plane (tritonclient.grpc.aio) -------------------------------------------------------------------------

async def _fetch_specs(url: str, models: Sequence[str], source: str) -> dict:
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.utils import InferenceServerException

    from serving_bench.load.inputs import ModelSpec

    client = grpcclient.InferenceServerClient(url)
    try:
        try:
            index = await client.get_model_repository_index()
        except InferenceServerException as err:
            raise ServerError(f"cannot reach Triton at {url}: {err.message()}") from None
        served = sorted(m.name for m in index.models if m.state == "READY")
        specs = {}
        for name in models:
            if name not in served:
                raise InputError(source, f"models.{name}",
                                 f"not served by the server at {url}; served models: {', '.join(served) or 'none'}")
            metadata = await client.get_model_metadata(name)
            config = await client.get_model_config(name)
            specs[name] = ModelSpec.from_server(metadata, config)
        return specs
    finally:
        await client.close()


async def _statistics(url: str, models: Sequence[str] | None) -> dict:
    """Triton's cumulative per-model statistics (counts and ns) for the models of the run."""
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        if models is None:
            index = await client.get_model_repository_index()
            models = [m.name for m in index.models if m.state == "READY"]
        out = {}
        for name in models:
            stats = await client.get_inference_statistics(name)
            for s in stats.model_stats:
                inf = s.inference_stats
                busy = sum(b.compute_input.ns + b.compute_infer.ns + b.compute_output.ns for b in s.batch_stats)
                out[name] = {"inference_count": s.inference_count, "execution_count": s.execution_count,
                             "busy_ns": busy, **{f"{k}_count": getattr(inf, k).count for k in _PHASES},
                             **{f"{k}_ns": getattr(inf, k).ns for k in _PHASES}}
        return out
    finally:
        await client.close()


_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def _stats_delta(before: dict, after: dict) -> dict:
    """Per model during the run: requests, executions, mean batch, the server's mean time per phase (s) and
    ``busy_s``, the compute time of its executions summed (instance-seconds, from the per-batch-size statistics)."""
    out = {}
    for name, a in after.items():
        b = before.get(name, {})
        d = {k: a[k] - b.get(k, 0) for k in a}
        count = d.get("success_count", 0)
        row = {"inference_count": d["inference_count"], "execution_count": d["execution_count"],
               "success_count": count, "fail_count": d.get("fail_count", 0),
               "mean_exec_batch": d["inference_count"] / d["execution_count"] if d["execution_count"] else None,
               "busy_s": d.get("busy_ns", 0) / 1e9}
        for phase in ("queue", "compute_input", "compute_infer", "compute_output", "success"):
            c = d.get(f"{phase}_count", 0)
            row[f"{phase}_mean_s"] = d[f"{phase}_ns"] / c / 1e9 if c else None
        out[name] = row
    return out
