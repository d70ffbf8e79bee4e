"""How fast does TVM run resnet50 on this CPU against MetaSchedule's trial budget, beside ONNX Runtime (issue 45)?

Exports resnet50 (seeded weights) to ONNX Runtime and to TVM untuned and tuned with each ``--trials`` budget (static
buckets 1 and 8; records cached under the cache folder, as ``export`` keeps them), loads each artifact with the
runner's own loader at one runtime thread, and times batch 1 and 8 in-process: the median of ``--repeats`` runs after
one warm-up, with its range. Prints one row per variant and batch, then the ratio to ONNX Runtime.

    .venv/bin/python scripts/diagnostics/tvm_trials.py [--trials 64,256] [--repeats 5] [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from serving_bench.export.api import export_models  # noqa: E402
from serving_bench.export.frameworks import ExportOptions, load_predictor  # noqa: E402
from serving_bench.export.repository import read_config  # noqa: E402
from serving_bench.models import get_model  # noqa: E402

BATCHES = (1, 8)


def parse_trials(text: str) -> list[int] | None:
    """``--trials`` as positive integers; None where it is not that."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        return None
    return values if values and min(values) >= 1 else None


def timed(predict, inputs: dict, repeats: int) -> tuple[float, float, float]:
    """(median, min, max) seconds of ``predict(inputs)`` over ``repeats`` runs after one warm-up."""
    predict(inputs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        predict(inputs)
        times.append(time.perf_counter() - start)
    return float(np.median(times)), min(times), max(times)


def measure(repo: Path, entry: str, framework: str, repeats: int) -> dict[int, tuple[float, float, float]]:
    """Per batch size, ``entry`` (of ``framework``)'s timing loaded as the runner loads it, at one thread."""
    spec, config = get_model("resnet50"), read_config(repo / entry / "config.pbtxt")
    params = {key: value.string_value for key, value in config.parameters.items()}
    predict = load_predictor(framework, repo / entry / "1", [t.name for t in spec.inputs], spec.output_names,
                             threads=1, **({"buckets": params["buckets"]} if params.get("buckets") else {}))
    return {b: timed(predict, spec.make_inputs(b, 0), repeats) for b in BATCHES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", default="64,256", help="MetaSchedule trial budgets (default 64,256)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", help="the repository's folder (default: a temporary one)")
    args = parser.parse_args(argv)
    trials = parse_trials(args.trials)
    if trials is None or args.repeats < 1:
        parser.error(f"--trials / --repeats: expected positive integers (budgets separated by commas), got "
                     f"{args.trials!r} / {args.repeats}")
    repo = Path(args.work or tempfile.mkdtemp(prefix="tvm-trials-")) / "repo"
    variants = ["onnxruntime", "tvm"] + [f"tvm:trials={n}" for n in trials]
    start = time.perf_counter()
    records = export_models(["resnet50"], repo=str(repo), variants=",".join(variants),
                            options=ExportOptions(max_batch_size=8, tvm_buckets=BATCHES, seed=0))
    export_s = time.perf_counter() - start
    print(f"resnet50, one runtime thread, {os.cpu_count()} CPUs; exported in {export_s:.0f} s (tuning included, "
          f"unless cached)")
    rows = {}
    for record in records:
        name, status = record["name"], record["status"]
        if status != "exported":
            print(f"  {name}: {status} ({record.get('reason', '')})")
            continue
        rows[name] = measure(repo, name, record["framework"], args.repeats)
        tuning = record.get("settings", {}).get("tune_s")
        for b, (med, lo, hi) in rows[name].items():
            print(f"  {name:32s} batch {b}: {med * 1e3:9.1f} ms (range {lo * 1e3:.1f}-{hi * 1e3:.1f})"
                  + (f"; tuned in {tuning} s" if tuning and b == BATCHES[0] else ""))
    ort = rows.get("resnet50_onnxruntime")
    for name, timings in rows.items():
        if ort is not None and name != "resnet50_onnxruntime":
            print(f"{name} against onnxruntime: " +
                  ", ".join(f"batch {b} {timings[b][0] / ort[b][0]:.1f}x" for b in BATCHES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
