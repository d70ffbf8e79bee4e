"""Measure a profile on real Triton: service time per batch size, client/network overhead, the gap between batches,
the per-request cost inside a batch, and co-location curves (per model and per model pair).

Everything is driven closed-loop through the team's driver (``load.driver``) against the team's server
(``serve.server``); times come from Triton itself wherever it can say them, because the simulator models the *server*
and the client's own jitter on a busy machine must not leak into service times:

* **Server-side timestamps.** The embedded server runs with Triton's request tracing (``--trace-config
  level=TIMESTAMPS``, every request); its steady clock is ``CLOCK_MONOTONIC``, the clock of ``time.perf_counter``, so
  each closed-loop run's trace entries are the ones inside the run's time window. A batch's **service time** is
  ``COMPUTE_END - COMPUTE_START`` (what occupies the instance). Against an external server (``url``) there is no
  trace: service samples are then client latencies minus the mean overhead (their spread includes client jitter).
* **Service samples** per batch size ``b``: one run at concurrency 1 with requests of ``b`` rows.
* **Dispatch and overhead** (per request, not occupying the instance), from the ``b = 1`` run. *Dispatch*: inside
  Triton, from the request's arrival to its compute start (thread hand-offs: the batcher's and the instance's
  wake-ups), less the queue delay the simulator itself imposes on a lone request (``max_queue_delay`` unless the
  request alone is a preferred size); the simulator delays each request's arrival at the batcher by a draw.
  *Overhead*: client latency minus the time inside Triton (gRPC, network, the client; from the intended time, so
  in open-loop runs the client's own send lateness is part of it), added on the return path.
  One sample per request each (without a trace, one constant overhead covers both).
* **Cold starts** (``idle``): requests of one row sent one at a time with the instance idle ~2, 8, 32 and 64 ms
  between them (open loop, fixed spacing); the median service time, dispatch and overhead at each spacing minus those
  of the back-to-back run give how much a start after idle time costs (runtime threads parked, caches cold: on 2 cores an
  ONNX Runtime model computes twice as long after 16 ms idle as back to back). The simulator adds it per batch from
  the instance's idle time and per request from the time since the previous request.
* **Gap between batches** (``batch_gap_s``): with 3 requests of the largest size in flight on one instance, the time
  from a batch's ``COMPUTE_END`` to the next one's ``COMPUTE_START`` when that one was already queued (Triton's
  instance thread releasing a payload and taking the next) — median over the run; embedded server only.
* **Per-request cost inside a batch** (``per_request_s``): with dynamic batching, requests of one row at concurrency
  ``min(max_batch_size, 8)``; Triton's per-batch-size statistics (``batch_stats``) give the compute time of batches
  of n one-row requests; their slope over n minus the slope of the service time of one request of n rows is the
  cost of each extra request (clamped at 0).
* **Co-location curve** ``S(k)`` at batch sizes ``colocation_batches``: a server with ``max(colocation)`` instances of
  every model; per round, one run at concurrency 1 (one instance busy: ``t_1``) then one at concurrency k (``t_k``),
  both Triton's mean compute time of executed batches of exactly that size (``batch_stats``: with a queue delay the
  batcher merges concurrent requests, and a merged batch's longer time is not a co-location slowdown);
  ``S(k) = k t_1 / t_k`` per round, median over ``rounds`` rounds.
  Interleaving rounds makes the ratio immune to slow drift of a shared machine. A slowdown ``k / S - 1`` not larger
  than the solo time's own spread between rounds (at least 2 %) is not significant: then ``S(k) = k``. A model that
  does not slow down when co-located (``sleep``) must not be slowed by the simulator.
* **Pair curves**: for every two models on the same device, in the one-instance server, per round each alone at
  concurrency 1, then both together (concurrency 1 each): ``S_pair(2) = t_a1 / t_a2 + t_b1 / t_b2``, median over
  rounds, with the same significance rule; at batch 1 and at the largest batch size both allow.

Threads per instance are fixed for every server of a measurement (``threads``; default what the served
configuration gets: cores // all configured instances of the measured models) and recorded in the profile.
"""

from __future__ import annotations

