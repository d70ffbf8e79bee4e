"""The results folder of a run — the one writer, used by ``replay``, ``simulate``, ``validate`` and ``tune``'s
verification, for either target:

    results/NAME/
      records.parquet, records.csv, records.json   the table and its RunInfo (serving_bench.run.records)
      summary.json                                 per model, per ensemble, overall (serving_bench.run.metrics), plus
                                                   the run's facts ("run") and Triton's statistics ("server_stats")
                                                   or the simulator's facts ("sim")
      perf_analyzer.csv                            one row per model + overall, perf_analyzer's columns (µs)
      schedule.npz                                 the exact schedule, for ``replay --schedule``
      telemetry.*                                  when telemetry ran (serving_bench.telemetry)

The files are written into a staging folder inside ``NAME/`` and moved into place once all are written, so a
failed write leaves no half set: what was measured is then saved elsewhere, marked partial, and the
:class:`OutputError` says where (:func:`serving_bench.files.rescue_folder`). The folder is checked and held before
the run (:func:`hold_results`), with free space for :func:`results_bytes`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Mapping, Protocol

import numpy as np
import pandas as pd

from serving_bench.files import HeldFolder, atomic_write, atomic_write_json, hold_folder, rescue_folder, stage_folder
from serving_bench.run.metrics import Slo, summarize
from serving_bench.run.records import Records, RunInfo, save_records
from serving_bench.run.schedule import Schedule

PA_COLUMNS = ("Model", "Mode", "Concurrency", "Request Rate", "Inferences/Second", "Client Send",
              "Network+Server Send/Recv", "Server Queue", "Server Compute Input", "Server Compute Infer",
              "Server Compute Output", "Client Recv", "p50 latency", "p90 latency", "p95 latency", "p99 latency",
              "Avg latency", "request/response", "response wait", "p99 latency from intended", "Delayed Requests")
# A results folder's size: records.csv + records.parquet + schedule.npz took 110 bytes per request (simulate, 1,000,000
# requests) and 145 (replay of sleep_python, 297) on 2026-12-06; failed rows carry an error text of up to ~200
# characters, so 400 per request bounds a run whose every request fails. Telemetry: ~6 kB per second of run.
RESULT_BYTES_PER_REQUEST = 400
RESULT_BYTES_PER_SECOND = 8_000
RESULT_BYTES_FIXED = 1_000_000  # summary.json, perf_analyzer.csv, records.json, telemetry.json and margin
RESULT_BYTES_BASIS = (f"{RESULT_BYTES_PER_REQUEST} bytes per request, {RESULT_BYTES_PER_SECOND // 1000} kB per second "
                      "of telemetry")
RUN_FACTS = ("mode", "senders", "url", "elapsed_s", "timeout_s", "stop_reason", "dropped", "concurrency", "restarts")


class StoppedTelemetry(Protocol):
    """What the writer needs of a stopped ``serving_bench.telemetry.Telemetry``."""

    def save(self, out_dir: str | Path) -> None: ...

    def summary(self) -> dict: ...


def run_summary(records: Records, telemetry: Mapping | None = None, slos: Mapping[str, Slo] | None = None) -> dict:
    """:func:`serving_bench.run.metrics.summarize` plus the facts of the run (mode, stop reason, server statistics,
    the simulator's facts). A partial run's window ends when it stopped, so rates are over the part that ran."""
    info = records.info
    duration = None
    if info.partial and info.elapsed_s:  # rates over the part that ran, not the whole schedule
        duration = min(float(info.meta.get("duration_s", info.elapsed_s)), float(info.elapsed_s))
    summary = summarize(records, telemetry=telemetry, duration_s=duration, slos=slos)
    facts = {k: getattr(info, k) for k in RUN_FACTS}
    summary["run"] = {k: v for k, v in facts.items() if v not in (None, ())}
    if info.server_stats:
        summary["server_stats"] = dict(info.server_stats)
    if info.sim is not None:
        summary["sim"] = dataclasses.asdict(info.sim)
    return summary


def _pa_row(name: str, frame: pd.DataFrame, summary: dict, stats: Mapping | None, info: RunInfo) -> dict:
    ok = frame[frame["status"].astype(str) == "ok"]
    service = (ok["done_s"] - ok["sent_s"]).to_numpy()
    late = (frame["sent_s"] - frame["intended_s"]).to_numpy()
    late = late[~np.isnan(late)]
    us = 1e6

    def q(p):
        return round(float(np.percentile(service, p)) * us) if len(service) else ""

    row = dict.fromkeys(PA_COLUMNS, "")
    row.update({"Model": name, "Mode": info.mode or ""})
    conc = info.concurrency
    row["Concurrency"] = (sum(conc.values()) if name == "overall" else conc.get(name, "")) if conc else ""
    duration = float(info.meta.get("duration_s", 0) or 0)
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


def perf_analyzer_csv(records: Records, summary: dict) -> pd.DataFrame:
    """perf_analyzer's ``-f`` CSV columns (latencies in µs, measured like perf_analyzer from the send time), one row
    per model and one ``overall``; plus our coordinated-omission-safe ``p99 latency from intended``. Server columns
    come from Triton's statistics over the run (empty for the simulator)."""
    table, info = records.table, records.info
    stats = info.server_stats or {}
    rows = []
    for name, model_summary in summary["models"].items():
        rows.append(_pa_row(name, table[table["model"].astype(str) == name], model_summary, stats.get(name), info))
    rows.append(_pa_row("overall", table, summary["overall"], None, info))
    return pd.DataFrame(rows, columns=list(PA_COLUMNS))


def results_bytes(requests: int, duration_s: float = 0.0, folders: int = 1) -> int:
    """An upper estimate of ``folders`` results folders of a run of ``requests`` over ``duration_s`` seconds
    (:data:`RESULT_BYTES_BASIS`)."""
    per_folder = RESULT_BYTES_FIXED + RESULT_BYTES_PER_REQUEST * requests + RESULT_BYTES_PER_SECOND * duration_s
    return int(folders * per_folder)


def hold_results(out_dir: str | Path, requests: int, duration_s: float = 0.0, *, folders: int = 1,
                 empty: bool = False, option: str = "--out") -> HeldFolder:
    """:func:`serving_bench.files.hold_folder` for a run writing ``folders`` results folders of ``requests`` over
    ``duration_s`` seconds: writable, free space for :func:`results_bytes`, held until released."""
    return hold_folder(out_dir, need_bytes=results_bytes(requests, duration_s, folders), option=option, empty=empty,
                       basis=f"{requests:,} requests: {RESULT_BYTES_BASIS}")


def write_results(out_dir: str | Path, records: Records, schedule: Schedule | None = None, *,
                  telemetry: StoppedTelemetry | None = None, slos: Mapping[str, Slo] | None = None,
                  clear: bool = False, annotate: Callable[[dict], None] | None = None) -> dict:
    """Write the results folder ``out_dir`` (created) through a staging folder (``clear``: remove its
    other entries, ``--overwrite``); ``telemetry`` is a stopped ``Telemetry`` (saved, and its summary goes into
    ``summary.json``); ``slos`` override the schedule's; ``annotate(summary)`` adds what the caller knows beyond the
    records (``simulate``'s intervals) before it is written. Returns the summary. A write that fails raises
    :class:`serving_bench.errors.OutputError` after saving the results elsewhere, marked partial."""
    out_dir = Path(out_dir)

    def write(folder: Path, kept: Records) -> dict:
        return _write_folder(folder, kept, schedule, telemetry, slos, annotate)

    try:
        return stage_folder(out_dir, lambda folder: write(folder, records), clear=clear)
    except OSError as err:
        kept = records.with_info(partial=True, stop_reason=records.info.stop_reason or
                                 f"the results could not be written to {out_dir}: {err.strerror or err}")
        raise rescue_folder(out_dir, err, lambda folder: write(folder, kept), note="marked partial") from None


def _write_folder(out_dir: Path, records: Records, schedule: Schedule | None, telemetry: StoppedTelemetry | None,
                  slos: Mapping[str, Slo] | None, annotate: Callable[[dict], None] | None) -> dict:
    tel_summary = None
    if telemetry is not None:
        telemetry.save(out_dir)
        tel_summary = telemetry.summary()
    summary = run_summary(records, telemetry=tel_summary, slos=slos)
    if annotate is not None:
        annotate(summary)
    save_records(records, out_dir)
    atomic_write_json(out_dir / "summary.json", summary, default=_jsonable)
    pa = perf_analyzer_csv(records, summary)
    atomic_write(out_dir / "perf_analyzer.csv", lambda p: pa.to_csv(p, index=False))
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
