"""Simulator fidelity: relative error of the simulator against real replays (sleep model), FIFO and dynamic
batching, single and co-located models, at loads up to 0.9 of capacity. Profiles are measured first on the same
server (``profiles.measure``); each scenario is one ``validate`` run. Figures: p50, p90, p99, throughput errors.

    .venv/bin/python benchmarks/sim_fidelity.py [--quick] [--out benchmarks/results/sim_fidelity_<date>_<host>.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving_bench.export.sleep import write_sleep_entry  # noqa: E402
from serving_bench.profiles.measure import measure_profile  # noqa: E402
from serving_bench.sim.validate import format_table, run_validation  # noqa: E402

# (name, entries: name -> (max_batch_size, queue delay us, instances), load fraction of one instance's capacity)
SCENARIOS = [
    ("fifo_single", {"sleep_a": (1, 0, 1)}, (0.5, 0.9)),
    ("dynbatch_single", {"sleep_a": (8, 1000, 1)}, (0.5, 0.9)),
    ("colocated", {"sleep_a": (8, 0, 1), "sleep_b": (8, 500, 1)}, (0.5, 0.9)),
]
SERVICE_S = 0.006  # 5 ms + 1 ms per item at batch 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    seconds = 6 if args.quick else 30
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, entries, loads in SCENARIOS:
            repo = tmp / name / "repo"
            for entry, (maxb, delay, inst) in entries.items():
                write_sleep_entry(repo, entry, base_ms=5.0, per_item_ms=1.0, max_batch_size=maxb,
                                  max_queue_delay_us=delay, instances=inst)
            profile = tmp / name / "p.json"
            measure_profile(repo, list(entries), profile, seconds=1.0 if args.quick else 3.0,
                            colocation=(1, 2))
            for load in loads[:1] if args.quick else loads:
                rate = load / SERVICE_S / len(entries)
                models = "\n".join(f"  {e}: {{rate: {rate:.1f}}}" for e in entries)
                yaml = tmp / name / f"load_{load}.yaml"
                yaml.write_text(f"name: {name}\nduration: {seconds}s\nwarmup: 1s\nseed: 1\nmodels:\n{models}\n")
                rows = run_validation(yaml, repo, profile, tmp / name / f"val_{load}")
                print(f"== {name} at load {load}")
                print(format_table(rows))
                results.append({"scenario": name, "load": load, "rows": rows})
    if args.out:
        Path(args.out).write_text(json.dumps({"date": date.today().isoformat(), "host": socket.gethostname(),
                                              "quick": args.quick, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
