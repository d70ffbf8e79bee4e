"""Gather what a results folder holds into the report's data (a JSON-able dict).

Read (any depth below the folder): ``tune.json`` (+ its ``observations.jsonl``) from ``serving-bench tune``,
``plan.json`` from ``serving-bench plan``, ``records.parquet`` from any target (latency CDFs), telemetry tables
``telemetry.parquet`` / ``telemetry.csv`` (long form ``t_s, source, metric, model, value``), and validation tables
``validation.json`` (rows with ``model, metric, simulated, measured``, the predicted intervals, and its ``coverage``).
Missing pieces are simply absent.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from serving_bench.errors import InputError
from serving_bench.run.records import load_records

CDF_POINTS = 200
UTILISATION_HINTS = ("util", "busy", "cpu_percent")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputError(path, f"line {err.lineno}", f"malformed JSON ({err.msg})") from None


def _label(path: Path, root: Path) -> str:
    rel = path.parent.relative_to(root)
    return str(rel) if str(rel) != "." else root.name


def latency_cdfs(table: pd.DataFrame, label: str) -> list[dict]:
    """Per model: latency quantiles (from intended time, ok requests of a records table) at ``CDF_POINTS`` levels,
    in seconds."""
    out = []
    ok = table[table["status"].astype(str) == "ok"]
    levels = np.linspace(0.0, 1.0, CDF_POINTS)
    for model, group in ok.groupby(ok["model"].astype(str), observed=True):
        latency = (group["done_s"] - group["intended_s"]).to_numpy()
        latency = latency[np.isfinite(latency)]
        if len(latency) == 0:
            continue
        out.append({"source": label, "model": str(model), "n": int(len(latency)),
                    "q": levels.tolist(), "latency_s": np.quantile(latency, levels).tolist()})
    return out


def telemetry_series(frame: pd.DataFrame, label: str) -> list[dict]:
    """Utilisation-like series (metric names containing util/busy) over time, one per (source, metric, model)."""
    need = {"t_s", "source", "metric", "value"}
    if not need <= set(frame.columns):
        return []
    frame = frame.copy()
    frame["model"] = frame["model"].fillna("").astype(str) if "model" in frame else ""
    mask = frame["metric"].astype(str).str.lower().str.contains("|".join(UTILISATION_HINTS))
    out = []
    for (source, metric, model), group in frame[mask].groupby(["source", "metric", "model"], sort=True):
        group = group.sort_values("t_s")
        name = "/".join(p for p in (str(source), str(metric), str(model)) if p)
        out.append({"source": label, "name": name, "t_s": group["t_s"].astype(float).tolist(),
                    "value": group["value"].astype(float).tolist()})
    return out


def collect(root: str | Path) -> dict:
    """The report data for results folder ``root``."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(root, None, "results folder does not exist")
    data: dict = {"root": str(root), "tune": None, "plan": None, "cdfs": [], "telemetry": [], "validation": [],
                  "validation_notes": [], "coverage": [], "observations": []}
    for path in sorted(root.rglob("tune.json")):
        data["tune"] = _read_json(path)
        obs = path.parent / "observations.jsonl"
        if obs.is_file():
            rows = []
            for line in obs.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if row.get("kind") == "observation":
                    rows.append(row)
            data["observations"] = rows
        break
    for path in sorted(root.rglob("plan.json")):
        data["plan"] = _read_json(path)
        break
    for path in sorted(root.rglob("records.parquet")):
        data["cdfs"] += latency_cdfs(load_records(path.parent).table, _label(path, root))
    tables = {p.parent: p for p in root.rglob("telemetry.csv")}
    tables.update({p.parent: p for p in root.rglob("telemetry.parquet")})  # one per folder, Parquet preferred
    for path in sorted(tables.values()):
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        data["telemetry"] += telemetry_series(frame, _label(path, root))
    for path in sorted(root.rglob("validation.json")):
        rows = _read_json(path)
        if isinstance(rows, dict):
            data["validation_notes"] += [f"{_label(path, root)}: {n}" for n in rows.get("notes") or []
                                         if isinstance(n, str)]
            if isinstance(rows.get("coverage"), dict):
                data["coverage"].append(dict(rows["coverage"], source=_label(path, root),
                                             replications=rows.get("replications")))
        rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict):
                data["validation"].append(dict(row, source=_label(path, root)))
    if data["tune"]:
        growth = data["tune"].get("growth", "superpose")
        for row in data["tune"].get("verification", []):
            for run in row.get("replays") or [dict(row, scale=1.0)]:
                data["validation"] += _replay_rows(run, f"tune verify #{row['rank']} at {run['scale']:.2f}× "
                                                        f"({growth})")
    return _finite(data)


def _replay_rows(run: dict, source: str) -> list[dict]:
    """Simulated vs measured rows (p50, p99, throughput per model) of one of tune's verification replays."""
    rows = []
    for model, sim in run.get("simulated", {}).items():
        meas = run.get("measured", {}).get(model, {})
        for metric in ("p50_s", "p99_s", "throughput_rps"):
            s, m = sim.get(metric), meas.get(metric)
            err = (s - m) / m if s is not None and m not in (None, 0) else None
            rows.append({"source": source, "model": model, "metric": metric, "simulated": s, "measured": m,
                         "rel_error": err})
    return rows


def _finite(obj):
    """NaN/inf -> None, so the JSON is strict and the page's script can read it."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
