"""The campaign's runs on the real tritonserver (``scripts/gpu_campaign.py``, docs/gpu.md "The GPU campaign"): closed
loops and open-loop replays through the project's load driver against the embedded server (python-backend runners:
each instance a process of its own), and instance counts changed by reloading the entries (explicit model control).

A run gives per entry the answered requests per second in its window, p50, p99 and mean latency (ms, from the
intended time), Triton's mean queue and compute time per request, the runners' executed batches (count, mean rows,
p50/p99 of their time) and the GPU's activity (:mod:`gpu_activity`). Its raw data go to the campaign's ``raw.npz``:
per entry every answered request's intended, send and answer time and every executed batch's start, end, CPU
seconds, rows, requests and instance (seconds from the run's start ``t0_s``, ``perf_counter``'s clock) — what the
profile's estimators read (:class:`serving_bench.calibrate.runs.LoopRun`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from gpu_activity import Activity
from serving_bench.load.driver import TritonTarget
from serving_bench.run.metrics import summarize
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop
from serving_bench.serve.control import Control

MAX_RATE_RPS = 20_000  # upper bound on one entry's closed-loop rate, to size its request pool


@dataclass(frozen=True)
class Window:
    """A closed loop's warm-up and measured window (s)."""

    warmup_s: float
    window_s: float

    @property
    def total_s(self) -> float:
        return self.warmup_s + self.window_s


def closed(server, loads: Mapping[str, tuple[int, int]], window: Window, label: str, **facts) -> tuple[dict, dict]:
    """A closed loop: entry -> (rows per request, requests in flight), all at once; (run, raw)."""
    rows = {m: r for m, (r, _) in loads.items()}
    schedule = Schedule.closed_loop(rows, int(MAX_RATE_RPS * window.total_s),
                                    {"duration_s": window.total_s, "warmup_s": window.warmup_s})
    target = TritonTarget(server, mode=ClosedLoop(concurrency={m: c for m, (_, c) in loads.items()},
                                                  duration_s=window.total_s))
    run = {"kind": "triton", "label": label, **facts, "rows": rows,
           "clients": {m: c for m, (_, c) in loads.items()}, "warmup_s": window.warmup_s,
           "window_s": window.window_s}
    return _collect(server, target, schedule, run, window.warmup_s, window.total_s)


def open_loop(server, rates: Mapping[str, float], seconds: float, seed: int, label: str, **facts) -> tuple[dict, dict]:
    """An open-loop replay: one-row requests at Poisson times of ``rates`` (req/s) for ``seconds`` — the schedule
    the simulator replays from the same rates and seed (``sim.interference.open_schedule``); (run, raw)."""
    from serving_bench.sim.interference import open_schedule  # the simulator's own schedule (imports the engine)

    rates = {m: round(r, 3) for m, r in rates.items()}  # as saved: the replay is drawn again from them
    run = {"kind": "triton", "label": label, **facts, "rates": rates, "seconds": seconds, "seed": seed,
           "rows": {m: 1 for m in rates}, "warmup_s": 0.0, "window_s": seconds}
    return _collect(server, TritonTarget(server), open_schedule(rates, seconds, seed), run, 0.0, seconds)


def at_times(server, entry: str, times: np.ndarray, label: str, **facts) -> tuple[dict, dict]:
    """One-row requests to ``entry`` at ``times`` (s from the run's start, increasing; open loop); (run, raw)."""
    seconds = float(times[-1]) + 0.5
    run = {"kind": "triton", "label": label, **facts, "rows": {entry: 1}, "warmup_s": 0.0, "window_s": seconds,
           "times": "at_times"}
    return _collect(server, TritonTarget(server), Schedule.at_times(times, entry, 1), run, 0.0, seconds)


