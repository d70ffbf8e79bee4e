#!/usr/bin/env python3
"""Does the wait for a core follow the host's instances in all? A leave-out check of the profile's law.

The profile measures the wait behind the longest model's occasional batches (its quiet-wait runs: every other model
at 15 and 150 req/s) on its one-instance server and on its calibration server (``--calibrate`` instances per model),
and the simulator's chance follows the host's instances in all between those two counts, flat outside
(``sim.spec.wait_chance``). This script measures the same runs on servers with 1, 2, 3 and 4 instances per model,
``--repeats`` times alternating; the law measured on one repetition at 1 and 2 per model then predicts how many
requests waited > 1 ms in another repetition at every count — beside the law measured at 2 alone, what the profile
did before (2026-12-04).

    .venv/bin/python scripts/diagnostics/wait_by_instances.py [--repo model_repo] [--models a,b,...] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving_bench.calibrate.runs import LoopRun  # noqa: E402
from serving_bench.calibrate.waits import WAITED_S, beside_long, quiet_wait  # noqa: E402
from serving_bench.calibrate.plan import QUIET_RATES_RPS, QUIET_SECONDS, quiet_rates  # noqa: E402
from serving_bench.calibrate.session import ServerSetup, open_session  # noqa: E402
from serving_bench.serving_config import ServingConfig  # noqa: E402
from serving_bench.sim.interference import WAIT_S_RANGE, open_schedule  # noqa: E402
from serving_bench.profiles.law import Law  # noqa: E402
from serving_bench.sim.spec import wait_chance  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODELS = ("tiny_cnn_onnxruntime", "tiny_mlp_torchscript", "tiny_cnn_tvm", "resnet50_onnxruntime",
               "tiny_ensemble")  # the demo's entries (load_profiles/demo.yaml)
COUNTS = (1, 2, 3, 4)  # instances per model


def expected_waits(law: Law, instances: int, quiet: np.ndarray) -> float:
    """How many of the requests sent during a long batch, after these recent quiet times (s), the law expects to
    wait longer than ``WAITED_S`` with ``instances`` instances in all: the sum of ``p (1 - WAITED_S / wait_s)
    (1 - exp(-g / wait_quiet_s))``."""
    seen = 1.0 - WAITED_S / law.wait_s
    return float(np.sum(wait_chance(law, instances) * seen * -np.expm1(-quiet / law.wait_quiet_s)))


def measure(repo: Path, models: list[str], long: str, long_service_s: float, per_model: int) -> list[LoopRun]:
    """The quiet-wait runs on a new server with ``per_model`` instances of every model."""
    with open_session(ServerSetup(repo, tuple(models), per_model), [], lambda _line: None) as session:
        return [session.replay(open_schedule(quiet_rates(models, long, long_service_s, rate), QUIET_SECONDS, 0))
                for rate in QUIET_RATES_RPS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT / "model_repo")
    parser.add_argument("--models", default=",".join(DEMO_MODELS), help="entries (ensembles bring their members)")
    parser.add_argument("--long", default="resnet50_onnxruntime", help="the model whose batches others wait behind")
    parser.add_argument("--long-service-ms", type=float, default=43.0, help="its batch-1 service, for its rate")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error("--repeats: expected 2 or more (one repetition is judged on another)")
    models = list(ServingConfig.from_repo(args.repo, args.models.split(",")).names)
    if args.long not in models:
        parser.error(f"--long: {args.long!r} is not among the served models ({', '.join(models)})")
    runs: dict[tuple[int, int], list[LoopRun]] = {}
    for repeat in range(args.repeats):
        for per_model in COUNTS:
            runs[repeat, per_model] = measure(args.repo, models, args.long, args.long_service_ms / 1e3, per_model)
            quiet, excess = beside_long(runs[repeat, per_model], args.long)
            print(f"repetition {repeat}, {per_model} per model ({per_model * len(models)} in all): "
                  f"{(excess > WAITED_S).sum()} of {len(quiet)} requests sent during a long batch waited "
                  f"> {WAITED_S * 1e3:g} ms", flush=True)
    n = len(models)
    errors: dict[str, dict[int, list[float]]] = {"by instances": {}, "measured at 2 alone": {}}
    for fit in range(args.repeats):
        laws = {"by instances": quiet_wait(runs[fit, 2], args.long, WAIT_S_RANGE, 2 * n, (n, runs[fit, 1])),
                "measured at 2 alone": quiet_wait(runs[fit, 2], args.long, WAIT_S_RANGE)}
        print(f"\n== law from repetition {fit}: " + ", ".join(f"{k} {v:.3g}" for k, v in laws["by instances"].law()
                                                               .items()))
        for judge in (r for r in range(args.repeats) if r != fit):
            for per_model in COUNTS:
                quiet, excess = beside_long(runs[judge, per_model], args.long)
                waited = int((excess > WAITED_S).sum())
                line = f"  repetition {judge}, {per_model} per model: waited {waited} of {len(quiet)};"
                for name, law in laws.items():
                    expected = expected_waits(Law(**law.law()), per_model * n, quiet)
                    errors[name].setdefault(per_model, []).append(expected / waited - 1)
                    line += f" {name} {expected:.0f} ({(expected / waited - 1) * 100:+.0f} %)"
                print(line)
    print("\n== expected against measured waits, mean |error| over the judged repetitions")
    for name, by_count in errors.items():
        print(f"  {name:20s} " + "  ".join(f"{k} per model {np.mean(np.abs(v)) * 100:.0f} %"
                                          for k, v in by_count.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
