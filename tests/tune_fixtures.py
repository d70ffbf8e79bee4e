"""Inputs for the tune/plan/report tests: simulator profiles with known service times and load profiles.

Service time of an executed batch of b items is ``base_ms + per_item_ms * b`` (constant), so capacities have a
closed form: ``instances * b / (base + per_item * b)`` with linear sharing up to the core count.
"""

from __future__ import annotations

import json
from pathlib import Path


def profile_json(models: dict, *, device: str = "cpu", kind: str = "cpu", cores: int = 2, mode: str = "n/a",
                 name: str = "test device") -> dict:
    """A profile: ``models`` maps name -> (base_ms, per_item_ms, largest measured batch)."""
    entries = {}
    for m, (base_ms, per_ms, top) in models.items():
        entries[m] = {"framework": "python", "precision": "fp32", "devices": {device: {
            "execution_mode": mode, "threads": 1,
            "batches": {str(b): {"constant_s": (base_ms + per_ms * b) / 1e3} for b in range(1, top + 1)}}}}
    dev = {"kind": kind, "name": name}
    if kind == "cpu":
        dev["cores"] = cores
    return {"format": "serving-bench-profile", "version": 1, "source": "tests", "devices": {device: dev},
            "overhead": {"constant_s": 0.0}, "models": entries}


def two_thread_profile_json(name: str) -> dict:
    """A 2-core host's profile of one entry measured at 2 threads per instance (5 ms a request) and at 1 (8 ms)."""
    profile = profile_json({name: (5.0, 0.0, 1)})
    profile["models"][name]["devices"]["cpu"].update(threads=2, other_threads={"1": {"batches": {"1": {
        "constant_s": 0.008}}}})
    return profile


def write_profile(path: Path, models: dict, **kwargs) -> Path:
    path.write_text(json.dumps(profile_json(models, **kwargs)))
    return path


def write_load(path: Path, rates: dict, slos: dict, duration_s: float = 10.0, seed: int = 3) -> Path:
    """A Poisson load profile: ``rates`` model -> req/s, ``slos`` model -> p99 bound in ms."""
    lines = [f"name: {path.stem}", f"duration: {duration_s}s", f"seed: {seed}", "warmup: 1s", "models:"]
    for m, rate in rates.items():
        slo = f", slo: {{p99: {slos[m]}ms}}" if m in slos else ""
        lines.append(f"  {m}: {{rate: {rate}{slo}}}")
    path.write_text("\n".join(lines) + "\n")
    return path
