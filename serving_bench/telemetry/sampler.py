"""``Telemetry``: samples Triton ``/metrics``, NVML and psutil in a background thread during a run.

    with Telemetry(server.endpoints.metrics_url, pid=server.process.pid) as tel:
        ...  # the run
    tel.frame()      # long table t_s, source, metric, model, value
    tel.summary()    # dict: GPU/CPU utilisation, memory peaks, per-model batch size and queue vs compute time
    tel.save(out_dir)

``t_s`` is seconds since ``t0`` (a ``time.perf_counter()`` value; default: when sampling starts), so a caller can
align telemetry with its own records by passing its run's start. One tick is taken on entry (the baseline every
per-model difference starts from) and one on exit, plus one every ``interval_s`` in between.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pandas as pd

from serving_bench.errors import ServerError
from serving_bench.files import atomic_write
from serving_bench.telemetry import triton
from serving_bench.telemetry.cpu import CpuSampler, process_tree, summarize_cpu
from serving_bench.telemetry.gpu import GpuSampler, summarize_gpu
from serving_bench.telemetry.rows import COLUMNS


class Telemetry:
    """Background sampler. ``metrics_url``: the server's metrics ``host:port`` (or a URL; None: no Triton rows).
    ``pid``: the local server's process id, to measure its process tree (None for an external server).
    ``gpu`` / ``cpu``: whether to sample NVML / psutil. ``interval_s``: seconds between ticks."""

    def __init__(self, metrics_url: str | None, interval_s: float = 0.5, *, gpu: bool = True, cpu: bool = True,
                 pid: int | None = None, t0: float | None = None):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.metrics_url = metrics_url
        self.interval_s = float(interval_s)
        self.want_gpu, self.want_cpu = gpu, cpu
        self.pid = pid
        self.t0 = t0
        self.t0_unix: float | None = None
        self.ticks = 0
        self.errors: dict[str, int] = {}
        self.last_error: dict[str, str] = {}
        self._rows: list[tuple] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samplers: list = []
        self._gpu: GpuSampler | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def __enter__(self) -> "Telemetry":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Telemetry":
        """Take the baseline tick and start the thread; a metrics endpoint that cannot be read is a ServerError."""
        if self.t0 is None:
            self.t0 = time.perf_counter()
        self.t0_unix = time.time() - (time.perf_counter() - self.t0)
        self._samplers = []
        if self.metrics_url:
            sampler = triton.TritonSampler(self.metrics_url)
            try:
                sampler.sample()
            except OSError as err:
                raise ServerError(f"cannot read Triton metrics at {self.metrics_url}: {err}") from None
            self._samplers.append(sampler)
        if self.want_cpu:
            self._samplers.append(CpuSampler())
        if self.want_gpu:
            self._gpu = GpuSampler()
            self._samplers.append(self._gpu)
        self._tick()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take the final tick and stop the thread (idempotent)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._tick()
        if self._gpu is not None:
            self._gpu.close()

    def _loop(self) -> None:
        next_at = time.perf_counter() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.perf_counter())):
            self._tick()
            next_at += self.interval_s
            if next_at < time.perf_counter():  # fell behind (busy machine): skip, do not burst
                next_at = time.perf_counter() + self.interval_s

    def _tick(self) -> None:
        procs = process_tree(self.pid)
        t_s = time.perf_counter() - self.t0
        rows = []
        for sampler in self._samplers:
            try:
                rows += [(t_s, *row) for row in sampler.sample(procs)]
            except Exception as err:  # noqa: BLE001 - a dead server or driver hiccup must not kill the sampler
                name = type(sampler).__name__
                self.errors[name] = self.errors.get(name, 0) + 1
                self.last_error[name] = f"{type(err).__name__}: {err}"
        with self._lock:
            self._rows += rows
            self.ticks += 1

    # -- results ---------------------------------------------------------------------------------------------------
    def raw_frame(self) -> pd.DataFrame:
        """The sampled rows only (cumulative Triton counters as scraped)."""
        with self._lock:
            rows = list(self._rows)
        frame = pd.DataFrame(rows, columns=list(COLUMNS))
        return frame.astype({"t_s": float, "value": float})

    def frame(self, start_s: float | None = None, end_s: float | None = None) -> pd.DataFrame:
        """Long table ``t_s, source, metric, model, value``: the sampled rows plus per-interval Triton rates
        (:func:`~serving_bench.telemetry.triton.interval_rows`), sorted by time; optionally only ticks in
        ``[start_s, end_s]``."""
        raw = _window(self.raw_frame(), start_s, end_s)
        frame = pd.concat([raw, triton.interval_rows(raw)], ignore_index=True)
        return frame.sort_values(["t_s", "source", "metric", "model"], kind="stable", ignore_index=True)

    def summary(self, start_s: float | None = None, end_s: float | None = None) -> dict:
        """Figures over the ticks in ``[start_s, end_s]`` (all by default). Keys: ``cpu`` (utilisation mean/peak in
        percent, memory peaks in bytes), ``gpu`` (``available``, ``reason``, utilisation, memory, power, per device),
        ``models`` (per Triton model: requests, ``mean_batch``, ``queue_s_mean`` vs ``compute_s_mean`` per request),
        and sampling facts (``interval_s``, ``ticks``, ``duration_s``, ``errors``)."""
        raw = _window(self.raw_frame(), start_s, end_s)
        times = raw["t_s"].unique()
        out = {
            "interval_s": self.interval_s,
            "ticks": int(len(times)),
            "duration_s": float(times.max() - times.min()) if len(times) else 0.0,
            "t0_unix": self.t0_unix,
            "metrics_url": self.metrics_url,
            "errors": {name: {"count": n, "last": self.last_error.get(name)} for name, n in self.errors.items()},
            "models": triton.model_summary(raw),
        }
        if self.want_cpu:
            out["cpu"] = summarize_cpu(raw)
        if self.want_gpu:
            gpu = self._gpu
            out["gpu"] = summarize_gpu(raw, bool(gpu and gpu.available), gpu.reason if gpu else "not started")
        return out

    def save(self, out_dir: str | Path) -> None:
        """Write ``telemetry.parquet``, ``telemetry.csv`` (the :meth:`frame`) and ``telemetry.json`` (the
        :meth:`summary`) into ``out_dir``, each through a temporary name and a rename."""
        out_dir = Path(out_dir)
        frame = self.frame()
        summary = self.summary()
        writers = (("telemetry.parquet", lambda p: frame.to_parquet(p, index=False)),
                   ("telemetry.csv", lambda p: frame.to_csv(p, index=False)),
                   ("telemetry.json", lambda p: p.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")))
        for name, write in writers:
            atomic_write(out_dir / name, write)


def _window(frame: pd.DataFrame, start_s: float | None, end_s: float | None) -> pd.DataFrame:
    keep = pd.Series(True, index=frame.index)
    if start_s is not None:
        keep &= frame["t_s"] >= start_s
    if end_s is not None:
        keep &= frame["t_s"] <= end_s
    return frame[keep]