import json
import platform
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from serving_bench.errors import InputError
from serving_bench.load.schedule import Schedule
from serving_bench.profiles.schema import (Curve, DeviceInfo, Dist, IdleEffect, ModelOnDevice, ModelProfile, PairCurve,
                                          Profile)

DEFAULT_SECONDS = 2.0
DEFAULT_ROUNDS = 3
MAX_SAMPLES = 2000
MIN_SIGNIFICANT = 0.02  # a co-location slowdown below 2 % is never taken as real
PER_REQUEST_CONCURRENCY = 8
GAP_CONCURRENCY = 3
IDLE_GAPS_S = (0.002, 0.008, 0.032, 0.064)  # idle time between spaced requests for the cold-start measurement
IDLE_COUNT = 25  # requests per spacing
TRACE_ARGS = ("--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1", "--trace-config",
              "triton,log-frequency=0")


def default_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to and including ``max_batch_size`` (just 1 without batching)."""
    if max_batch_size <= 1:
        return [1]
    sizes = [1]
    while sizes[-1] * 2 < max_batch_size:
        sizes.append(sizes[-1] * 2)
    return sizes + [max_batch_size]


# -- running closed loops ----------------------------------------------------------------------------------------------

@dataclass
class LoopRun:
    """One run: per model its successful requests' client latency (s, from the intended time, in send order: open
    loop runs include the client's own send lateness, closed loop ones have none), Triton's statistics for the run
    (``load.driver``'s per-model means) and the run's ``perf_counter`` window."""

    latency: dict[str, np.ndarray]
    stats: dict[str, dict]
    window: tuple[float, float]

    def compute_s(self, model: str) -> float:
        """Triton's mean compute time per request in this run (input + infer + output), seconds."""
        s = self.stats.get(model) or {}
        return sum(s.get(f"compute_{p}_mean_s") or 0.0 for p in ("input", "infer", "output"))


class Session:
    """A server under measurement (``endpoints``; ``trace``: its trace file, or None for an external server)."""

    def __init__(self, endpoints, trace: Path | None = None):
        self.endpoints = endpoints
        self.trace = trace
        self.url = endpoints.grpc_url

    def run(self, loads: Mapping[str, tuple[int, int]], seconds: float) -> LoopRun:
        """Closed loop for ``seconds``: model -> (rows per request, concurrency), all models at once. A run that
        got fewer than 5 answers per model (a stalled shared machine) is repeated once, twice as long."""
        from serving_bench.load.driver import ClosedLoop, TritonTarget

        names = tuple(loads)
        per = 100_000
        n = per * len(names)
        model = np.repeat(np.arange(len(names), dtype=np.int32), per)
        batch = np.repeat(np.array([loads[m][0] for m in names], dtype=np.int32), per)
        for attempt in (1, 2):
            schedule = Schedule(np.zeros(n), model, names, np.zeros(n, dtype=np.int32), batch,
                                {"duration_s": seconds * attempt})
            target = TritonTarget(self.endpoints, source="profile measurement",
                                  mode=ClosedLoop(concurrency={m: loads[m][1] for m in names},
                                                  duration_s=seconds * attempt))
            try:
                return self._collect(target, schedule, {m: loads[m][0] for m in names})
            except InputError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def spaced(self, model: str, rows: int, period: float, count: int) -> LoopRun:
        """Open loop: ``count`` requests of ``rows`` rows, one every ``period`` seconds (the instance idles between
        them when ``period`` exceeds the latency)."""
        from serving_bench.load.driver import TritonTarget

        times = np.arange(count) * period
        schedule = Schedule(times, np.zeros(count, dtype=np.int32), (model,), np.zeros(count, dtype=np.int32),
                            np.full(count, rows, dtype=np.int32), {"duration_s": float(count * period)})
        return self._collect(TritonTarget(self.endpoints, source="profile measurement"), schedule, {model: rows})

    def _collect(self, target, schedule: Schedule, rows_of: Mapping[str, int]) -> LoopRun:
        names = tuple(rows_of)
        start = time.perf_counter()
        records = target.run(schedule)
        end = time.perf_counter()
        latency = {}
        for m in names:
            rows = records[(records["model"].astype(str) == m) & (records["status"].astype(str) == "ok")]
            if len(rows) < 5:
                bad = records[(records["model"].astype(str) == m) & (records["status"].astype(str) != "ok")]
                why = (f"{bad['status'].astype(str).iloc[0]}: {bad['error'].astype(str).iloc[0]}" if len(bad)
                       else "no more requests were answered in the run's time")
                raise InputError("profile measurement", m, f"only {len(rows)} requests of {rows_of[m]} rows "
                                 f"succeeded ({why})")
            rows = rows.sort_values("sent_s")
            latency[m] = (rows["done_s"] - rows["intended_s"]).to_numpy()  # closed loop: intended = sent
        return LoopRun(latency, records.attrs.get("server_stats") or {}, (start, end))

    def execution_time(self, model: str, rows: int, concurrency: int, seconds: float) -> float:
        """Mean compute time (s) of the executed batches of exactly ``rows`` rows in a closed loop of ``rows``-row
        requests at ``concurrency`` (Triton's per-batch-size statistics: batches the batcher merged from several
        requests do not count; 0 if none ran)."""
        before = self.batch_stats([model])[model]
        self.run({model: (rows, concurrency)}, seconds)
        count, ns = self.batch_stats([model])[model].get(rows, (0, 0))
        count, ns = count - before.get(rows, (0, 0))[0], ns - before.get(rows, (0, 0))[1]
        return ns * 1e-9 / count if count > 0 else 0.0

    def batch_stats(self, models: Sequence[str]) -> dict[str, dict[int, tuple[int, int]]]:
        """Triton's cumulative per-batch-size statistics: model -> executed batch size -> (executions, compute ns)."""
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.url)
        try:
            out = {}
            for name in models:
                stats = client.get_inference_statistics(name)
                rows = {}
                for s in stats.model_stats:
                    for b in s.batch_stats:
                        ns = b.compute_input.ns + b.compute_infer.ns + b.compute_output.ns
                        rows[int(b.batch_size)] = (int(b.compute_infer.count), int(ns))
                out[name] = rows
            return out
        finally:
            client.close()


