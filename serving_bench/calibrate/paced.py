"""Samples from sums: any Triton's per-request times, one request at a time.

Triton's statistics extension (every backend reports it, native ones included) gives cumulative counts and sums,
not samples. A *paced* run sends requests of one size one at a time and reads the counters after each answer; the
difference is that one request's compute time (input + infer + output of its batch), queue time and time inside the
server (``success``). So a server that logs nothing else still gives the distribution of its service time, not only
its mean. The counters are read once more until they show the request (a backend may report its statistics just
after the response), and a request whose difference holds another request or batch (someone else's traffic) is
left out.

Each request waits for the previous one's counters to be read (about a millisecond on the 2-core VM), so its batch
starts after that much idle time: the profile takes the shape of these samples and the mean of the back-to-back run
(:func:`~serving_bench.calibrate.estimators.paced_service`). The client is a plain blocking gRPC call
(:class:`~serving_bench.load.infer_channel.InferChannel`), not the load driver's sender, so its ways in and out
give their spread only (:func:`~serving_bench.calibrate.estimators.paced_ways`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
import numpy as np

from serving_bench.errors import ServerDied, ServerError
from serving_bench.load.infer_channel import InferChannel
from serving_bench.load.inputs import SampleBank, infer_request
from serving_bench.load.payloads import fetch_specs
from serving_bench.serve.control import Control, ModelTimes

SETTLE_S = 0.05  # how long the counters may take to show a request after its answer
MAX_REQUESTS = 2000  # a paced run's requests at most
SPIN_S = 0.0005  # the end of a quiet time is waited for by polling the clock


@dataclass(frozen=True)
class Paced:
    """One paced run of ``rows``-row requests of a model: per counted request its client ``latency_s``, from the
    counters its ``compute_s``, ``queue_s`` and ``success_s``, and the client's ``since_s`` (from the previous
    request's send, counted or not; the first: inf) and ``quiet_s`` (from the previous answer to its send; the
    first: inf), seconds each; ``skipped``: requests left out (their difference held other traffic, or the counters
    did not show them in time)."""

    rows: int
    latency_s: np.ndarray
    compute_s: np.ndarray
    queue_s: np.ndarray
    success_s: np.ndarray
    since_s: np.ndarray
    quiet_s: np.ndarray
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.latency_s)


def paced_run(url: str, model: str, rows: int, seconds: float, quiet_s: np.ndarray | None = None,
              timeout_s: float = 30.0) -> Paced:
    """Requests of ``rows`` rows to ``model`` at gRPC ``url``, one at a time for ``seconds`` (at most
    :data:`MAX_REQUESTS`), each counted from the statistics' difference around it (module docstring). With
    ``quiet_s`` (seconds), one request per value instead, each sent that long after the previous answer (or once
    the counters are read, if later): cold starts. A server that stops answering is :class:`ServerDied`."""
    spec = fetch_specs(url, [model], "profile measurement")[model]
    payload = infer_request(spec, SampleBank(spec, samples=1, seed=0).batch(0, rows))
    channel = InferChannel(url)
    quiet = np.zeros(MAX_REQUESTS) if quiet_s is None else np.asarray(quiet_s, dtype=float)[:MAX_REQUESTS]
    samples: list[tuple[float, ...]] = []
    skipped, sent, done = 0, -np.inf, -np.inf
    try:
        channel.ready(timeout_s)
        with Control(url) as control:
            channel.infer_blocking(payload, timeout_s)  # a warm-up, not counted
            before = control.model_times([model])[model]
            end = time.perf_counter() + (seconds if quiet_s is None else np.inf)
            for wait in quiet:
                quiet_until(done + wait)
                start = time.perf_counter()
                if start >= end:
                    break
                channel.infer_blocking(payload, timeout_s)
                since, sent, last, done = start - sent, start, done, time.perf_counter()
                after = settled(control, model, before)
                sample = one_request(after.minus(before), rows)
                if sample is None:
                    skipped += 1
                else:
                    samples.append((done - start, *sample, since, start - last))
                before = after
    except (grpc.RpcError, grpc.FutureTimeoutError, ServerError) as err:  # the server is gone or failing
        raise ServerDied(f"a paced run of {model} stopped: {type(err).__name__}: {err}") from err
    finally:
        channel.close()
    columns = np.array(samples, dtype=float).reshape(-1, 6).T
    return Paced(rows, *columns, skipped=skipped)


def quiet_until(t: float) -> None:
    """Return at ``perf_counter`` time ``t``: asleep until :data:`SPIN_S` before it (the host stays quiet), then
    polling the clock (a sleep's wake-up alone would add to the quiet time)."""
    while (left := t - time.perf_counter()) > 0:
        if left > SPIN_S:
            time.sleep(left - SPIN_S)


def settled(control: Control, model: str, before: ModelTimes) -> ModelTimes:
    """The counters once they show one more successful request than ``before`` (or after :data:`SETTLE_S`)."""
    deadline = time.perf_counter() + SETTLE_S
    while True:
        now = control.model_times([model])[model]
        if now.success[0] > before.success[0] or time.perf_counter() > deadline:
            return now
        time.sleep(0.0002)


def one_request(delta: ModelTimes, rows: int) -> tuple[float, float, float] | None:
    """(compute, queue, success) seconds of the one request a difference of the counters holds, where it holds
    exactly one request, executed alone in a batch of ``rows`` rows; else None."""
    if delta.success[0] != 1 or delta.executions != 1 or delta.executed(rows) != 1:
        return None
    return delta.compute_s(rows), delta.queue[1] * 1e-9, delta.success[1] * 1e-9
