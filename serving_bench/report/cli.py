"""``serving-bench report RESULTS [--out report.html]``: the HTML report (and ``report.json``) of a results folder.

Writes both files atomically (temporary name, then rename) and prints the HTML path.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from serving_bench.files import atomic_write_text
from serving_bench.report.collect import collect
from serving_bench.report.render import render


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="results folder (e.g. results/demo) holding tune/plan/replay outputs")
    parser.add_argument("--out", help="HTML file to write (default: RESULTS/report.html); JSON goes beside it")
    parser.add_argument("--title", default="serving-bench report")


def write_report(results: str | Path, out: str | Path | None = None, title: str = "serving-bench report") -> Path:
    """Collect, render and write ``report.html`` + ``report.json``; returns the HTML path."""
    results = Path(results)
    out = Path(out) if out else results / "report.html"
    data = collect(results)
    html = render(data, title)
    atomic_write_text(out.with_suffix(".json"), json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n")
    atomic_write_text(out, html)
    return out


def main(args: argparse.Namespace) -> int:
    path = write_report(args.results, args.out, args.title)
    print(path)
    return 0
