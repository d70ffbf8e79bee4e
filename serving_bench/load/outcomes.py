"""What happened to each request, as every sender records it: the status codes, the per-request outcome arrays, and
the one judge of a failed call (its status, its error text, whether the run must stop).

Both senders — the Python one (:mod:`serving_bench.load.sender`) and the native one (:mod:`serving_bench.load.native`,
whose failures are judged here in the parent as they arrive) — go through :class:`FailureJudge`, so a status and its
error text mean the same whichever sent the request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import grpc
import numpy as np

from serving_bench.load.infer_channel import STATUS_CODES
from serving_bench.run.records import STATUSES

OK, ERROR, TIMEOUT, REJECTED, NOT_SENT = (STATUSES.index(s) for s in ("ok", "error", "timeout", "rejected",
                                                                       "not_sent"))
IN_FLIGHT = 100  # internal, never left in finished records
INSTANCE_DIED = "model instance died"  # stop_reason prefix when the python backend reports a dead stub
SERVER_UNAVAILABLE = "server unavailable"  # stop_reason prefix when the transport lost the server
UNAVAILABLE_STREAK = 20  # this many UNAVAILABLE answers in a row (none OK between) mean the server is gone
_LOST = ("connect", "refused", "reset", "socket closed", "broken pipe", "unavailable", "eof")


@dataclass
class Arrays:
    """Per-request outcome, written by the senders and read by the parent (numpy views; shared memory across
    processes: ``sent`` float64[n] at byte 0, ``done`` float64[n] at 8·m, ``status`` int8[n] at 16·m, m = max(1, n) —
    the native sender maps the same layout). Times are seconds from ``t0``; NaN where it did not happen."""

    sent: np.ndarray
    done: np.ndarray
    status: np.ndarray

    @classmethod
    def allocate(cls, n: int, shared: bool) -> tuple["Arrays", Any]:
        if not shared:
            arrays = cls(np.full(n, np.nan), np.full(n, np.nan), np.full(n, NOT_SENT, dtype=np.int8))
            return arrays, None
        size = max(1, n) * (8 + 8 + 1)
        shm = shared_memory.SharedMemory(create=True, size=size)
        arrays = cls.attach(shm.buf, n)
        arrays.sent[:] = np.nan
        arrays.done[:] = np.nan
        arrays.status[:] = NOT_SENT
        return arrays, shm

    @classmethod
    def attach(cls, buf, n: int) -> "Arrays":
        m = max(1, n)
        return cls(np.ndarray((n,), np.float64, buf, 0), np.ndarray((n,), np.float64, buf, 8 * m),
                   np.ndarray((n,), np.int8, buf, 16 * m))


@dataclass(frozen=True)
class Failure:
    """The judged outcome of a failed call: ``status`` (ERROR, TIMEOUT or REJECTED), ``error`` (the records' text),
    ``answered`` (False: no response, ``done_s`` stays empty), ``stop`` (a stop reason when the run must end) and
    ``at_once`` (cancel what is in flight without waiting: it cannot be answered any more)."""

    status: int
    error: str
    answered: bool = True
    stop: str | None = None
    at_once: bool = False

    def record(self, arrays: Arrays, errors: dict[int, str], i: int) -> None:
        """Write it as request ``i``'s outcome (``done_s`` as stamped, or NaN when not answered)."""
        arrays.status[i] = self.status
        if not self.answered:
            arrays.done[i] = math.nan
        errors[i] = self.error


class FailureJudge:
    """Turns a failed call's gRPC status (``code`` as int) and ``details`` into a :class:`Failure`. Keeps one piece of
    state, per sender: the run of UNAVAILABLE answers since the last OK (:meth:`answered_ok` resets it)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.unavailable_streak = 0

    def answered_ok(self) -> None:
        self.unavailable_streak = 0

    def judge(self, code: int, details: str) -> Failure:
        status = STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN)
        lower = details.lower()
        if status == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Failure(TIMEOUT, f"timeout: no response within {self.timeout_s:g} s", answered=False)
        if "timeout expired" in lower:  # Triton's queue policy dropped it (default_timeout_us)
            return Failure(TIMEOUT, f"timeout: {status.name}: {details}", answered=False)  # as the simulator has it
        if status == grpc.StatusCode.CANCELLED:
            return Failure(ERROR, "cancelled: the run stopped before the response", answered=False)
        text = f"{status.name}: {details}"
        if "is not healthy" in details:  # the python backend: this model instance's stub process died
            return Failure(ERROR, text, stop=f"{INSTANCE_DIED}: {details}", at_once=True)
        if status == grpc.StatusCode.RESOURCE_EXHAUSTED or "queue" in lower:
            return Failure(REJECTED, text)
        if status != grpc.StatusCode.UNAVAILABLE:
            return Failure(ERROR, text)
        # the server is gone when the transport says so (refused, reset, closed) or a run of requests fail
        self.unavailable_streak += 1
        lost = any(s in lower for s in _LOST)
        return Failure(ERROR, text, stop=f"{SERVER_UNAVAILABLE}: {details}"
                       if lost or self.unavailable_streak >= UNAVAILABLE_STREAK else None)


def dropped_error(cap: int) -> str:
    """The error text of a request dropped at the open-loop cap (status ``not_sent``)."""
    return f"dropped: max_in_flight={cap} requests were outstanding"


def unreachable_error(url: str, what: str) -> str:
    """A sender could not reach the server before the run (``what``: the transport's words)."""
    return f"cannot reach Triton at {url} before the run: {what}"
