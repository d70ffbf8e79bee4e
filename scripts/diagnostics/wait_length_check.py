#!/usr/bin/env python3
"""A demo's replay simulated with its profile twice: the wait for a core with its length by the host's quiet (the law's
``wait_s_quiet``, ``wait_gap_s``, ``wait_gap_quiet_s``: docs/notes/sim-history.md, "So the length follows the host's
quiet") and with the busier rate's length alone, three seeds each; prints each p50 / p99 row's error per seed and, per
variant, the mean |error| of the seeds' mean and the rows within 15 %.

    .venv/bin/python scripts/diagnostics/wait_length_check.py [--demo results/demo] [--repo model_repo]
        [--load load_profiles/demo.yaml]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving_bench.profiles.law import WAIT_BY_QUIET  # noqa: E402
from serving_bench.validate import ValidateOptions, run_validation  # noqa: E402

SEEDS = (0, 1, 2)
WITHIN = 0.15


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", default="results/demo", help="a demo's results (its profile.json and replay/)")
    parser.add_argument("--repo", default="model_repo")
    parser.add_argument("--load", default="load_profiles/demo.yaml")
    args = parser.parse_args(argv)
    demo = Path(args.demo)
    try:
        profile = json.loads((demo / "profile.json").read_text())
        law = profile["devices"]["cpu"].get("law") or {}
    except (OSError, ValueError, KeyError, TypeError) as err:
        return refuse(f"{demo / 'profile.json'}: a demo's profile expected ({type(err).__name__}: {err})")
    if not all(k in law for k in WAIT_BY_QUIET):
        return refuse(f"{demo / 'profile.json'}: devices.cpu.law: no wait length by quiet measured")
    print("law: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in law.items()))
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "one_length.json"
        profile["devices"]["cpu"]["law"] = {k: v for k, v in law.items() if k not in WAIT_BY_QUIET}
        one.write_text(json.dumps(profile))
        for name, path in (("length by quiet", demo / "profile.json"), ("one length (the busier rate's)", one)):
            errors: dict[tuple[str, str], list[float]] = {}
            for seed in SEEDS:
                rows = run_validation(args.load, args.repo, path, Path(tmp) / f"{len(errors)}_{seed}",
                                      ValidateOptions(replay_dir=demo / "replay", seed=seed))
                for r in rows:
                    if r["metric"] in ("p50", "p99"):
                        errors.setdefault((r["model"], r["metric"]), []).append(float(r["rel_error"]))
            means = [abs(sum(v) / len(v)) for v in errors.values()]
            print(f"{name}: mean |p50, p99| error {sum(means) / len(means) * 100:.1f} %, rows within "
                  f"{WITHIN * 100:.0f} %: {sum(m <= WITHIN for m in means)} of {len(means)}; per seed {SEEDS}:")
            for (model, metric), v in sorted(errors.items()):
                print(f"   {model:24s} {metric:4s} " + " ".join(f"{x * 100:+6.1f}" for x in v))
    return 0


def refuse(message: str) -> int:
    """One line on stderr and exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


if __name__ == "__main__":
    sys.exit(main())
