"""Triton's ``/metrics`` as telemetry rows, and what they say per model over a window.

Rows keep Prometheus names (``nv_inference_count`` ...), one per (metric, model), summed over the other labels
(``version``, failure ``reason``). Families labelled per GPU (``gpu_uuid``) are skipped: :mod:`.gpu` reads the
devices directly through NVML. Triton's request counters and durations are cumulative; everything per model is a
difference between two samples, so a window is measured exactly at the scrape resolution.

Triton adds each request's own queue and compute durations to the ``*_duration_us`` counters (a request in an
executed batch of 8 gets that batch's compute time), so dividing by successful requests gives per-request means.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from serving_bench.telemetry.prometheus import scrape
from serving_bench.telemetry.rows import Row

SOURCE = "triton"
SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
INFERENCES = "nv_inference_count"
EXECUTIONS = "nv_inference_exec_count"
REQUEST_US = "nv_inference_request_duration_us"
QUEUE_US = "nv_inference_queue_duration_us"
COMPUTE_US = ("nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
              "nv_inference_compute_output_duration_us")
PENDING = "nv_inference_pending_request_count"


class TritonSampler:
    """Scrapes ``metrics_url`` (``host:port`` or a URL) once per :meth:`sample`."""

    def __init__(self, metrics_url: str, timeout_s: float = 2.0):
        self.metrics_url = metrics_url
        self.timeout_s = timeout_s

    def sample(self, server_pids=()) -> list[Row]:
        totals: dict[tuple[str, str], float] = defaultdict(float)
        for s in scrape(self.metrics_url, self.timeout_s):
            if not s.name.startswith("nv_"):
                continue
            model = s.labels.get("model")
            if model is None:
                if s.labels:  # per-GPU families: NVML is read directly
                    continue
                model = ""
            totals[(s.name, model)] += s.value
        return [Row(SOURCE, metric, model, value) for (metric, model), value in totals.items()]


def _by_model(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Triton rows per model as a wide table: index ``t_s``, one column per metric (cumulative values)."""
    rows = frame[(frame["source"] == SOURCE) & (frame["model"] != "")]
    out = {}
    for model, group in rows.groupby("model", sort=True):
        wide = group.pivot_table(index="t_s", columns="metric", values="value", aggfunc="last").sort_index()
        out[str(model)] = wide
    return out


def _col(wide: pd.DataFrame, name: str) -> pd.Series:
    return wide[name] if name in wide else pd.Series(0.0, index=wide.index)


def _compute_us(wide: pd.DataFrame) -> pd.Series:
    return sum(_col(wide, name) for name in COMPUTE_US)


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den > 0 else None


def model_summary(frame: pd.DataFrame) -> dict[str, dict]:
    """Per model over the whole ``frame``: request counts and, per successful request, mean queue / compute / total
    time in seconds, mean executed batch size (inferences / executions), and the peak of pending requests."""
    out = {}
    for model, wide in _by_model(frame).items():
        if len(wide) == 0:
            continue
        delta = (wide.iloc[-1] - wide.iloc[0]).clip(lower=0) if len(wide) > 1 else wide.iloc[0] * 0
        get = lambda name: float(delta.get(name, 0.0))  # noqa: E731
        ok = get(SUCCESS)
        queue_s = get(QUEUE_US) / 1e6
        compute_s = sum(get(name) for name in COMPUTE_US) / 1e6
        out[model] = {
            "requests_ok": int(ok),
            "requests_failed": int(get(FAILURE)),
            "inferences": int(get(INFERENCES)),
            "executions": int(get(EXECUTIONS)),
            "mean_batch": _ratio(get(INFERENCES), get(EXECUTIONS)),
            "queue_s_mean": _ratio(queue_s, ok),
            "compute_s_mean": _ratio(compute_s, ok),
            "request_s_mean": _ratio(get(REQUEST_US) / 1e6, ok),
            "queue_fraction": _ratio(queue_s, queue_s + compute_s),
            "pending_peak": float(wide[PENDING].max()) if PENDING in wide else None,
        }
    return out


def interval_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model and scrape interval (stamped at its end): ``request_rate_rps``, ``exec_batch_mean``,
    ``queue_s_mean`` and ``compute_s_mean`` (per successful request). Intervals with no traffic give no batch/time
    rows. Same columns as the telemetry frame, source ``triton``."""
    parts = []
    for model, wide in _by_model(frame).items():
        if len(wide) < 2:
            continue
        dt = np.diff(wide.index.to_numpy())
        d = wide.diff().iloc[1:].clip(lower=0)
        ok = _col(d, SUCCESS).to_numpy()
        execs = _col(d, EXECUTIONS).to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            derived = {
                "request_rate_rps": np.where(dt > 0, ok / dt, np.nan),
                "exec_batch_mean": np.where(execs > 0, _col(d, INFERENCES).to_numpy() / execs, np.nan),
                "queue_s_mean": np.where(ok > 0, _col(d, QUEUE_US).to_numpy() / 1e6 / ok, np.nan),
                "compute_s_mean": np.where(ok > 0, _compute_us(d).to_numpy() / 1e6 / ok, np.nan),
            }
        for metric, values in derived.items():
            keep = ~np.isnan(values)
            parts.append(pd.DataFrame({"t_s": d.index.to_numpy()[keep], "source": SOURCE, "metric": metric,
                                       "model": model, "value": values[keep]}))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in
                             (("t_s", float), ("source", object), ("metric", object), ("model", object),
                              ("value", float))})
    return pd.concat(parts, ignore_index=True)