@dataclass
class Trace:
    """Triton's per-request timestamps (seconds on ``perf_counter``'s clock), per model, in request order."""

    by_model: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> "Trace":
        """Parse a Triton trace file (a JSON list of ``{"id", "model_name"}`` and ``{"id", "timestamps"}`` items)."""
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
        keys = ("REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END")
        grouped: dict[str, list] = {}
        for entry in entries.values():
            if "model" in entry and all(k in entry for k in keys):
                grouped.setdefault(entry["model"], []).append(tuple(entry[k] for k in keys))
        out = {}
        for model, rows in grouped.items():
            arr = np.array(sorted(rows))
            out[model] = {k: arr[:, i] for i, k in enumerate(keys)}
        return cls(out)

    def window(self, model: str, window: tuple[float, float]) -> dict[str, np.ndarray]:
        """The model's requests that started inside ``window``."""
        rows = self.by_model.get(model)
        if rows is None:
            return {k: np.zeros(0) for k in ("REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END")}
        sel = (rows["REQUEST_START"] >= window[0]) & (rows["REQUEST_START"] <= window[1])
        return {k: v[sel] for k, v in rows.items()}


def _batches(rows: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Executed batches of a trace window: (compute start, compute end, earliest queue start), by start time.
    Requests of one batch share its compute timestamps."""
    if not len(rows["COMPUTE_START"]):
        return np.zeros(0), np.zeros(0), np.zeros(0)
    starts, inverse = np.unique(rows["COMPUTE_START"], return_inverse=True)
    ends = np.zeros(len(starts))
    queued = np.full(len(starts), np.inf)
    np.maximum.at(ends, inverse, rows["COMPUTE_END"])
    np.minimum.at(queued, inverse, rows["QUEUE_START"])
    return starts, ends, queued


# -- what each measurement yields --------------------------------------------------------------------------------------

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


def _thin(samples: np.ndarray) -> Dist:
    samples = np.clip(np.asarray(samples, dtype=float), 1e-7, None)
    if len(samples) > MAX_SAMPLES:
        samples = np.quantile(samples, np.linspace(0, 1, MAX_SAMPLES))
    return Dist.from_samples(samples)


def service_and_overhead(run: LoopRun, trace: Trace | None, model: str, wait_s: float,
                         overhead: float | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Service samples of a concurrency-1 run and, with a trace, per-request overhead and dispatch samples.

    With a trace (requests matched in order: at concurrency 1 they run one after another; the driver's warm-up
    request precedes the run's): service = the batches' compute durations; dispatch = time from the request reaching
    Triton to its compute start, less ``wait_s`` (the batcher's own delay, which the simulator models); overhead =
    client latency - time inside Triton. Without: service = latency - ``overhead`` - ``wait_s`` (``overhead`` given)
    or, if None, latency - (mean latency - Triton's mean compute), the overhead being that constant mean and the
    dispatch part of it."""
    latency = run.latency[model]
    if trace is not None:
        rows = trace.window(model, run.window)
        if len(rows["COMPUTE_START"]) >= len(latency) >= 5:
            rows = {k: v[-len(latency):] for k, v in rows.items()}
            compute = rows["COMPUTE_END"] - rows["COMPUTE_START"]
            dispatch = np.clip(rows["COMPUTE_START"] - rows["REQUEST_START"] - wait_s, 0.0, None)
            return compute, latency - (rows["COMPUTE_END"] - rows["REQUEST_START"]), dispatch
    compute = run.compute_s(model)
    if overhead is None:
        overhead = max(float(latency.mean()) - compute - wait_s, 0.0) if compute > 0 else 0.0
        return latency - overhead - wait_s, np.array([overhead]), None
    return latency - overhead - wait_s, None, None


def batch_gap(run: LoopRun, trace: Trace, model: str) -> tuple[float, int]:
    """Median gap (s) between a batch's end and the next one's start on a busy single instance, and how many
    transitions it is the median of (only those where the next batch was already queued when the previous ended).
    The median: on a shared machine a few stalls of milliseconds dominate the mean of a short run (a mean of 350 us
    against a median of 100 us was seen), and the service samples already carry the machine's stalls; on a quiet
    machine mean and median agree."""
    starts, ends, queued = _batches(trace.window(model, run.window))
    if len(starts) < 3:
        return 0.0, 0
    waiting = queued[1:] < ends[:-1]
    gaps = (starts[1:] - ends[:-1])[waiting]
    gaps = gaps[gaps >= 0]
    return (float(np.median(gaps)), len(gaps)) if len(gaps) else (0.0, 0)


def per_request_cost(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
                     service_mean: Callable[[int], float | None]) -> tuple[float, int]:
    """Per-request cost from batches of n one-row requests (``batch_stats`` deltas of one run): the slope of their
    compute time over n, minus the slope of the service time of *one* request of n rows over the same sizes (both
    weighted least squares, weights = executions). Slopes, not levels, so a machine that is uniformly slower during
    this run than during the service measurement does not pass for a per-request cost. Clamped at 0. Returns
    (seconds, executions of n >= 2 it rests on); 0 when fewer than two sizes were executed."""
    ns, ts, ss, ws = [], [], [], []
    for n, (count, total) in after.items():
        c0, t0 = before.get(n, (0, 0))
        count, total = count - c0, total - t0
        s = service_mean(n)
        if count <= 0 or s is None:
            continue
        ns.append(n)
        ts.append(total * 1e-9 / count)
        ss.append(s)
        ws.append(count)
    if len(ns) < 2:
        return 0.0, 0
    n, w = np.array(ns, dtype=float), np.array(ws, dtype=float)
    centred = n - np.average(n, weights=w)
    den = float(np.sum(w * centred ** 2))
    slope_multi = float(np.sum(w * centred * np.array(ts))) / den
    slope_solo = float(np.sum(w * centred * np.array(ss))) / den
    return max(slope_multi - slope_solo, 0.0), int(sum(c for m, c in zip(ns, ws) if m >= 2))


def _medians(run: LoopRun, trace: Trace | None, model: str,
             wait_s: float) -> tuple[float, float, float, float | None]:
    """(median service, median overhead, median dispatch, median instance idle before a batch or None) of a
    one-at-a-time run (see :func:`service_and_overhead`). Requests the batcher merged anyway (a stall made them
    overlap) count as one batch: the service is that of single-request batches, the idle time the one between
    consecutive batches. Without a trace the dispatch is part of the overhead (0)."""
    latency = run.latency[model]
    if trace is not None:
        rows = trace.window(model, run.window)
        if len(rows["COMPUTE_START"]) >= len(latency) >= 3:
            rows = {k: v[-len(latency):] for k, v in rows.items()}
            starts, ends, _ = _batches(rows)
            _, counts = np.unique(rows["COMPUTE_START"], return_counts=True)
            single = (ends - starts)[counts == 1]
            idle = np.clip(starts[1:] - ends[:-1], 0.0, None)
            dispatch = np.clip(rows["COMPUTE_START"] - rows["REQUEST_START"] - wait_s, 0.0, None)
            return (float(np.median(single if len(single) else ends - starts)),
                    float(np.median(latency - (rows["COMPUTE_END"] - rows["REQUEST_START"]))),
                    float(np.median(dispatch)), float(np.median(idle)) if len(idle) else None)
    compute = run.compute_s(model)
    return compute, float(np.median(latency)) - compute - wait_s, 0.0, None


def idle_effect(runs: Mapping, trace: Trace | None, model: str, wait_s: float) -> IdleEffect | None:
    """The cold-start extras (:class:`IdleEffect`) from the back-to-back run at batch 1 (the hot reference) and the
    spaced runs: per spacing, median service and overhead minus the hot medians (at least 0, and never smaller
    after a longer idle: a longer idle cannot make a start warmer). The service's x is the instance's median idle
    time from the trace (without one: the spacing minus the hot latency); the overhead's x is the spacing."""
    hot_run = runs[(model, "solo", 1)]
    hot_service, hot_overhead, hot_dispatch, hot_idle = _medians(hot_run, trace, model, wait_s)
    hot_latency = float(np.mean(hot_run.latency[model]))
    points = sorted(k[2] for k in runs if k[0] == model and k[1] == "idle")
    if not points:
        return None
    s_x, s_y = [hot_idle if hot_idle is not None else 0.0], [0.0]
    o_x, o_y, d_y = [hot_latency], [0.0], [0.0]
    for g in points:
        run = runs[(model, "idle", g)]
        service, overhead, dispatch, idle = _medians(run, trace, model, wait_s)
        period = g + hot_latency
        s_x.append(idle if idle is not None else max(period - hot_latency, 0.0))
        s_y.append(max(service - hot_service, 0.0))
        o_x.append(period)
        o_y.append(max(overhead - hot_overhead, 0.0))
        d_y.append(max(dispatch - hot_dispatch, 0.0))

    def monotone(xs, ys):
        order = np.argsort(xs, kind="stable")
        xs, ys = np.asarray(xs)[order], np.maximum.accumulate(np.asarray(ys)[order])
        keep = np.concatenate([[True], np.diff(xs) > 0])
        return tuple(float(x) for x in xs[keep]), tuple(float(y) for y in ys[keep])

    (sx, sy), (ox, oy), (_, dy) = monotone(s_x, s_y), monotone(o_x, o_y), monotone(o_x, d_y)
    return IdleEffect(sx, sy, ox, oy, dy if trace is not None else ())


def significant_speedup(k: float, per_round: Sequence[float], solo: Sequence[float]) -> tuple[float, str]:
    """The co-location speed-up at ``k`` from per-round ratios, with the significance rule of the module docstring.
    Returns (S, a note on how it was decided)."""
    s = float(np.median(per_round))
    s = min(s, k)
    spread = (max(solo) - min(solo)) / float(np.median(solo)) if len(solo) > 1 and np.median(solo) > 0 else 0.0
    floor = max(spread, MIN_SIGNIFICANT)
    slowdown = k / s - 1.0
    if slowdown <= floor:
        return k, f"slowdown {slowdown * 100:.1f} % within noise {floor * 100:.1f} %: S = k"
    return s, f"slowdown {slowdown * 100:.1f} % (noise {floor * 100:.1f} %)"


# -- the measurement ---------------------------------------------------------------------------------------------------

@dataclass
class _ModelResult:
    device: str
    config: object
    batches: dict[int, Dist] = field(default_factory=dict)
    overhead: Dist | None = None
    gap_s: float = 0.0
    per_request_s: float = 0.0
    curves: list[Curve] = field(default_factory=list)
    idle: IdleEffect | None = None
    dispatch: Dist | None = None


def _device_of(config) -> str:
    from serving_bench.serving_config import model_serving_from_config

    return model_serving_from_config(config).instances[0][0]


def measure_profile(repo: str | Path, models: Sequence[str], out_path: str | Path | None = None, *,
                    batch_sizes: Sequence[int] | None = None, colocation: Sequence[int] = (1, 2, 4),
                    colocation_batches: Sequence[int] | None = None, pairs: bool = True,
                    seconds: float = DEFAULT_SECONDS, rounds: int = DEFAULT_ROUNDS, threads: int | None = None,
                    url: str | None = None, log: Callable[[str], None] | None = None) -> Profile:
    """Measure ``models`` of ``repo`` on the embedded server (or the external one at ``url``); save to
    ``out_path``. ``colocation``: instance counts for S(k) (k > 1 measured); ``colocation_batches``: batch sizes of
    the curves (default 1 and the largest measured); ``pairs``: measure pair curves; ``rounds``: interleaved rounds
    per curve point; ``threads``: threads per instance (embedded server)."""
    from serving_bench.export.repository import CONFIG_NAME, entry_dir, read_config
    from serving_bench.serve.runners import cpu_cores, default_threads
    from serving_bench.serve.server import Endpoints, TritonServer

    log = log or (lambda _msg: None)
    repo = Path(repo)
    if rounds < 1:
        raise InputError("--rounds", str(rounds), "expected an integer >= 1")
    configs = {m: read_config(entry_dir(repo, m) / CONFIG_NAME) for m in models}
    for m, config in configs.items():
        if config.platform == "ensemble":
            raise InputError("--models", m, "an ensemble is simulated from its members; profile the members")
    cores = cpu_cores()
    if threads is None:
        threads = default_threads(sum(max(sum(g.count or 1 for g in c.instance_group), 1) for c in configs.values()))
    results = {m: _ModelResult(_device_of(c), c) for m, c in configs.items()}
    sizes = {}
    for m, config in configs.items():
        wanted = list(batch_sizes) if batch_sizes else default_batch_sizes(config.max_batch_size)
        sizes[m] = sorted({b for b in wanted if b <= max(config.max_batch_size, 1)} | {1})
    ks = sorted({int(k) for k in colocation if k > 1})
    pair_list = [(a, b) for i, a in enumerate(models) for b in models[i + 1:]
                 if pairs and results[a].device == results[b].device]
    pair_points: dict[tuple[str, str, int], list[float]] = {}
    solo_pair: dict[tuple[str, int], list[float]] = {}
    notes = [f"closed loop, {seconds:g} s per point, {rounds} interleaved rounds per co-location point; "
             f"{threads} thread(s) per instance"]

    # -- phase 1: one instance per model ---------------------------------------------------------------------------
    def phase1(session: Session) -> dict:
        runs: dict = {}
        for m in models:
            config = configs[m]
            for b in sizes[m]:
                runs[(m, "solo", b)] = session.run({m: (b, 1)}, seconds)
                log(f"{m}: batch {b}: {len(runs[(m, 'solo', b)].latency[m])} requests, server compute "
                    f"{runs[(m, 'solo', b)].compute_s(m) * 1e3:.3f} ms")
            hot = runs[(m, "solo", 1)].latency[m]
            for g in IDLE_GAPS_S:
                runs[(m, "idle", g)] = session.spaced(m, 1, g + float(np.mean(hot)), IDLE_COUNT)
            if session.trace is not None:
                runs[(m, "gap")] = session.run({m: (sizes[m][-1], GAP_CONCURRENCY)}, max(seconds / 2, 0.5))
            if config.HasField("dynamic_batching") and config.max_batch_size > 1:
                before = session.batch_stats([m])[m]
                session.run({m: (1, min(config.max_batch_size, PER_REQUEST_CONCURRENCY))}, seconds)
                runs[(m, "per_request")] = (before, session.batch_stats([m])[m])
        for a, b in pair_list:
            for pb in sorted({1, min(sizes[a][-1], sizes[b][-1])}):
                for _ in range(rounds):
                    alone_a = session.run({a: (pb, 1)}, seconds / 2).compute_s(a)
                    alone_b = session.run({b: (pb, 1)}, seconds / 2).compute_s(b)
                    both = session.run({a: (pb, 1), b: (pb, 1)}, seconds / 2)
                    if min(alone_a, alone_b, both.compute_s(a), both.compute_s(b)) > 0:
                        pair_points.setdefault((a, b, pb), []).append(
                            alone_a / both.compute_s(a) + alone_b / both.compute_s(b))
                        solo_pair.setdefault((a, pb), []).append(alone_a)
                        solo_pair.setdefault((b, pb), []).append(alone_b)
        return runs

    trace_file = None
    if url:
        threads = 1
        notes[0] = notes[0].replace("thread(s) per instance", "thread(s) per instance recorded (the external server's "
                                    "own setting applies)")
        session = Session(Endpoints.from_url(url))
        runs = phase1(session)
        trace = None
        notes.append(f"external server {url}: no request trace, so service samples are client latency - mean "
                     "overhead and the gap between batches is not measured")
    else:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="serving-bench-profile-") as tmp:
            trace_file = Path(tmp) / "trace.json"
            with TritonServer(repo, models=list(models), instances={m: 1 for m in models},
                              threads_per_instance=threads,
                              extra_args=TRACE_ARGS + ("--trace-config", f"triton,file={trace_file}")) as server:
                runs = phase1(Session(server.endpoints, trace_file))
            try:
                trace = Trace.load(trace_file)
            except InputError as err:  # a server built without tracing: measure from the client side instead
                trace = None
                notes.append(f"no request trace ({err.line()}): service samples are client latency - mean overhead")
                log(f"note: {notes[-1]}")
            if trace is not None and not trace.by_model:
                trace = None
                notes.append("the request trace was empty: service samples are client latency - mean overhead")
                log(f"note: {notes[-1]}")

    for m in models:
        r = results[m]
        config = configs[m]
        overhead_mean = None
        for b in sizes[m]:
            run = runs[(m, "solo", b)]
            service, over, dispatch = service_and_overhead(run, trace, m, lone_wait_s(config, b), overhead_mean)
            if b == sizes[m][0]:
                r.overhead = _thin(np.clip(over, 0.0, None)) if over is not None else Dist.constant(0.0)
                r.dispatch = _thin(dispatch) if dispatch is not None else None
                overhead_mean = r.overhead.mean + (r.dispatch.mean if r.dispatch is not None else 0.0)
            r.batches[b] = _thin(service)
            log(f"{m}: batch {b}: service mean {r.batches[b].mean * 1e3:.3f} ms, p99 "
                f"{r.batches[b].quantile(0.99) * 1e3:.3f} ms" + (
                    f"; overhead mean {r.overhead.mean * 1e3:.3f} ms, dispatch mean "
                    f"{r.dispatch.mean * 1e3:.3f} ms" if b == sizes[m][0] and r.dispatch is not None else ""))
        if (m, "gap") in runs and trace is not None:
            r.gap_s, count = batch_gap(runs[(m, "gap")], trace, m)
            log(f"{m}: gap between batches on a busy instance {r.gap_s * 1e6:.0f} us (median of {count})")
        if (m, "per_request") in runs:
            md = ModelOnDevice("n/a", r.batches)

            def service_mean(n, md=md):
                try:
                    return md.service(n).mean
                except KeyError:
                    return None

            before, after = runs[(m, "per_request")]
            r.per_request_s, used = per_request_cost(before, after, service_mean)
            log(f"{m}: per-request cost inside a batch {r.per_request_s * 1e6:.0f} us (from {used} batches of 2+ "
                "requests)")

        r.idle = idle_effect(runs, trace, m, lone_wait_s(config, 1))
        if r.idle is not None:
            log(f"{m}: cold start: service +" + ", +".join(
                f"{e * 1e6:.0f} us after {i * 1e3:.1f} ms idle" for i, e in zip(r.idle.service_idle_s,
                                                                              r.idle.service_extra_s)) +
                "; overhead +" + ", +".join(f"{e * 1e6:.0f} us after a {g * 1e3:.1f} ms gap"
                                            for g, e in zip(r.idle.overhead_gap_s, r.idle.overhead_extra_s)))

    # -- phase 2: co-location curves -------------------------------------------------------------------------------
    if ks:
        def phase2(session: Session, available: Mapping[str, int]) -> None:
            for m in models:
                usable = [k for k in ks if k <= available.get(m, 1)]
                cb = sorted({b for b in (colocation_batches or (1, sizes[m][-1])) if b <= sizes[m][-1]})
                for b in cb if usable else ():
                    solo, ratios = [], {k: [] for k in usable}
                    for _ in range(rounds):
                        t1 = session.execution_time(m, b, 1, seconds / 2)
                        solo.append(t1)
                        for k in usable:
                            tk = session.execution_time(m, b, k, seconds / 2)
                            if t1 > 0 and tk > 0:
                                ratios[k].append(k * t1 / tk)
                    points = [(1.0, 1.0)]
                    for k in usable:
                        if ratios[k]:
                            s, why = significant_speedup(float(k), ratios[k], solo)
                            points.append((float(k), s))
                            log(f"{m}: batch {b}: {k} batches at once: S({k}) = {s:.2f} "
                                f"(rounds {', '.join(f'{x:.2f}' for x in ratios[k])}; {why})")
                    if len(points) > 1:
                        results[m].curves.append(Curve(b, tuple(k for k, _ in points), tuple(s for _, s in points)))

        kmax = max(ks)
        if url:
            from serving_bench.serving_config import model_serving_from_config

            phase2(session, {m: model_serving_from_config(configs[m]).instance_count for m in models})
        else:
            with TritonServer(repo, models=list(models), instances={m: kmax for m in models},
                              threads_per_instance=threads) as server:
                phase2(Session(server.endpoints), {m: kmax for m in models})

    pair_curves = []
    for (a, b, pb), values in sorted(pair_points.items()):
        s, why = significant_speedup(2.0, values, solo_pair[(a, pb)] + solo_pair[(b, pb)])
        log(f"{a} + {b}: batch {pb}: one batch of each at once: S_pair(2) = {s:.2f} "
            f"(rounds {', '.join(f'{x:.2f}' for x in values)}; {why})")
        pair_curves.append(PairCurve(results[a].device, (a, b), Curve(pb, (1.0, 2.0), (1.0, s))))

    profiles = {}
    for m in models:
        r = results[m]
        md = ModelOnDevice(_mode_of(r.config), r.batches, tuple(sorted(r.curves, key=lambda c: c.batch)), threads,
                           r.per_request_s, None, r.gap_s, r.idle)
        profiles[m] = ModelProfile(m, r.config.platform or r.config.backend, "fp32", {r.device: md}, r.overhead,
                                   r.dispatch)
    devices = {}
    for d in sorted({r.device for r in results.values()}):
        if d == "cpu":
            devices[d] = DeviceInfo(d, "cpu", platform.processor() or platform.machine(), cores=cores)
        else:
            devices[d] = DeviceInfo(d, "gpu", _gpu_name(int(d[3:]) if d[3:].isdigit() else 0))
    overall = Dist.constant(float(np.mean([profiles[m].overhead.mean for m in models])))
    where = url or "embedded tritonserver"
    profile = Profile(devices, profiles, overall, tuple(pair_curves),
                      host={"hostname": socket.gethostname(), "cpu": platform.processor() or platform.machine(),
                            "cores": cores, "os": platform.platform(), "server": where},
                      source=f"measured on {where} from {repo}",
                      created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      notes=tuple(notes + ["service = Triton's compute time per batch (request trace)" if trace
                                           else "service = client latency - mean overhead"]))
    if out_path is not None:
        profile.save(out_path)
    return profile


def _gpu_name(index: int) -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no NVML here: the name is only informative
        return ""


def _mode_of(config) -> str:
    params = {k: v.string_value for k, v in config.parameters.items()}
    if params.get("cuda_graphs", "").lower() in ("1", "true", "yes"):
        return "cuda_graphs"
    if config.platform == "tensorrt_plan":
        return "tensorrt"
    if config.platform in ("pytorch_libtorch",) or config.backend == "pytorch":
        return "eager"
    return "n/a"
