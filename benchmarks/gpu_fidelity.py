"""GPU fidelity: the simulator's predictions of every saved GPU dataset, held out, beside a baseline — no GPU needed.

Datasets (``benchmarks/gpu_datasets.py`` reads them): every ``scripts/gpu_check.py`` result measured on a GPU
(``benchmarks/results/gpu_check_*.json``), every ``scripts/gpu_campaign.sh`` dataset (``benchmarks/results/gpu/*/``)
and the quoted figures kept beside them (``benchmarks/results/gpu/quoted_*.json``), or those named by ``--data``.

Each case (a co-located run, more instances or threads, an open loop) is simulated from its dataset's solo profile
with each sharing law of the device (:mod:`serving_bench.profiles.law`), three ways, none fitted to the case:

* ``solo``: the solo profile alone, laws with nothing to fit — ``serial`` (kernels one at a time: the machine-repair
  network), ``pool`` (processor sharing, nothing lost below the device's capacity) and ``none`` (no interference:
  the baseline);
* ``k<=4``: a law's parameters fitted (``sim.interference.fit``, through the simulator) on the runs of the same kind
  and mode with at most 4 instances (threads) per entry, predicting the rest (k = 8, the pairs, all together, the
  ensemble, the open loops) — ``pool_eff``, ``overlap`` (n kernels in flight at ``n ** alpha`` kernels' worth),
  ``overlap_sat`` (``n / (1 + sigma (n - 1))``) and ``overlap_usl``;
* ``curves``: for a pair of threads, the law fitted on the two entries' own thread counts (what each alone shows of
  how far its kernels overlap) predicting the pair.

The **chosen model** is, per kind of case, the way and law with the least held-out error (the mean of the absolute
throughput and p50 errors), never the best fit: for Triton's python-backend instances (a process and a CUDA context
each, time-sliced by the GPU) among the ``solo`` laws; for threads of one process (a native backend's instances:
one context, a stream each) the best ``k<=4`` form for more threads and the same form by ``curves`` for pairs. Errors
are (simulated - measured) / measured; a dataset's one-instance runs that its solo profile was made of are not held
out (their p99 is printed as the one-instance tail). The last line gives the chosen model's mean absolute errors over
every held-out case beside the baseline (no interference) on the same cases:

    GPU leave-out: throughput A %, p50 B %, p99 C % over N cases (baseline: no interference, ...)

    .venv/bin/python benchmarks/gpu_fidelity.py [--quick] [--data PATH ...] [--out DIR]

``--quick`` (CI): every dataset and case as in the full run, but only the fitted forms ``overlap`` and ``pool_eff``
(``overlap_sat`` and ``overlap_usl`` left out) and shorter closed-loop simulations (:func:`sim_seconds` without its
tail: 0.5 s or 20 answers of the slowest entry instead of 1 s or 100); seconds over the saved datasets. Writes
``gpu_fidelity[_quick]_<date>_<host>.json`` and ``.md`` (the printed report) into ``--out``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_datasets  # noqa: E402
from serving_bench.peers.report import write_result  # noqa: E402
from serving_bench.profiles.law import Law  # noqa: E402
from serving_bench.sim import interference  # noqa: E402
from serving_bench.sim.interference import simulated_figures, with_law  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SOLO_LAWS = {"gpu": ("serial", "pool", "none"), "cpu": ("pool", "none")}
FITTED = {"gpu": ("pool_eff", "overlap", "overlap_sat", "overlap_usl"), "cpu": ("pool_eff",)}
QUICK_FITTED = {"gpu": ("pool_eff", "overlap"), "cpu": ("pool_eff",)}
METRICS = ("throughput_rps", "p50_ms", "p99_ms")
FITTED_ON = 4  # k <= this is fitted on
BASELINE = ("solo", "none")


def datasets(paths: list[str] | None) -> list[Path]:
    """The named datasets, else every saved GPU one (CPU-plan checks of the scripts are not GPU datasets)."""
    if paths:
        return [Path(p) for p in paths]
    found = sorted(p for p in RESULTS.glob("gpu_check_*.json") if "_cpu" not in p.name)
    found += sorted(p.parent for p in (RESULTS / "gpu").glob("*/dataset.json") if "_cpu" not in p.parent.name)
    return found + sorted((RESULTS / "gpu").glob("quoted_*.json"))


def simulate_case(profile, device: str, law: Law, case, quick: bool) -> dict:
    """Per entry the simulated throughput (req/s), p50 and p99 (ms) of ``case`` with ``device`` shared by ``law``:
    an open loop from the intended time, a closed loop from the send (as measured)."""
    return simulated_figures(with_law(profile, device, law), case.obs, tail=not quick)


def relative(simulated: float | None, measured: float | None) -> float | None:
    return None if simulated is None or not measured else (simulated - measured) / measured


def rows_of(case, source: str, law: Law, simulated: dict) -> list[dict]:
    """A case's rows (one per entry) for one way and law; an open loop's throughput is its offered load, not an
    error of the model (left out)."""
    metrics = METRICS[1:] if case.obs.rates else METRICS
    return [{"dataset": case.dataset, "kind": case.kind, "mode": case.mode, "label": case.label, "entry": m,
             "group": case.group, "k": case.k, "source": source, "law": law.name, "params": law.to_json(),
             "in_profile": case.in_profile, "measured": real, "simulated": simulated.get(m, {}),
             "error": {k: relative(simulated.get(m, {}).get(k), real.get(k)) if k in metrics else None
                       for k in METRICS}}
            for m, real in case.measured.items()]


def evaluate(ds, quick: bool, say) -> list[dict]:
    """Every case of ``ds`` predicted every way (module docstring)."""
    kind = "gpu" if ds.gpu else "cpu"
    rows = []
    for key, profile in sorted(ds.profiles.items()):
        cases = [c for c in ds.cases if (c.kind, c.mode) == key]
        for case in cases:
            for name in SOLO_LAWS[kind]:
                law = Law(name)
                rows += rows_of(case, "solo", law, simulate_case(profile, ds.device, law, case, quick))
        forms = (QUICK_FITTED if quick else FITTED)[kind]
        trained = [c for c in cases if c.group in ("x1", "k") and c.k <= FITTED_ON]
        targets = [c for c in cases if c not in trained]
        if len({c.k for c in trained}) >= 2 and targets:
            for form in forms:
                law, _ = interference.fit(profile, ds.device, [c.obs for c in trained], form)
                say(f"  {ds.name} {key[0]} {key[1]}: {form} fitted on k <= {FITTED_ON}: {_params(law)}")
                rows += [r for c in targets
                         for r in rows_of(c, "k<=4", law, simulate_case(profile, ds.device, law, c, quick))]
        rows += curve_rows(ds, profile, [c for c in cases if c.kind == "threads"], forms, quick)
    return rows


def curve_rows(ds, profile, cases: list, forms: tuple[str, ...], quick: bool) -> list[dict]:
    """Each pair of threads predicted with the law fitted on its two entries' own thread counts."""
    rows = []
    for pair in (c for c in cases if c.group == "pair"):
        own = [c for c in cases if c.group in ("x1", "k") and set(c.measured) <= set(pair.measured)]
        if len({c.k for c in own}) < 2:
            continue
        for form in forms:
            law, _ = interference.fit(profile, ds.device, [c.obs for c in own], form)
            rows += rows_of(pair, "curves", law, simulate_case(profile, ds.device, law, pair, quick))
    return rows


