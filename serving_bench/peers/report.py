"""Where benchmark results go: ``benchmarks/results/<name>[_quick]_<date>_<host>.json`` with the machine facts."""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
from pathlib import Path

from serving_bench.files import atomic_write_json

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
_LOAD_AT_START = os.getloadavg()[0]  # benchmarks import this module first thing: the machine before they ran


def machine() -> dict:
    """Facts that make a figure comparable: date, host, CPU model and count, load average at the start (when this
    module was imported) and at the end (the benchmark's own load included), Python."""
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    except OSError:
        pass
    return {"date": dt.date.today().isoformat(), "host": socket.gethostname() or platform.node(), "cpu": cpu,
            "cpus": os.cpu_count(), "load_average_1m": _LOAD_AT_START, "load_average_1m_at_end": os.getloadavg()[0],
            "python": platform.python_version()}


def write_result(name: str, data: dict, *, quick: bool, out_dir: str | Path | None = None) -> Path:
    """Write ``data`` (plus :func:`machine`) as JSON; returns the path."""
    facts = machine()
    out_dir = Path(out_dir) if out_dir else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}{'_quick' if quick else ''}_{facts['date']}_{facts['host']}.json"
    return atomic_write_json(path, {**facts, **data}, sort_keys=False)
