"""Capacity fidelity: the load each configuration carries while its SLOs hold, measured on the embedded Triton (CPU)
and predicted by the simulator from one profile measured first and then frozen, beside a no-interference baseline
— the figures a user decides with: capacity, the ranking of configurations, and the regret of the simulator's pick.

Configurations (``capacity_cases.CASES``, 13; ``--quick`` 5): tiny_cnn on ONNX Runtime at 1, 2 and 4 instances,
max batch 1, 8 and 32, queue delay 0 and 2 ms (seven points of that grid); mixes of two to five entries of ONNX
Runtime, TorchScript and the python backend; the ensemble (tiny_cnn on ONNX Runtime and TorchScript, combined);
resnet50 on ONNX Runtime. Each entry's SLO is a p99 bound of ten times its solo latency (measured on Triton after the
profile), at least 50 ms; each configuration's load at scale 1 one client's worth of Poisson traffic
(``capacity_cases``' docstring says both).

1. Export, then the profile (``calibrate.measure_profile``: every entry alone at the host's cores and at one
   thread, and the calibration runs the profile fits its sharing law to by default — closed loops of each entry
   alone at two instances, each beside the longest, all together, two rounds each: their difference is the host's
   run-to-run spread the intervals draw on — no pair curves). It is saved in the measurements and frozen: nothing
   after it is fitted, and no configuration has run yet.
2. Per configuration, on a server of its own (warmed by a short replay at scale 1): ``tune.capacity.bisect_capacity``
   on tune's ladder (8 rungs per doubling; scales 1/8 to 8 of the load), each rung judged by tune's SLO check
   (``check_slos``: every p99 within its bound, at most 0.1 % failed) on an open-loop replay of the load grown by
   tune's rule (superpose: more independent users; for Poisson load the same as the other rule), the same seeded
   schedule on every attempt. The two decisive steps are repeated (three replays each, majority; ``--quick`` two,
   both must meet). Between replays the server is left to go idle.
3. The same bisection on the simulator, the same schedules, a repeat another seed: with the profile as measured (the
   full model) and with its law set to ``none`` (the baseline: no interference). The full model's 90 % capacity
   interval (``tune.intervals.capacity_interval``, 20 replications, each the case's schedule on its own simulator
   seed and a host speed drawn from the profile's host spread), each replication's capacity placed inside its
   final bracket as the measured one is (open above where a replication met at the ladder's top). Coverage: the
   share of configurations whose measured capacity lies inside; width: the median half-width over the middle,
   against the median repeat spread (issue 44: coverage >= 85 %, half-width <= 1.5 times the spread).

Capacity is interpolated inside each bisection's final bracket where the worst p99/bound crosses 1, log-linearly
between the two decisive rungs (``tune.capacity.interpolate``), on both targets alike; the rung (the highest that
met) is printed beside it. The targets use the interpolated figure: a rung is 9 % wide, larger than the median
error asked for. Its repeat spread is the range of the crossings each repeat pair of the decisive steps gives, over
the capacity.

Per configuration: measured capacity (req/s at the interpolated scale, the rung's in brackets) and repeat spread,
the full model's and the baseline's prediction and error, whether held out (no run of the profile served it; at
least a third, the mix "ort+ts+python" whole among them). Then Kendall's tau between predicted and measured
capacities and regret = 1 - (measured capacity of the configuration the simulator ranks first) / (the measured
best), each over all configurations and within the grid. The last line takes the capacity error over every
configuration (held-out ones included) and tau and regret within the grid: there a user chooses between
configurations of one model for one load, and the ranking is the decision; across all configurations it orders
resnet50 against tiny_cnn, which any model gets right and nobody chooses between. Targets (issue 44, quiet machine,
full run): median <= 5 %, worst <= 15 %, tau >= 0.8, regret <= 5 %, each at least as good as the baseline. The
scores, the table and the last line: ``capacity_scores``.

    .venv/bin/python benchmarks/capacity_fidelity.py [--quick | --smoke] [--out DIR] [--data SAVED.json.xz]

The measurements are saved first (``capacity_fidelity_data[_quick]_<date>_<host>.json.xz``: the frozen profile,
each configuration's serving, load and every replay's verdict and p99s, the host's steal and load average per
configuration); ``--data`` evaluates them again without a server (the real bisection is replayed from the saved
verdicts, the simulated ones run again). A run stopped early saves what it measured, marked partial. ``--smoke``
(the test's): two grid configurations, a short profile without calibration runs, a coarse ladder, four
replications — the code path, not a figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import capacity_cases as cc  # noqa: E402
import capacity_scores as cs  # noqa: E402
from serving_bench.calibrate.measure import measure_profile  # noqa: E402
from serving_bench.calibrate.plan import MeasureConfig  # noqa: E402
from serving_bench.errors import InputError  # noqa: E402
from serving_bench.export.api import export_models, settle_after_export  # noqa: E402
from serving_bench.export.frameworks import ExportOptions  # noqa: E402
from serving_bench.files import read_json  # noqa: E402
from serving_bench.load.uncancelled import cut_after_s  # noqa: E402
from serving_bench.peers.report import write_result  # noqa: E402
from serving_bench.profiles.law import Law  # noqa: E402
from serving_bench.profiles.schema import Profile  # noqa: E402
from serving_bench.serving_config import ServingConfig  # noqa: E402
from serving_bench.sim.interference import Observation, serving_from_json, with_law  # noqa: E402
from serving_bench.sim.intervals import Replications, host_sigma  # noqa: E402
from serving_bench.telemetry.cpu import StealClock  # noqa: E402
from serving_bench.tune.capacity import Interpolated, Ladder, Repeats, bisect_capacity, interpolate  # noqa: E402
from serving_bench.tune.intervals import CapacityQuestion, capacity_interval  # noqa: E402

GROWTH = "superpose"
CONFIDENCE = 0.9  # the capacity intervals'


@dataclass(frozen=True)
class Mode:
    """How much a run measures: the profile's options, replays (shortest and longest seconds, requests the
    sparsest entry gets at scale 1), the ladder, the repeats of the decisive steps, the replications of the capacity
    intervals, the quiet (s) that means idle."""

    name: str
    profile: MeasureConfig
    replay: tuple[float, float, int]
    ladder: Ladder
    repeats: Repeats
    replications: int
    idle_s: float = 0.3


MODES = {
    "full": Mode("full", MeasureConfig(seconds=2.0, rounds=2, idle_rounds=1, pairs=False), (4.0, 8.0, 40),
                 Ladder(0.125, 8.0, 8), Repeats(3, "majority"), 20),
    "quick": Mode("quick", MeasureConfig(seconds=1.0, rounds=2, idle_rounds=1, pairs=False), (2.5, 5.0, 20),
                  Ladder(0.125, 8.0, 8), Repeats(2, "majority"), 20),
    "smoke": Mode("smoke", MeasureConfig((1, 8), seconds=0.5, rounds=1, idle_rounds=1, calibrate=0, pairs=False),
                  (1.0, 1.0, 5), Ladder(0.25, 2.0, 2), Repeats(2, "majority"), 4, 0.2),
}
STARTED = time.perf_counter()


def stage(title: str) -> None:
    print(f"== {title} [{time.perf_counter() - STARTED:.0f} s]", flush=True)


def export(repo: Path, cases: tuple[cc.Case, ...]) -> None:
    """The entries the cases use, into ``repo`` (max batch 32 where the grid may batch that much)."""
    entries = set(cc.profiled_entries(cases))
    tiny = [f for f in ("onnxruntime", "torchscript") if f"tiny_cnn_{f}" in entries or cc.ENSEMBLE in entries]
    export_models(["tiny_cnn"], tiny, repo, options=ExportOptions(max_batch_size=32),
                  ensembles=[f"{cc.ENSEMBLE}=tiny_cnn_onnxruntime,tiny_cnn_torchscript"] if cc.ENSEMBLE in entries
                  else [])
    if "tiny_mlp_torchscript" in entries:
        export_models(["tiny_mlp"], ["torchscript"], repo, options=ExportOptions(max_batch_size=32))
    if "sleep_python" in entries:
        export_models(["sleep"], ["onnxruntime"], repo,
                      options=ExportOptions(max_batch_size=8, sleep_base_ms=2.0, sleep_per_item_ms=0.5))
    if "resnet50_onnxruntime" in entries:
        # a batch of 4 takes ~1 s at one thread
        export_models(["resnet50"], ["onnxruntime"], repo, options=ExportOptions(max_batch_size=2))


def config_json(config: ServingConfig) -> dict:
    return {"models": [dataclasses.asdict(m) for m in config.models], "ensembles": config.ensembles,
            "ensemble_deps": config.ensemble_deps}


def config_from_json(data: dict) -> ServingConfig:
    return ServingConfig(tuple(serving_from_json(m) for m in data["models"]),
                         tuple((e, tuple(m)) for e, m in data["ensembles"]),
                         tuple((e, tuple(tuple(d) for d in deps)) for e, deps in data["ensemble_deps"]))


def measure_case(case: cc.Case, repo: Path, exported: ServingConfig, spec: dict, mode: Mode, into: list) -> None:
    """One configuration bisected on Triton; its record (every probe, the host's steal and load average) is added
    to ``into`` first and filled as it goes, so that a run stopped during it keeps the probes done."""
    config = cc.serving_config(case, exported)
    record = {"name": case.name, "group": case.group, "held_out": case.held_out, "entries": list(case.entries),
              "serving": config_json(config), "load": spec, "started_unix": time.time(),
              "load_average_1m": os.getloadavg()[0], "probes": [], "notes": []}
    into.append(record)
    steal, begun = StealClock(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="capacity-case-") as tmp:
        load, slos = cc.case_load(spec, Path(tmp)), cc.slos_of(spec)
        with cc.real_target(repo, config, load, slos, Path(tmp) / "repo",
                            (mode.idle_s, cut_after_s(slos))) as target:
            try:
                bisect_capacity(target.probe, mode.ladder, mode.repeats)
            finally:
                record.update(probes=target.probes, notes=target.notes, seconds=time.perf_counter() - begun,
                              steal_share=round(steal.share(), 4))


def measure(mode: Mode, cases: tuple[cc.Case, ...], save) -> dict:
    """Export, profile (then frozen), then every case on Triton; ``save(data)`` writes what was measured, also when
    a case fails or the run is interrupted (marked ``partial``), before the error goes on."""
    data: dict = {"mode": mode.name, "growth": GROWTH, "ladder": dataclasses.asdict(mode.ladder),
                  "repeats": dataclasses.asdict(mode.repeats), "cases": []}
    with tempfile.TemporaryDirectory(prefix="capacity-fidelity-") as tmp:
        repo = Path(tmp) / "repo"
        stage("export")
        begun = time.perf_counter()
        export(repo, cases)
        if mode.name != "smoke":
            settle_after_export(begun, print)
        entries = cc.profiled_entries(cases)
        stage(f"profile of {', '.join(entries)} (then frozen)")
        profile = measure_profile(repo, entries, Path(tmp) / "profile.json",
                                  dataclasses.replace(mode.profile, threads=cc.THREADS), log=print)
        cc.check_held_out(cases, profile)
        exported = ServingConfig.from_repo(repo, entries)
        stage("each entry's solo latency on Triton (its SLO: ten times it, at least 50 ms)")
        solo = cc.solo_latency(repo, entries, mode.profile.seconds)
        print("  " + ", ".join(f"{e} {s * 1e3:.2f} ms" for e, s in solo.items()))
        data.update(profile=profile.to_json(), profile_frozen_unix=time.time(), solo_latency_s=solo,
                    exported=config_json(exported))
        try:
            for case in cases:
                spec = cc.load_spec(case, solo, mode.replay)
                stage(f"{case.name}: bisection on Triton ({spec['duration']:.1f} s replays)")
                measure_case(case, repo, exported, spec, mode, data["cases"])
                print_probes(data["cases"][-1])
        except BaseException as err:  # what was measured is kept, marked partial; the error goes on
            data["partial"] = f"{type(err).__name__}: {err}"
            save(data)
            raise
    return data


def print_probes(record: dict) -> None:
    """One line: each replay's scale (``#2`` a repeat), verdict and worst p99/bound; the case's time and host."""
    def one(p: dict) -> str:
        repeat = f"#{p['attempt'] + 1}" if p["attempt"] else ""
        violation = "inf" if p["violation"] is None else f"{p['violation']:.2f}"
        late = " (sender late)" if (p.get("late_share") or 0.0) > cc.LATE_SHARE else ""
        return f"{p['scale']:.2f}x{repeat} {'met' if p['ok'] else 'missed'} {violation}{late}"
    notes = "; ".join(record["notes"])
    others = others_cores(record)
    print("  " + ", ".join(map(one, record["probes"])) + f"; {record['seconds']:.0f} s, steal "
          f"{record['steal_share']:.1%}, load average {record['load_average_1m']:.1f}" +
          (f", other tenants {others:.2f} cores" if others is not None else "") + (f"; {notes}" if notes else ""),
          flush=True)


def others_cores(record: dict) -> float | None:
    """The median over a case's replays of the cores the machine was busy beyond ours (other tenants): what a quiet
    machine has near 0 and a shared one does not (None for data saved without it)."""
    busy = [p["machine_cores"] - p["host_cores"] for p in record["probes"]
            if p.get("machine_cores") is not None and p.get("host_cores") is not None]
    return statistics.median(busy) if busy else None


def figures(found, offered_rps: float) -> dict:
    """A bisection's capacity (req/s): interpolated (``rps``) and the rung's (``rung_rps``), how it was placed, its
    repeat crossings and spread, the bracket's scales. ``interval``: the prediction interval, where one is given."""
    inner: Interpolated = interpolate(found)
    bracket = [s.scale if s is not None else None for s in (found.met, found.failed)]
    return {"rps": inner.scale * offered_rps, "rung_rps": found.capacity_scale * offered_rps, "scale": inner.scale,
            "rung_scale": found.capacity_scale,
            "how": inner.how, "capped": found.capped, "bracket": bracket, "spread": inner.spread,
            "repeats_rps": [r * offered_rps for r in inner.repeats], "probes": len(found.probes), "interval": None}


def evaluate(data: dict) -> list[dict]:
    """Every configuration of ``data``: the measured capacity (its bisection replayed from the saved verdicts) and
    the full model's and the baseline's (bisected on the simulator now), each side's relative error, and the full
    model's capacity interval (:func:`interval_of`). A configuration whose bisection was cut short (a partial run) is
    left out, said so."""
    profile = Profile.from_json(data["profile"], "saved profile")
    device = profile.request_device or "cpu"
    models = {"full": profile, "baseline": with_law(profile, device, Law("none"))}
    ladder, repeats = Ladder(**data["ladder"]), Repeats(**data["repeats"])
    sigma, where = host_sigma(profile)
    replications = Replications(MODES[data["mode"]].replications, CONFIDENCE, sigma, seed=cc.SEED)
    print(f"  the full model's {CONFIDENCE:.0%} capacity intervals: {replications.count} replications on the same "
          f"schedules, each its own simulator seed and host speed; host spread {sigma:.1%} ({where})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="capacity-loads-") as tmp:
        for record in data["cases"]:
            load, slos = cc.case_load(record["load"], Path(tmp)), cc.slos_of(record["load"])
            try:
                real = bisect_capacity(cc.saved_probe(record["probes"]), ladder, repeats)
            except KeyError:
                print(f"  {record['name']}: its bisection did not finish (a partial run): left out")
                continue
            offered = load.offered_rps
            row = {"name": record["name"], "group": record["group"], "held_out": record["held_out"],
                   "offered_rps": offered, "slos": slos, "measured": figures(real, offered),
                   "other_tenants_cores": others_cores(record), "load_average_1m": record["load_average_1m"]}
            config = config_from_json(record["serving"])
            for side, model in models.items():
                found = bisect_capacity(cc.sim_probe(model, config, load, slos), ladder, repeats)
                row[side] = figures(found, offered)
                measured = row["measured"]["rps"]
                row[side]["error"] = row[side]["rps"] / measured - 1 if measured > 0 else None
            question = CapacityQuestion(profile, config, load, slos, ladder, cc.MAX_FAILED, same_load=True)
            row["full"]["interval"] = interval_of(question, replications, row)
            rows.append(row)
    return rows


def interval_of(question: CapacityQuestion, replications: Replications, row: dict) -> dict:
    """The full model's capacity interval for ``row`` in req/s (``capacity_interval``: every replication replays the
    case's schedule, its search starting at the full model's rung), against the measured capacity: the interval of
    the replications' capacities placed inside their brackets as the measured one is (``crossings``), open above
    where a replication met the SLOs at the ladder's top."""
    offered, ladder = row["offered_rps"], question.ladder
    found = capacity_interval(question, replications, start_scale=row["full"]["rung_scale"])
    top = ladder.scale(ladder.i_max)
    if found.crossing_low is None or found.crossing_high is None:
        low, high = None, math.inf
    elif any(found.capped) and found.crossing_high >= top * (1 - 1e-9):
        low, high = found.crossing_low * offered, math.inf
    else:
        low, high = found.crossing_low * offered, found.crossing_high * offered
    return {**cs.interval_figures(low, high, row["measured"]), "probes": found.probes,
            "capacities_rps": [c * offered for c in found.capacities], "capped": list(found.capped),
            "extrapolated": found.extrapolated,
            "ceiling_rps": None if found.ceiling is None else found.ceiling * offered}




def saved(path: str) -> dict:
    """The measurements an earlier run saved at ``path``; :class:`InputError` (one line) where it is not such a file."""
    data = read_json(path, "saved measurements")
    for key in ("mode", "profile", "ladder", "repeats", "cases"):
        if not isinstance(data, dict) or key not in data:
            raise InputError(path, key, "missing; expected the measurements capacity_fidelity.py saves (its _data "
                                        "JSON)")
    if data["mode"] not in MODES:
        raise InputError(path, "mode", f"expected one of {', '.join(MODES)}, got {data['mode']!r}")
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="five configurations, shorter runs (under 8 minutes)")
    size.add_argument("--smoke", action="store_true", help="two configurations, a coarse ladder: the code path only")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    parser.add_argument("--data", help="evaluate the measurements an earlier run saved (its _data JSON) instead")
    args = parser.parse_args()
    if args.data:
        data_path = args.data
        data = saved(data_path)
        quick = data["mode"] == "quick"
        name = "capacity_fidelity" + ("_smoke" if data["mode"] == "smoke" else "")
    else:
        name = "capacity_fidelity" + ("_smoke" if args.smoke else "")
        mode = MODES["smoke" if args.smoke else "quick" if args.quick else "full"]
        quick = args.quick

        def save(measured: dict) -> Path:
            return write_result(f"{name}_data", measured, quick=quick, out_dir=args.out, compressed=True)
        data = measure(mode, cc.chosen(mode.name), save)
        data_path = str(save(data))
        print(f"measurements: {data_path}")
    if data.get("partial"):
        print(f"a partial run ({data['partial']}): the configurations it finished")
    stage("the same bisections on the simulator (full model and baseline)")
    rows = evaluate(data)
    found = cs.scores(rows)
    cs.print_rows(rows, GROWTH)
    print_calibration(data)
    cs.print_scores(rows, found)
    met = cs.verdicts(found)
    print("targets (issue 44; quiet machine, full run): " + ", ".join(
        f"{k} {'met' if ok else 'not met'}" for k, ok in met.items()))
    path = write_result(name, {"rows": rows, "scores": found, "targets": cs.TARGETS, "met": met, "growth": GROWTH,
                               "mode": data["mode"], "partial": data.get("partial"), "data": data_path},
                        quick=quick, out_dir=args.out, timed=not args.data,
                        same_suffix_as=None if args.data else Path(data_path))
    print(f"results: {path}")
    print(cs.last_line(found))
    return 0


def print_calibration(data: dict) -> None:
    """The runs the profile's law was fitted to (none of them a held-out configuration)."""
    runs = Profile.from_json(data["profile"], "saved profile").calibration
    if runs:
        print("the profile's law was fitted to: " + "; ".join(Observation.from_json(o).label() for o in runs))
    else:
        print("the profile has no calibration runs (its law as measured alone)")


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except InputError as err:  # saved measurements that cannot be read: one line, exit 2
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
