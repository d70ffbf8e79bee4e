"""The sender: the core every load mode of the real target runs on, in a thread or in a spawned process.

Non-blocking gRPC calls started from a timing thread, their outcomes recorded by a completion thread as they come out
of gRPC's completion queue (:mod:`serving_bench.load.infer_channel`). Open loop: each owned request leaves at its
scheduled time (optionally capped: wait or drop at ``max_in_flight``). Closed loop: ``concurrency`` workers per model,
the next request started from the completion thread the moment one returns. Outcomes go into per-request arrays
(:class:`Arrays`: shared memory across processes); the orchestration (:mod:`serving_bench.load.driver`) starts the
senders, gives them a common ``t0`` and turns the arrays into records.

Why it looks like this (measured on 2 cores against a no-op python model, figures in ``docs/load.md#drivers``): the client
must cost less per request than the server for a Python load generator to keep up with a C++ one. ``grpc.aio``
spent most of the sender's CPU on per-call machinery (a task, coroutines, a loop wake-up per completion); the
completion-queue calls skip all of it. The timing thread sleeps with ``time.sleep`` (``clock_nanosleep``) and 1 µs
timer slack, so it wakes within tens of microseconds (asyncio's epoll waits in whole milliseconds). The garbage
collector's long-lived objects are frozen before the start (a full collection takes ~30 ms with numpy, pandas and
gRPC loaded). Requests are serialized up front and sent as bytes (no protobuf or tensor work on the clock). A sender
process of its own keeps the timing loop away from the caller's threads (telemetry sampling, the progress bar: each
holds the GIL for about a millisecond at a time); several help when one Python process cannot keep up with the rate.
Times are seconds (``time.perf_counter``, CLOCK_MONOTONIC, shared by every process on the machine) from ``t0``.
"""

from __future__ import annotations

import ctypes
import gc
import math
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import grpc
import numpy as np

from serving_bench.errors import ServerError
from serving_bench.load.infer_channel import OK_CODE, InferChannel
from serving_bench.load.outcomes import (ERROR, IN_FLIGHT, OK, Arrays, FailureJudge, dropped_error,
                                         unreachable_error)

GRPC_OPTIONS = (("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1))


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
# the stop reason of a replay whose requests outlived their deadline (the native sender, sender.cc, says the same)
OUTLIVED_DEADLINE = "requests outlived their deadline"


# -- what one sender does ----------------------------------------------------------------------------------------------

@dataclass
class Share:
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


_WAKE = object()  # tag of the call that wakes the completion thread at the end


class _Sender:
    """The core: one gRPC channel, the rows of one share, two threads.

    The sending thread (the caller of :meth:`run`) sleeps until each request's time and starts the call
    (:meth:`_send`, non-blocking); the completion thread polls the channel and records each outcome the moment it
    comes out (:meth:`_finish`), and in a closed loop starts the worker's next request right there. Counters shared
    by the two threads change under ``lock``; every other shared value has a single writer."""

    def __init__(self, share: Share, arrays: Arrays, t0: float, stop: Any):
        self.share = share
        self.arrays = arrays
        self.t0 = t0
        self.stop_event = stop
        self.errors: dict[int, str] = {}
        self.stopping = False
        self.cancel_at_once = False  # a stop whose in-flight requests cannot be answered any more
        self.stop_reason: str | None = None
        self.judge = FailureJudge(share.timeout_s)
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
        self.channel = InferChannel(self.share.url, GRPC_OPTIONS)
        try:
            self.channel.ready(10.0)
            for k in self.share.warmup:
                self.channel.infer_blocking(self.share.payloads[k], max(self.share.timeout_s, 30.0))
        except (grpc.FutureTimeoutError, grpc.RpcError) as err:
            self.channel.close()
            raise ServerError(unreachable_error(self.share.url, _describe(err))) from None

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
                    self.errors[i] = dropped_error(cap)
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
            self.stop_reason = self.stop_reason or OUTLIVED_DEADLINE
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
            self.judge.answered_ok()
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
        failure = self.judge.judge(code, details)
        failure.record(self.arrays, self.errors, i)
        if failure.stop:
            self._stop(failure.stop, at_once=failure.at_once)

    def _stop(self, reason: str, at_once: bool = False) -> None:
        """Stop sending; ``at_once``: cancel what is in flight without waiting for it (it cannot be answered)."""
        if not self.stopping:
            self.stop_reason = reason
            self.stopping = True
            self.slot_free.set()
        self.cancel_at_once = self.cancel_at_once or at_once


def describe_failure(err: BaseException) -> str:
    """A sender's failure as the parent reports it: ``Type: message``."""
    return f"{type(err).__name__}: {err}"


def _describe(err: BaseException) -> str:
    details = getattr(err, "details", None)
    if callable(details):
        code = err.code()
        return f"{code.name}: {details()}"
    return type(err).__name__


def sender_main(share, arrays: Arrays | None, shm_name: str | None, n: int, messages, go, t0_value,
                 stop) -> None:
    """Entry point of one sender (a thread, or a spawned process): connect and warm up, report ready, wait for the
    common ``t0``, run, report the error texts. ``share``: its :class:`Share`, or — a process — the queue it comes
    through."""
    shm = None
    if arrays is None:  # a sender process: its share from the parent, then the parent's shared arrays
        for sig in (signal.SIGINT, signal.SIGTERM):  # the parent handles them and tells us through ``stop``
            signal.signal(sig, signal.SIG_IGN)
        share = share.get()
        shm = shared_memory.SharedMemory(name=shm_name)
        arrays = Arrays.attach(shm.buf, n)
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
        messages.put(("failed", describe_failure(err)))
    finally:
        gc.unfreeze()
        sys.setswitchinterval(switch_interval)
        if shm is not None:
            del arrays
            shm.close()


class LocalValue:
    """``multiprocessing.Value``'s interface for senders that are threads."""

    def __init__(self):
        self.value = 0.0