def _params(law: Law) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in law.params().items()) or "no parameters"


def held_out(rows: list[dict]) -> list[dict]:
    return [r for r in rows if not r["in_profile"]]


def mean_abs(rows: list[dict], metric: str) -> tuple[float | None, int]:
    values = [abs(r["error"][metric]) for r in rows if r["error"][metric] is not None]
    return (float(np.mean(values)) if values else None), len(values)


def score(rows: list[dict]) -> float:
    """What a way and law is chosen by: the mean of its mean absolute throughput and p50 errors."""
    parts = [v for v in (mean_abs(rows, "throughput_rps")[0], mean_abs(rows, "p50_ms")[0]) if v is not None]
    return float(np.mean(parts)) if parts else math.inf


def choose(rows: list[dict]) -> dict[str, tuple[str, str]]:
    """Per kind of case the chosen (source, law) (module docstring); threads: the k<=4 form, pairs by curves."""
    chosen = {}
    for kind in sorted({r["kind"] for r in rows}):
        mine = held_out([r for r in rows if r["kind"] == kind])
        if kind == "triton":
            options = {("solo", r["law"]) for r in mine if r["source"] == "solo" and r["law"] != "none"}
        else:
            options = {("k<=4", r["law"]) for r in mine if r["source"] in ("k<=4", "curves")}
        options = options or {("solo", r["law"]) for r in mine if r["source"] == "solo" and r["law"] != "none"}
        if options:
            chosen[kind] = min(sorted(options), key=lambda o: score(_by(mine, *o, kind)))
    return chosen


