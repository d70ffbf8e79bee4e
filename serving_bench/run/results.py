"""A run's results folder: records (Parquet + CSV), ``summary.json``, a perf_analyzer-style CSV and the schedule.

    results/NAME/
      records.parquet, records.csv, records.json   one row per scheduled request (serving_bench.records)
      summary.json                                 per model, per ensemble, overall (serving_bench.metrics)
      perf_analyzer.csv                            one row per model + overall, perf_analyzer's columns (µs)
      schedule.npz                                 the exact schedule, for ``replay --schedule``
      telemetry.*                                  when telemetry ran (serving_bench.telemetry)

Every file is written to a temporary name and renamed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from serving_bench.load.schedule import Schedule
from serving_bench.metrics import summarize
from serving_bench.records import save_records

PA_COLUMNS = ("Model", "Mode", "Concurrency", "Request Rate", "Inferences/Second", "Client Send",
              "Network+Server Send/Recv", "Server Queue", "Server Compute Input", "Server Compute Infer",
              "Server Compute Output", "Client Recv", "p50 latency", "p90 latency", "p95 latency", "p99 latency",
              "Avg latency", "request/response", "response wait", "p99 latency from intended", "Delayed Requests")


def run_summary(records: pd.DataFrame, telemetry: Mapping | None = None) -> dict:
    """:func:`serving_bench.metrics.summarize` plus the facts of the run (mode, stop reason, server statistics).
    A partial run's window ends when it stopped, so rates are over the part that ran."""
    attrs = records.attrs
    duration = None
    if attrs.get("partial") and attrs.get("elapsed_s"):  # rates over the part that ran, not the whole schedule
        duration = min(float(attrs.get("meta", {}).get("duration_s", attrs["elapsed_s"])), float(attrs["elapsed_s"]))
    summary = summarize(records, telemetry=telemetry, duration_s=duration)
    summary["run"] = {k: attrs.get(k) for k in ("mode", "senders", "url", "elapsed_s", "timeout_s", "stop_reason",
                                                 "dropped", "concurrency") if k in attrs}
    if attrs.get("server_stats"):
        summary["server_stats"] = attrs["server_stats"]
    return summary


def _pa_row(name: str, frame: pd.DataFrame, summary: dict, stats: Mapping | None, records: pd.DataFrame) -> dict:
    ok = frame[frame["status"].astype(str) == "ok"]
    service = (ok["done_s"] - ok["sent_s"]).to_numpy()
    late = (frame["sent_s"] - frame["intended_s"]).to_numpy()
    late = late[~np.isnan(late)]
    us = 1e6

    def q(p):
        return round(float(np.percentile(service, p)) * us) if len(service) else ""

    row = dict.fromkeys(PA_COLUMNS, "")
    row.update({"Model": name, "Mode": records.attrs.get("mode", "")})
    conc = records.attrs.get("concurrency")
    row["Concurrency"] = (sum(conc.values()) if name == "overall" else conc.get(name, "")) if conc else ""
    duration = float(records.attrs.get("meta", {}).get("duration_s", 0) or 0)
    row["Request Rate"] = round(len(frame) / duration, 3) if duration and not conc else ""
    row["Inferences/Second"] = round(summary.get("throughput_ips") or 0.0, 3)
    mean_service = float(service.mean()) if len(service) else None
    server = None
    if stats:
        server = {k: stats.get(f"{k}_mean_s") for k in ("queue", "compute_input", "compute_infer", "compute_output")}
    if server and mean_service is not None and all(v is not None for v in server.values()):
        row["Server Queue"] = round(server["queue"] * us)
        row["Server Compute Input"] = round(server["compute_input"] * us)
        row["Server Compute Infer"] = round(server["compute_infer"] * us)
        row["Server Compute Output"] = round(server["compute_output"] * us)
        row["Network+Server Send/Recv"] = max(0, round((mean_service - sum(server.values())) * us))
    row.update({"Client Send": 0, "Client Recv": 0})  # serialized up front / not parsed: no client-side cost
    row.update({"p50 latency": q(50), "p90 latency": q(90), "p95 latency": q(95), "p99 latency": q(99),
                "Avg latency": round(mean_service * us) if mean_service is not None else ""})
    row["request/response"] = row["Avg latency"]
    row["response wait"] = row["Avg latency"]
    p99 = summary.get("p99_s")
    row["p99 latency from intended"] = round(p99 * us) if p99 is not None else ""
    row["Delayed Requests"] = int(np.count_nonzero(late > 0.001))  # left more than 1 ms late
    return row


def perf_analyzer_csv(records: pd.DataFrame, summary: dict) -> pd.DataFrame:
    """perf_analyzer's ``-f`` CSV columns (latencies in µs, measured like perf_analyzer from the send time), one row
    per model and one ``overall``; plus our coordinated-omission-safe ``p99 latency from intended``. Server columns
    come from Triton's statistics over the run."""
    stats = records.attrs.get("server_stats") or {}
    rows = []
    for name, model_summary in summary["models"].items():
        rows.append(_pa_row(name, records[records["model"].astype(str) == name], model_summary, stats.get(name),
                            records))
    rows.append(_pa_row("overall", records, summary["overall"], None, records))
    return pd.DataFrame(rows, columns=list(PA_COLUMNS))


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def write_results(out_dir: str | Path, records: pd.DataFrame, schedule: Schedule | None = None, *,
                  telemetry=None) -> dict:
    """Write the results folder; ``telemetry`` is a stopped ``Telemetry`` (saved, and its summary goes into
    ``summary.json``). Returns the summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tel_summary = None
    if telemetry is not None:
        telemetry.save(out_dir)
        tel_summary = telemetry.summary()
    summary = run_summary(records, telemetry=tel_summary)
    save_records(records, out_dir)
    _atomic(out_dir / "summary.json",
            lambda p: p.write_text(json.dumps(summary, indent=2, sort_keys=True, default=_jsonable) + "\n"))
    pa = perf_analyzer_csv(records, summary)
    _atomic(out_dir / "perf_analyzer.csv", lambda p: pa.to_csv(p, index=False))
    if schedule is not None:
        schedule.save(out_dir / "schedule.npz")
    return summary


def _jsonable(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
