"""Does the profile's per-request cost inside a batch depend on how many requests its one-row closed loop keeps in
flight? Exports tiny_cnn on ONNX Runtime (max batch 32) into a temporary repository, then profiles it once per
``--in-flight`` level (2 s a point, one runtime thread, no co-located calibration, no memory or energy) and prints the
slope the profile takes (Triton's compute time per request a batch holds) and the runner's CPU slope beside it. The
profile's own level is ``PER_REQUEST_CONCURRENCY`` (8); docs/notes/capacity-fidelity.md quotes 8 against 32.

    .venv/bin/python scripts/diagnostics/per_request_slope.py [--in-flight 8,32] [--seconds 2]   # ~1 min a level
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ENTRY = "tiny_cnn_onnxruntime"


def levels(text: str) -> list[int]:
    """``8,32`` -> [8, 32]; ValueError unless every item is a whole number from 2 to 32 (the entry's max batch)."""
    values = [int(item) for item in text.split(",")]
    if not values or any(not 2 <= v <= 32 for v in values):
        raise ValueError(text)
    return values


def slope_lines(log_lines: list[str]) -> list[str]:
    """The profile's lines that give the per-request cost inside a batch."""
    return [line for line in log_lines if "per-request cost inside a batch" in line]


def measure(repo: Path, in_flight: int, seconds: float, out: Path) -> list[str]:
    """Profile ``ENTRY`` with the per-request run at ``in_flight`` one-row requests; the log's slope lines."""
    import serving_bench.calibrate.alone as alone
    from serving_bench.calibrate.measure import measure_profile
    from serving_bench.calibrate.plan import MeasureConfig

    alone.PER_REQUEST_CONCURRENCY = in_flight  # the one setting this script changes
    lines: list[str] = []
    config = MeasureConfig(seconds=seconds, idle_rounds=1, calibrate=0, resources=False, threads=1)
    measure_profile(repo, [ENTRY], out, config, lines.append)
    return slope_lines(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", default="8,32", help="one-row requests in flight, comma-separated (2-32)")
    parser.add_argument("--seconds", type=float, default=2.0, help="closed-loop seconds a point (default 2)")
    args = parser.parse_args(argv)
    try:
        chosen = levels(args.in_flight)
    except ValueError:
        print(f"--in-flight: expected whole numbers from 2 to 32, comma-separated, got {args.in_flight!r}",
              file=sys.stderr)
        return 2
    if not args.seconds > 0:
        print(f"--seconds: expected a positive number, got {args.seconds:g}", file=sys.stderr)
        return 2
    from serving_bench.export.api import export_models
    from serving_bench.export.frameworks import ExportOptions

    with tempfile.TemporaryDirectory(prefix="per-request-slope-") as tmp:
        repo = Path(tmp) / "repo"
        export_models(["tiny_cnn"], ["onnxruntime"], repo, options=ExportOptions(max_batch_size=32, seed=0))
        for n in chosen:
            for line in measure(repo, n, args.seconds, Path(tmp) / f"profile_{n}.json"):
                print(f"{n} in flight: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
