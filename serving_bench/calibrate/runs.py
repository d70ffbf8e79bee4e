"""One measured run as the estimators see it (:class:`LoopRun`: latencies, send and completion times, the server's
statistics, the batches it executed) and how its requests are matched to the batches that served them. Triton's
request trace read as executed batches (:class:`Trace`) is the optional second source of those batches."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from serving_bench.errors import InputError
from serving_bench.profiles.distributions import Dist
from serving_bench.serve.control import ModelTimes
from serving_bench.serve.execution_log import Executions

MAX_SAMPLES = 2000  # samples kept per distribution (quantiles of more)


@dataclass
class LoopRun:
    """One run: per model its successful requests, in send order — client latency (s, from the intended time: open
    loop runs include the client's own send lateness, closed loop ones have none), and send and completion times
    (``perf_counter`` seconds, the clock of the runners' execution logs) — Triton's statistics for the run
    (``load.driver``'s per-model means), the run's ``perf_counter`` window and, where the server could say, the batches
    it executed in that window (runners' execution logs or Triton's trace; None: unknown); ``times``: per model the
    statistics extension's counters over the run (:class:`~serving_bench.serve.control.ModelTimes`: compute time per
    executed batch size, queue and success time per request), from any Triton; ``runner_cpu_s``: of ``cpu_s``, what
    the processes of the run's models' instances used (an external server on this machine whose instances run in
    processes of their own: the python backend), else None."""

    latency: dict[str, np.ndarray]
    stats: dict[str, dict]
    window: tuple[float, float]
    sent: dict[str, np.ndarray] = field(default_factory=dict)
    done: dict[str, np.ndarray] = field(default_factory=dict)
    executions: dict[str, Executions] | None = None  # the batches each model executed in the window, where known
    cpu_s: float | None = None  # CPU seconds the server, its stubs and the client used in the run, where known
    sender: str | None = None  # the load driver's sender that ran it (``native`` or ``python``), where known
    times: dict[str, ModelTimes] = field(default_factory=dict)  # the statistics' counters over the run, per model
    runner_cpu_s: float | None = None  # CPU seconds of the processes of its models' instances, where known apart

    def compute_s(self, model: str) -> float:
        """Triton's mean compute time per request in this run (input + infer + output), seconds."""
        s = self.stats.get(model) or {}
        return sum(s.get(f"compute_{p}_mean_s") or 0.0 for p in ("input", "infer", "output"))

    def batch_compute_s(self, model: str, rows: int) -> float:
        """Triton's mean compute time (s) of the run's executed batches of exactly ``rows`` rows (the statistics'
        counters over the run; batches the batcher merged from several requests are other sizes); 0 if none ran."""
        times = self.times.get(model)
        return (times.compute_s(rows) or 0.0) if times is not None else 0.0


class Trace:
    """Triton's request trace (``--trace-config level=TIMESTAMPS``), read as executed batches: an optional second
    source of what :mod:`serving_bench.serve.execution_log` records (off by default: see docs/serve.md#request-tracing-in-the-bundled-tritonserver-251)."""

    @staticmethod
    def load(path: Path) -> dict[str, Executions]:
        """Per model the executed batches of a Triton trace file (a JSON list of ``{"id", "model_name"}`` and
        ``{"id", "timestamps"}`` items): requests of one batch share its ``COMPUTE_START``; a batch ends at its
        requests' latest ``COMPUTE_END`` (seconds on ``perf_counter``'s clock)."""
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise InputError(path, None, f"cannot read Triton's trace: {err}") from None
        entries: dict[int, dict] = {}
        for item in raw:
            entry = entries.setdefault(item.get("id"), {})
            if "model_name" in item:
                entry["model"] = item["model_name"]
            for stamp in item.get("timestamps", ()):
                entry[stamp["name"]] = stamp["ns"] * 1e-9
        grouped: dict[str, list] = {}
        for entry in entries.values():
            if "model" in entry and "COMPUTE_START" in entry and "COMPUTE_END" in entry:
                grouped.setdefault(entry["model"], []).append((entry["COMPUTE_START"], entry["COMPUTE_END"]))
        out = {}
        for model, rows in grouped.items():
            arr = np.array(rows)
            starts, inverse, requests = np.unique(arr[:, 0], return_inverse=True, return_counts=True)
            ends = np.zeros(len(starts))
            np.maximum.at(ends, inverse, arr[:, 1])
            out[model] = Executions(starts, ends, np.full(len(starts), np.nan), np.zeros(len(starts), np.int32),
                                    requests.astype(np.int32), np.zeros(len(starts), np.int32), ("trace",))
        return out


def lone_wait_s(config, rows: int) -> float:
    """The queue delay the simulator imposes on a lone request of ``rows`` rows (Triton's dynamic batcher waits
    ``max_queue_delay`` unless the request alone reaches a preferred size or the largest one)."""
    if not config.HasField("dynamic_batching") or config.max_batch_size < 1:
        return 0.0
    db = config.dynamic_batching
    preferred = set(db.preferred_batch_size) or {config.max_batch_size}
    if rows in preferred or rows >= max(preferred):
        return 0.0
    return db.max_queue_delay_microseconds * 1e-6


def thin(samples: np.ndarray) -> Dist:
    samples = np.clip(np.asarray(samples, dtype=float), 1e-7, None)
    if len(samples) > MAX_SAMPLES:
        samples = np.quantile(samples, np.linspace(0, 1, MAX_SAMPLES))
    return Dist.from_samples(samples)


def batches_of(run: LoopRun, model: str) -> Executions | None:
    """The model's executed batches in the run (None when the server did not say or the requests' times are
    unknown)."""
    if run.executions is None or model not in run.sent:
        return None
    return run.executions.get(model, Executions.empty()).window(*run.window)


def served_by(run: LoopRun, batches: Executions, model: str) -> tuple[np.ndarray, Executions]:
    """For the requests of a one-at-a-time run: which were matched to a batch (mask over the run's requests) and, for
    each matched one, the batch that served it — the model's first batch that started after the request was sent,
    if it started before the answer came (a batch the batcher merged from two stalled requests serves both)."""
    sent, done = run.sent[model], run.done[model]
    j = np.searchsorted(batches.start_s, sent)
    matched = j < len(batches)
    matched[matched] = batches.start_s[j[matched]] <= done[matched]
    return matched, batches.select(j[matched])


def matched_batches(run: LoopRun, model: str, minimum: int) -> tuple[np.ndarray, Executions] | None:
    """:func:`served_by` on the model's logged batches of a one-at-a-time run, or None where the server did not log
    them or fewer than ``minimum`` requests were matched."""
    executed = batches_of(run, model)
    if executed is None:
        return None
    matched, batches = served_by(run, executed, model)
    return (matched, batches) if len(batches) >= minimum else None


def hop_s(run: LoopRun, batches: Executions, model: str) -> float:
    """What Triton counts as compute beyond what the runner logged (the shared-memory hop to the stub and back, on
    the instance's clock): Triton's mean compute per request of the run minus the logged mean, at least 0. Runs of
    one request per batch only (then Triton's per-request mean is its per-batch mean); 0 without statistics, and
    ~0 for batches read from Triton's own trace."""
    compute = run.compute_s(model)
    return max(compute - float(np.mean(batches.duration_s)), 0.0) if compute > 0 and len(batches) else 0.0