def _by(rows: list[dict], source: str, law: str, kind: str) -> list[dict]:
    """The rows of one way and law; for threads a k<=4 form stands for itself by curves on the pairs."""
    if kind == "threads" and source == "k<=4":
        return [r for r in rows if r["law"] == law and (r["source"] == "curves" or
                                                        (r["source"] == "k<=4" and r["group"] != "pair"))]
    return [r for r in rows if r["source"] == source and r["law"] == law]


def headline(rows: list[dict], chosen: dict) -> tuple[list[dict], list[dict]]:
    """The chosen model's held-out rows and the baseline's rows of the same cases."""
    mine = [r for kind, (source, law) in chosen.items() for r in _by(held_out(rows), source, law, kind)
            if r["kind"] == kind]
    keys = {(r["dataset"], r["label"], r["entry"]) for r in mine}
    base = [r for r in held_out(rows) if (r["source"], r["law"]) == BASELINE and
            (r["dataset"], r["label"], r["entry"]) in keys]
    return mine, base


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}"


def report(rows: list[dict], chosen: dict, sets: list, say) -> str:
    """The tables, each way and law's held-out errors, the tails, then the last line."""
    say("\n| kind | way | law | cases | throughput % | p50 % | p99 % | worst throughput % |")
    say("|---|---|---|---|---|---|---|---|")
    for kind in sorted({r["kind"] for r in rows}):
        for source, law in sorted({(r["source"], r["law"]) for r in rows if r["kind"] == kind}):
            mine = held_out(_by(rows, source, law, kind) if source != "curves" else
                            [r for r in rows if r["source"] == "curves" and r["law"] == law])
            mine = [r for r in mine if r["kind"] == kind]
            if not mine:
                continue
            worst = max((abs(r["error"]["throughput_rps"]) for r in mine if r["error"]["throughput_rps"] is not None),
                        default=None)
            tag = " (chosen)" if chosen.get(kind) == (source, law) else ""
            say(f"| {kind} | {source} | {law}{tag} | {len(mine)} | " + " | ".join(
                _pct(mean_abs(mine, m)[0]) for m in METRICS) + f" | {_pct(worst)} |")
    tails = [r for r in rows if r["group"] == "x1" and r["source"] == "solo" and r["law"] != "none"
             and r["error"]["p99_ms"] is not None]
    if tails:
        say("\nOne instance, p99 simulated vs measured: " + "; ".join(
            f"{r['dataset']} {r['label']} ({r['law']}{', in its profile' if r['in_profile'] else ''}) "
            f"{r['error']['p99_ms'] * 100:+.1f} %" for r in tails if r["law"] == chosen.get(r["kind"], ("", ""))[1]))
    for ds in sets:
        for note in ds.notes:
            say(f"{ds.name}: {note}")
    mine, base = headline(rows, chosen)
    desc = "; ".join(f"{k}: {s} {law}" for k, (s, law) in chosen.items())
    prefix = "GPU leave-out" if all(ds.gpu for ds in sets) else "CPU-plan leave-out (a check, no GPU figures)"
    line = (f"{prefix}: throughput {_pct(mean_abs(mine, 'throughput_rps')[0])} %, p50 "
            f"{_pct(mean_abs(mine, 'p50_ms')[0])} %, p99 {_pct(mean_abs(mine, 'p99_ms')[0])} % over "
            f"{len(mine)} cases ({desc}; mean absolute errors) (baseline: no interference, "
            f"throughput {_pct(mean_abs(base, 'throughput_rps')[0])} %, p50 {_pct(mean_abs(base, 'p50_ms')[0])} %, "
            f"p99 {_pct(mean_abs(base, 'p99_ms')[0])} % on the same cases)")
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two fitted forms, shorter simulations (CI)")
    parser.add_argument("--data", nargs="*", help="datasets to evaluate (default: every saved GPU dataset)")
    parser.add_argument("--out", default=str(RESULTS), help="folder for the result files")
    args = parser.parse_args(argv)
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    sets = [gpu_datasets.load(p) for p in datasets(args.data)]
    rows = []
    for ds in sets:
        say(f"{ds.name} ({ds.machine}): {len(ds.cases)} cases; solo profiles: "
            + ", ".join(f"{k} {m}" for k, m in sorted(ds.profiles)))
        rows += evaluate(ds, args.quick, say)
    if not rows:
        say("GPU leave-out: no case to predict (no dataset with a solo profile and a co-located run)")
        return 1
    chosen = choose(rows)
    last = report(rows, chosen, sets, say)
    say(last)
    path = write_result("gpu_fidelity", {"datasets": [str(p) for p in datasets(args.data)], "chosen": {
        k: list(v) for k, v in chosen.items()}, "rows": rows, "last_line": last}, quick=args.quick,
                        out_dir=args.out, markdown="\n".join(lines), timed=False)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