def _collect(server, target: TritonTarget, schedule: Schedule, run: dict, warmup_s: float,
             total_s: float) -> tuple[dict, dict]:
    with Activity() as gpu:
        began = time.perf_counter()
        records = target.run(schedule)
        t0 = records.info.t0_s or began
        activity = gpu.summary(t0 + warmup_s, t0 + total_s)
    summary = summarize(records, warmup_s=warmup_s, duration_s=total_s)
    executions = server.executions() if getattr(server, "execution_log_dir", None) is not None else {}
    table = records.table
    run.update(t0_s=t0, partial=summary["partial"], stop_reason=records.info.stop_reason,
               sender=records.info.sender, gpu=activity, server_stats=dict(records.info.server_stats), models={})
    raw: dict[str, np.ndarray] = {}  # float32 seconds from t0 (a quarter microsecond's resolution over a minute)
    closed_loop = records.info.mode == "closed"
    for m in run["rows"]:
        ok = table[(table["model"].astype(str) == m) & (table["status"].astype(str) == "ok")].sort_values("sent_s")
        for column in ("sent_s", "done_s") if closed_loop else ("intended_s", "sent_s", "done_s"):
            raw[f"{m}/{column}"] = ok[column].to_numpy(np.float32)  # a closed loop's intended time is its send
    windowed = {}
    for m, batches in executions.items():  # every runner that executed (an ensemble's members and combiner too)
        batches = batches.window(t0 - 1.0, t0 + total_s + 5.0)
        if len(batches):
            windowed[m] = batches
            for name in ("start_s", "end_s"):
                raw[f"{m}/x_{name}"] = (getattr(batches, name) - t0).astype(np.float32)
            raw[f"{m}/x_cpu_s"] = batches.cpu_s.astype(np.float32)
            for name in ("rows", "requests", "instance"):
                raw[f"{m}/x_{name}"] = getattr(batches, name).astype(np.int16)
    for m in run["rows"]:
        batches = windowed.get(m)
        run["models"][m] = figures(summary["models"][m], run["server_stats"].get(m) or {},
                                   batches.window(t0 + warmup_s, t0 + total_s) if batches is not None else None)
    return run, raw


def figures(s: dict, stats: Mapping, batches) -> dict:
    """One entry's row of a run: its summary's throughput, latency (ms) and counts, Triton's mean queue and
    compute per request (ms) and the executed batches in the window."""
    compute = sum(stats.get(f"compute_{p}_mean_s") or 0.0 for p in ("input", "infer", "output"))
    out = {"throughput_rps": round(s["throughput_rps"], 2), "p50_ms": _ms(s["p50_s"]), "p99_ms": _ms(s["p99_s"]),
           "mean_ms": _ms(s["mean_s"]), **{k: s["counts"][k] for k in ("ok", "failed", "timeout")},
           "server_queue_ms": _ms(stats.get("queue_mean_s")), "server_compute_ms": _ms(compute or None)}
    if batches is not None and len(batches):
        duration = batches.duration_s * 1e3
        out.update(batches=len(batches), batch_rows_mean=round(float(batches.rows.mean()), 3),
                   batch_p50_ms=round(float(np.percentile(duration, 50)), 4),
                   batch_p99_ms=round(float(np.percentile(duration, 99)), 4),
                   batch_mean_ms=round(float(duration.mean()), 4))
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 4)


def reload_instances(server, entries: list[str], count: int) -> float:
    """Reload each entry with ``count`` instances (its served config otherwise as it is: explicit model control),
    the entries side by side (Triton loads different models in parallel); the seconds it took."""
    def reload(entry: str) -> None:
        with Control(server.endpoints.grpc_url, timeout_s=300.0) as control:
            config = control.model_config(entry)
            for group in config.instance_group:
                group.count = count
            control.load_model(entry, config)

    began = time.perf_counter()
    with ThreadPoolExecutor(len(entries)) as pool:
        list(pool.map(reload, entries))  # re-raises the first failure
    return time.perf_counter() - began


def say_run(run: dict) -> str:
    """A run's line: per entry req/s, p50 and p99, and the GPU's busy share and SMs active."""
    gpu = run.get("gpu") or {}
    busy = "".join(f", {k.split('_')[0]} {gpu[k]:.0f} %" for k in ("busy_pct", "sm_active_pct")
                   if gpu.get(k) is not None)
    return f"  {run['label']}: " + "; ".join(
        f"{n} {m['throughput_rps']:.1f} req/s p50 {m['p50_ms']} p99 {m['p99_ms']} ms"
        for n, m in run["models"].items()) + (f" (GPU{busy[1:]})" if busy else "")
