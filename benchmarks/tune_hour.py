"""Tune on an hour: ``serving-bench tune`` over 50 candidates of a one-hour trace (3 M requests), screened (the
default on a load this long: candidates ranked on a ~5 % sample of the hour's time, the best then simulated on all of
it) against the exhaustive search (every candidate simulated on the whole hour), in the same run.

Both sides run the same search (``load_profiles/azure_hour_full.yaml``: three co-located CPU models on the demo's
profile and repository, instances 1/2 x max batch 1/8/32 x queue delay 0/1000 us, the first 50 grid points,
feasibility at the load, ``--max-scale 1``) with two worker processes, and are timed in wall seconds from the load's
file to the written result. The SLO is p99 <= 4 ms for each model (``--slo``): tight enough that the candidates differ
(at 50 ms, the profile's own, every candidate meets it and the pick is the first key). Besides the times: whether
the screened pick is the exhaustive one, its place in the exhaustive ranking, and whether it is as good by the
objective (meets the SLOs, as few instances; the exhaustive ranking breaks such ties by the candidates' keys).
``--quick``: a 10-minute slice of the hour, screened on the same share of its time. The ratios printed last: screened
/ exhaustive wall time, and its inverse (the screen's speed-up).

    .venv/bin/python benchmarks/tune_hour.py [--quick] [--profile results/demo/profile.json] [--repo model_repo]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving_bench.peers.report import compare, figure, interleave, ratio_line, write_result  # noqa: E402
from serving_bench.tune.run import TuneOptions, run_tune  # noqa: E402
from serving_bench.tune.load import SCREEN_REQUESTS, load_from_file  # noqa: E402
from serving_bench.tune.objective import rank_key  # noqa: E402

LOAD = ROOT / "load_profiles" / "azure_hour_full.yaml"
QUICK_S = 600.0
TARGET_S = 60.0


def tune(args, out: Path, screen: str | float, duration_s: float | None) -> dict:
    """One tune; its wall time, pick and ranking."""
    t0 = time.perf_counter()
    doc = run_tune(TuneOptions(load=str(LOAD), profile=args.profile, repo=args.repo, out=str(out), slos=args.slo,
                               max_evals=args.max_evals, max_scale=1.0, workers=args.workers, verify_top=0,
                               screen=screen, duration_s=duration_s, restart=True, report=False, quiet=True))
    wall = time.perf_counter() - t0
    rows = (json.loads(line) for line in (out / "observations.jsonl").read_text().splitlines())
    feasible = {row["key"]: row["result"]["feasible"] for row in rows if row["kind"] == "observation"}
    return {"wall_s": wall, "best": doc["best"]["key"], "best_result": timeless(doc["best"]["result"]),
            "top": [t["key"] for t in doc["top"] if not t.get("screened")], "search": doc["search"],
            "requests": doc["load"]["requests"], "feasible": feasible}


def merit(result: dict) -> tuple:
    """What the objective ranks a candidate by, before the tie-break on its key (``tune.objective.rank_key``)."""
    return rank_key(result, "", "throughput")[:2]


def timeless(result: dict) -> dict:
    """A candidate's result without its evaluation time (what two runs of it must agree on)."""
    return {k: v for k, v in result.items() if k != "eval_s"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"a {QUICK_S / 60:.0f}-minute slice of the hour")
    parser.add_argument("--profile", default=str(ROOT / "results" / "demo" / "profile.json"),
                        help="simulator profile (default: the demo's)")
    parser.add_argument("--repo", default=str(ROOT / "model_repo"), help="model repository (default: the demo's)")
    parser.add_argument("--slo", help="per-model SLOs (default: p99 4 ms each)")
    parser.add_argument("--max-evals", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--trials", type=int, help="trials of each side (default: 1, --quick 2)")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    if not Path(args.profile).is_file():
        print(f"{args.profile}: no such profile; run `make demo` first (or pass --profile)", file=sys.stderr)
        return 2
    duration = QUICK_S if args.quick else None
    hour = load_from_file(LOAD)
    models = hour.base.models
    args.slo = args.slo or ",".join(f"{m}=p99:4ms" for m in models)
    fraction = min(1.0, SCREEN_REQUESTS / len(hour.base))  # the hour's automatic screen, on the slice too
    trials = args.trials or (2 if args.quick else 1)
    print(f"{'quick: ' if args.quick else ''}{LOAD.name}{f' (first {QUICK_S:.0f} s)' if duration else ''}, "
          f"{args.max_evals} candidates, {args.workers} workers, SLO {args.slo}; screen {fraction:.2%} of the time; "
          f"{trials} trial(s)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        def side(name: str, screen):
            def run(k: int) -> dict:
                r = tune(args, Path(tmp) / f"{name}{k}", screen, duration)
                screened = r["search"].get("screen")
                extra = (f", screen {screened['requests']:,} requests, {screened['confirmed']} simulated on the whole "
                         f"load") if screened else ""
                print(f"  trial {k + 1} {name}: {r['wall_s']:.1f} s, {r['requests']:,} requests{extra}", flush=True)
                return r
            return run
        runs = interleave(trials, {"screened": side("screened", fraction), "exhaustive": side("exhaustive", 1.0)})
    agreement = []
    for k, (ours, peer) in enumerate(zip(runs["screened"], runs["exhaustive"])):
        place = peer["top"].index(ours["best"]) + 1 if ours["best"] in peer["top"] else None
        same = ours["best"] == peer["best"] and ours["best_result"] == peer["best_result"]
        as_good = merit(ours["best_result"]) == merit(peer["best_result"])
        agree = sum(ours["feasible"][key] == ok for key, ok in peer["feasible"].items())
        agreement.append({"trial": k + 1, "same_pick": same, "as_good": as_good, "place_in_exhaustive_top": place,
                          "feasible": ours["best_result"]["feasible"],
                          "feasible_on_whole_load": sum(peer["feasible"].values()),
                          "feasible_on_screen": sum(ours["feasible"].values()), "screen_agrees": agree,
                          "candidates": len(peer["feasible"])})
        print(f"  trial {k + 1}: screened pick {'is' if same else 'is NOT'} the exhaustive pick (place "
              f"{place or '> ' + str(len(peer['top']))} of the exhaustive ranking; "
              f"{'as good by the objective' if as_good else 'WORSE by the objective'}: meets the SLOs "
              f"{ours['best_result']['feasible']}, {ours['best_result']['instances']} instances); "
              f"SLOs met by {sum(peer['feasible'].values())} of "
              f"{len(peer['feasible'])} candidates on the whole load, {sum(ours['feasible'].values())} on the screen "
              f"(the screen's verdict right for {agree})")
    cmp = compare([figure(r["wall_s"]) for r in runs["screened"]], [figure(r["wall_s"]) for r in runs["exhaustive"]])
    speedup = compare([figure(r["wall_s"]) for r in runs["exhaustive"]],
                      [figure(r["wall_s"]) for r in runs["screened"]])
    data = {"load": str(LOAD.relative_to(ROOT)), "duration_s": duration, "slo": args.slo, "screen_fraction": fraction,
            "max_evals": args.max_evals, "workers": args.workers, "wall_s": cmp, "speedup": speedup,
            "agreement": agreement, "runs": runs, "target_s": TARGET_S}
    path = write_result("tune_hour", data, quick=args.quick, out_dir=args.out)
    print(f"results: {path}")
    print(ratio_line("tune wall time", cmp, unit="s", target=f"<= {TARGET_S:.0f} s on the hour", peer="exhaustive",
                     digits=1))
    print(ratio_line("speed-up of the screen", speedup, unit="s", target="as large as the pick allows",
                     ours="exhaustive", peer="screened", digits=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
