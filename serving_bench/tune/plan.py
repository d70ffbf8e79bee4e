"""``serving-bench plan FORECAST.yaml``: for each growth factor of a load, the fewest GPUs (and the configuration
of each GPU) that meet the SLOs, with headroom and utilisation.

Forecast file (YAML; relative paths are relative to it)::

    load: demo.yaml              # load profile (serving-bench replay's format) or a saved schedule .npz
    profile: h200.json           # simulator profile of the hardware to plan for (it need not be present);
                                 # builtin:h200-eager is the bundled H200 torch eager-mode table
    growth: [1, 2, 5, 10]        # multiples of the load (the load's shape in time is kept)
    growth_rule: superpose       # how the load grows: superpose (more independent users; default) or scale (the
                                 # same users sending more); serving-bench plan --growth overrides it
    slos: {resnet50: {p99: 50ms}}  # optional; default: the load profile's slos
    max_gpus: 64                 # give up above this many GPUs per growth factor
    grouping: auto               # auto | together | separate: which models may share a GPU
    search:                      # candidate knob values per GPU
      instances: [1, 2, 4]
      max_batch_size: [1, 8, 32]
      max_queue_delay_us: [0, 2000]
      preferred: [none]
    max_evals: 40                # configurations evaluated per model group
    seed: 1                      # optional; default: the load profile's seed
    screen: auto                 # optional; a long load's group searches rank on a screen of it first (as tune)

Method: the traffic is split into groups of models that share GPUs (``together``: one group; ``separate``: one per
model; ``auto``: both extremes, which for two models are all the partitions). For each group the search
finds the single-GPU configuration with the largest *capacity* c (the largest multiple of the group's load at which
its SLOs hold on one GPU). At growth g a group needs n = ceil(g / c) GPUs, each taking 1/n of the group's traffic
(even load balancing); a layout's GPUs are the sum over its groups, and the plan takes the layout with the fewest
(then the most headroom). Each planned GPU is then simulated at its share of the grown load (g / n of the load, grown
by the growth rule); if it misses an SLO
(capacity is only known to one rung of the ladder) one more GPU is added. Headroom = n c / g - 1; utilisation =
g / (n c), the fraction of a GPU's SLO-bound capacity the load uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving_bench.errors import InputError
from serving_bench.files import atomic_write_text
from serving_bench.report.cli import write_report
from serving_bench.run.metrics import summarize
from serving_bench.run.results import hold_results
from serving_bench.serving_config import ServingConfig
from serving_bench.sim.intervals import IntervalOptions, Replications, add_interval_options, described
from serving_bench.tune import adapters
from serving_bench.tune.capacity import Ladder
from serving_bench.tune.checkpoint import Checkpoint, file_id
from serving_bench.tune.executors import EXECUTORS, make_executor
from serving_bench.tune.forecast import Forecast, load_forecast
from serving_bench.tune.generators import choose_generator
from serving_bench.tune.intervals import CapacityInterval, CapacityQuestion, capacity_interval
from serving_bench.tune.load import GROWTHS, Load, load_from_file, restrict
from serving_bench.tune.objective import EvalContext, ObjectiveConfig, check_slos
from serving_bench.tune.recommend import config_dict, describe_model
from serving_bench.tune.search import (DEFAULT_FINALISTS, SearchSettings, confirm, confirm_checkpoint, run_search,
                                       screen_context, search_header)
from serving_bench.tune.slo import resolve_slos
from serving_bench.tune.space import SearchSpace, knobs_for


def partitions(items: list[str]):
    """Every set partition of ``items`` (as tuples of tuples, in a fixed order)."""
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for part in partitions(rest):
        yield ((first,),) + part
        for i in range(len(part)):
            yield part[:i] + ((first,) + part[i],) + part[i + 1:]


def layouts(units: list[str], grouping: str) -> list[tuple[tuple[str, ...], ...]]:
    """Candidate groupings of the traffic units into GPU pools."""
    together, separate = (tuple(units),), tuple((u,) for u in units)
    if grouping == "together" or len(units) == 1:
        return [together]
    if grouping == "separate":
        return [separate]
    if len(units) <= 2:
        return [tuple(tuple(sorted(g)) for g in p) for p in partitions(units)]
    return [together, separate]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("forecast", metavar="FORECAST.yaml", help="forecast file (see docs/tune.md)")
    parser.add_argument("--out", default="results/plan", help="output folder (default results/plan)")
    parser.add_argument("--executor", choices=tuple(EXECUTORS), default="local")
    parser.add_argument("--ray-address", help="existing Ray cluster (default: start a local Ray)")
    parser.add_argument("--ray-cpus", type=int, help="CPUs for a local Ray (default: all)")
    parser.add_argument("--restart", action="store_true", help="discard existing checkpoints instead of resuming")
    parser.add_argument("--growth", choices=tuple(GROWTHS),
                        help="how the load grows (overrides the forecast's growth_rule; default superpose: more "
                             "independent users; scale: the same users sending more)")
    parser.add_argument("--quiet", action="store_true")
    add_interval_options(parser)


@dataclass
class GroupCapacity:
    """The best single-GPU configuration for one group of models."""

    models: tuple[str, ...]
    config: ServingConfig
    capacity_scale: float
    capped: bool
    evaluated: int
    params: dict
    ladder: Ladder


@dataclass(frozen=True)
class PlanInputs:
    """What every group's sizing reads: the load at 1x, the profile, the serving config it starts from, the SLOs
    (model -> stat -> bound, s) and the forecast."""

    load: Load
    profile: Any
    base: ServingConfig
    slos: dict
    forecast: Forecast


def group_capacity(group: tuple[str, ...], inputs: PlanInputs, executor, out: Path, restart: bool,
                   log) -> GroupCapacity:
    """Search the single-GPU configuration of ``group`` with the largest capacity (checkpointed per group)."""
    load, profile, base, slos, forecast = inputs.load, inputs.profile, inputs.base, inputs.slos, inputs.forecast
    sub_load = restrict(load, group)
    members = [m for m in base.names if m in _members(base, group)]
    sub_base = ServingConfig(tuple(base[m] for m in members), tuple(e for e in base.ensembles if e[0] in group),
                             tuple(d for d in base.ensemble_deps if d[0] in group))
    s = forecast.search
    on_gpu = all(profile.devices[d].kind == "gpu" for m in sub_base.models for d, _ in m.instances)
    caps = {m: adapters.max_servable_batch(profile, m, [d for d, _ in sub_base[m].instances]) for m in members}
    space = SearchSpace(sub_base, knobs_for(members, instances=s["instances"], max_batch_size=s["max_batch_size"],
                                            max_queue_delay_us=s["max_queue_delay_us"], preferred=s["preferred"],
                                            base=sub_base, caps=caps), gpus=1 if on_gpu else 0)
    group_slos = slos_of(slos, group)
    objective = ObjectiveConfig("capacity", max_scale=max(forecast.growth),
                                min_scale=min(forecast.growth) / forecast.max_gpus)
    ctx = EvalContext(space, profile, sub_load, group_slos, objective)
    settings = SearchSettings(seed=load.seed, max_evals=forecast.max_evals)
    choice = choose_generator("auto", space)
    name = "+".join(group)
    search_ctx, fraction = screen_context(ctx, forecast.screen)
    checkpoint = Checkpoint(out / "groups" / f"{_safe(name)}.jsonl",
                            search_header(search_ctx, choice, settings, file_id(forecast.profile)))
    result = searched = run_search(search_ctx, executor, settings, checkpoint=checkpoint, restart=restart,
                                   choice=choice)
    if search_ctx is not ctx:  # the best screened candidates on the group's whole load (tune.search.confirm)
        confirmed = confirm_checkpoint(out / "groups" / f"{_safe(name)}.confirmed.jsonl", ctx, choice, settings,
                                       file_id(forecast.profile), checkpoint)
        result = confirm(ctx, executor, result, DEFAULT_FINALISTS, checkpoint=confirmed, restart=restart)
        log(f"  group {name}: screened on {fraction:.1%} of its load's time; the best "
            f"{result.evaluated + result.resumed} simulated on all of it")
    best = result.best
    log(f"  group {name}: {searched.evaluated} evaluated ({searched.resumed} resumed, {choice.name}); best capacity "
        f"{best['result']['capacity_scale']:.3g}× ({load.growth}) of its load on one GPU")
    return GroupCapacity(group, space.config(best["params"]), best["result"]["capacity_scale"],
                         best["result"]["capacity_capped"], searched.evaluated + searched.resumed, best["params"],
                         objective.ladder)


def slos_of(slos: dict, models) -> dict:
    """The SLOs (model -> stat -> bound, s) of ``models``, each a copy."""
    return {m: dict(v) for m, v in slos.items() if m in models}


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-+" else "_" for c in name)[:120]


def _members(base: ServingConfig, group) -> set[str]:
    ens = base.ensemble_map
    out = set()
    for unit in group:
        out.update(ens.get(unit, (unit,)))
    return out


def check_gpu(cap: GroupCapacity, load: Load, profile, slos: dict, share: float, seed: int) -> tuple[bool, dict]:
    """Simulate one GPU of a group at ``share`` of the group's load: (SLOs met, per-model figures)."""
    sub = restrict(load, cap.models)
    records = adapters.simulate(profile, cap.config, sub.at(share), seed)
    group_slos = slos_of(slos, cap.models)
    summary = summarize(records, slos=group_slos)
    met, _ = check_slos(summary, group_slos, ObjectiveConfig().max_failed_fraction)
    figures = {m: {"p50_s": s["p50_s"], "p99_s": s["p99_s"], "throughput_rps": s["throughput_rps"]}
               for m, s in summary["models"].items()}
    util = adapters.utilisation(records, summary)
    if util is not None:
        figures["_utilisation"] = util
    return met, figures


def gpus_needed(g: float, capacity: float) -> int:
    """GPUs that carry growth ``g`` of a group whose single-GPU capacity is ``capacity`` (> 0): ceil(g / c)."""
    return max(1, math.ceil(g / capacity - 1e-9))


def plan_growth(g: float, caps: dict, layout_list, load: Load, profile, slos: dict, forecast: Forecast) -> dict:
    """The cheapest layout at growth ``g`` with its per-group GPU counts, checked by simulation."""
    best = None
    for lay in layout_list:
        groups = []
        total = 0
        for group in lay:
            cap = caps[group]
            if cap.capacity_scale <= 0:
                total = math.inf
                break
            n = gpus_needed(g, cap.capacity_scale)
            groups.append((group, n))
            total += n
        if total == math.inf or total > forecast.max_gpus:
            continue
        headroom = min(n * caps[group].capacity_scale / g - 1 for group, n in groups)
        key = (total, -headroom)
        if best is None or key < best[0]:
            best = (key, groups)
    offered = load.offered_rps * g
    if best is None:
        return {"growth": g, "gpus": None, "offered_rps": offered, "headroom": None, "utilisation": None, "unit": "GPU",
                "layout": f"not possible within {forecast.max_gpus} GPUs", "groups": []}
    rows = []
    for group, n in best[1]:
        cap = caps[group]
        for _ in range(8):  # capacity is known to one rung: add a GPU if the check misses
            met, figures = check_gpu(cap, load, profile, slos, g / n, 0)
            if met:
                break
            n += 1
        rows.append({"models": list(group), "gpus": n, "config": config_dict(cap.config),
                     "capacity_scale": cap.capacity_scale, "capacity_capped": cap.capped,
                     "headroom": n * cap.capacity_scale / g - 1, "utilisation": g / (n * cap.capacity_scale),
                     "slo_met": met, "per_gpu": figures})
    total = sum(r["gpus"] for r in rows)
    at_least = any(r["capacity_capped"] for r in rows)  # capacity only known to be >= the largest scale searched
    unit = "GPU" if all(info.kind == "gpu" for info in profile.devices.values()) else "device"
    layout = " + ".join(f"{r['gpus']}× {unit}[" + "; ".join(describe_model(cap_model) for cap_model in
                                                          caps[tuple(r['models'])].config.models) + "]" for r in rows)
    return {"growth": g, "gpus": total, "offered_rps": offered, "headroom": min(r["headroom"] for r in rows),
            "utilisation": max(r["utilisation"] for r in rows), "layout": layout, "groups": rows,
            "slo_met": all(r["slo_met"] for r in rows), "unit": unit, "capped": at_least}


def group_interval(cap: GroupCapacity, inputs: PlanInputs, replications: Replications) -> CapacityInterval | None:
    """``cap``'s capacity searched again in each of ``replications`` (:func:`~serving_bench.tune.intervals.
    capacity_interval`: each its own realisation of the group's load, simulator seed and host speed); None where the
    configuration meets the SLOs at no scale searched."""
    if cap.capacity_scale <= 0:
        return None
    question = CapacityQuestion(inputs.profile, cap.config, restrict(inputs.load, cap.models),
                                slos_of(inputs.slos, cap.models), cap.ladder)
    return capacity_interval(question, replications, cap.capacity_scale)


def add_row_interval(row: dict, found: dict[tuple[str, ...], CapacityInterval | None]) -> None:
    """Into a planned ``row``: per group and in all, the GPUs its capacity interval's ends need (``gpus_interval``:
    [at the high end, at the low end], None at an end that is 0: no GPU count carries it), ``sufficient_share``,
    the share of the replications in which the planned GPUs carry the grown load (every group's GPUs their
    group's), and ``extrapolated``: a group's interval reached above the busiest load its profile measured."""
    groups = [(tuple(r["models"]), r["gpus"]) for r in row["groups"]]
    if not groups or any(found.get(group) is None for group, _ in groups):
        return
    g = row["growth"]
    for r, (group, _) in zip(row["groups"], groups):
        r["gpus_interval"] = [gpus_needed(g, c) if c else None for c in (found[group].high, found[group].low)]
    ends = [r["gpus_interval"] for r in row["groups"]]
    row["gpus_interval"] = [None if None in column else sum(column) for column in zip(*ends)]
    row["extrapolated"] = any(found[group].extrapolated for group, _ in groups)
    count = len(found[groups[0][0]].capacities)
    row["sufficient_share"] = sum(all(n * found[group].capacities[i] >= g * (1 - 1e-9) for group, n in groups)
                                  for i in range(count)) / count


def row_interval_text(row: dict, replications: Replications) -> str:
    """A row's ``add_row_interval`` figures in words ('' where it has none)."""
    if "sufficient_share" not in row:
        return ""
    low, high = (n if n is not None else "∞" for n in row["gpus_interval"])
    ends = f"{low}" if low == high else f"{low}–{high}"
    n = row["gpus"]
    return (f" {n} {row['unit']}{' carries' if n == 1 else 's carry'} it in {row['sufficient_share'] * 100:.0f} % "
            f"of {replications.count} replications; the capacity's {replications.confidence * 100:.0f} % interval "
            f"needs {ends}" + (" (its low end is the busiest load the profile measured: above it the simulator "
                               "extrapolates)." if row.get("extrapolated") else "."))


def run_plan(forecast: Forecast, out: str | Path, executor_name: str = "local", ray_address: str | None = None,
             ray_cpus: int | None = None, restart: bool = False, quiet: bool = False,
             intervals: IntervalOptions = IntervalOptions()) -> dict:
    """Plan every growth factor, each with how sure its GPU count is over ``intervals``' replications (none for 0
    replications); writes ``OUT/plan.json`` and returns it."""
    def log(text: str) -> None:
        if not quiet:
            print(text, flush=True)

    t0 = time.perf_counter()
    out = Path(out)
    load = load_from_file(forecast.load, seed=forecast.seed, duration_s=forecast.duration_s,
                          growth=forecast.growth_rule)

    slos = forecast.slos or resolve_slos(None, load.base)
    for model in slos:
        if model not in load.base.models:
            raise InputError(forecast.path, f"slos.{model}",
                             f"not a model of the load; models: {', '.join(load.base.models)}")
    profile = adapters.load_profile(forecast.profile)
    if any(info.kind == "gpu" for info in profile.devices.values()):
        profile = adapters.with_gpus(profile, 1)
    hardware = adapters.profile_description(profile)
    replications, spread_source = intervals.resolve(profile, load.seed)  # before the search: a bad option is named
    base = adapters.config_from_profile(profile, load.base.models)
    units = list(load.base.models)
    layout_list = layouts(units, forecast.grouping)
    groups = sorted({g for lay in layout_list for g in lay})
    log(f"plan: {len(units)} models, growth {', '.join(f'{g:g}×' for g in forecast.growth)}, {len(groups)} model "
        f"groups to size on one GPU ({hardware})")
    out.mkdir(parents=True, exist_ok=True)
    caps = {}
    inputs = PlanInputs(load, profile, base, slos, forecast)
    with make_executor(executor_name, address=ray_address, num_cpus=ray_cpus) as executor:
        for group in groups:
            caps[group] = group_capacity(group, inputs, executor, out, restart, log)
    rows = [plan_growth(g, caps, layout_list, load, profile, slos, forecast) for g in forecast.growth]
    found: dict[tuple[str, ...], CapacityInterval | None] = {}
    if replications is not None:
        planned = sorted({tuple(r["models"]) for row in rows for r in row["groups"]})
        log(f"  capacity intervals: each planned group's capacity searched again in {replications.count} "
            f"replications, each its own realisation of the load, simulator seed and host speed (host spread "
            f"{replications.host_sigma * 100:.1f} %: {spread_source})")
        found = {group: group_interval(caps[group], inputs, replications) for group in planned}
        for row in rows:
            add_row_interval(row, found)
    lines = [f"Capacity plan for {Path(forecast.load).name} on {hardware}, SLOs " +
             "; ".join(f"{m} " + ", ".join(f"{s} ≤ {b * 1e3:g} ms" for s, b in st.items()) for m, st in slos.items())
             + f"; the load grown by {load.growth} ({GROWTHS[load.growth]})."]
    for row in rows:
        if row["gpus"] is None:
            lines.append(f"{row['growth']:g}× ({row['offered_rps']:,.0f} req/s): not possible within "
                         f"{forecast.max_gpus} GPUs with the searched settings.")
        else:
            lines.append(f"{row['growth']:g}× ({row['offered_rps']:,.0f} req/s): {row['gpus']} {row['unit']}"
                         f"{'s' if row['gpus'] != 1 else ''} — {row['layout']}; headroom "
                         f"{'≥ ' if row.get('capped') else ''}{row['headroom'] * 100:.0f} %, load at "
                         f"{'≤ ' if row.get('capped') else ''}{row['utilisation'] * 100:.0f} % of SLO capacity"
                         + (" (capacity searched up to the largest growth factor)." if row.get("capped") else ".")
                         + row_interval_text(row, replications))
    doc = {"forecast": forecast.path, "load": forecast.load, "profile": forecast.profile, "hardware": hardware,
           "hardware_note": f"Simulated with the profile {Path(forecast.profile).name}: {hardware}; the load grown "
                            f"by {load.growth} ({GROWTHS[load.growth]}).",
           "slos": slos, "growth": list(forecast.growth), "growth_rule": load.growth, "grouping": forecast.grouping,
           "groups": [{"models": list(c.models), "capacity_scale": c.capacity_scale, "capped": c.capped,
                       "evaluated": c.evaluated, "config": config_dict(c.config),
                       "capacity_interval": found[c.models].to_json() if found.get(c.models) else None}
                      for c in caps.values()],
           "replications": described(replications, spread_source, "each its own realisation of the load")
           if replications is not None else None,
           "rows": rows, "recommendation": lines, "wall_s": time.perf_counter() - t0}
    atomic_write_text(out / "plan.json", json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    for line in lines:
        log(line)
    return doc


def main(args: argparse.Namespace) -> int:
    forecast = load_forecast(args.forecast)
    if args.growth:
        forecast = dataclasses.replace(forecast, growth_rule=args.growth)
    with hold_results(args.out, 0):  # held for the run: checkpoints and plan.json (no results folder of requests)
        doc = run_plan(forecast, args.out, args.executor, args.ray_address, args.ray_cpus, args.restart, args.quiet,
                       IntervalOptions.from_args(args))
        if not args.quiet:
            print(f"report: {write_report(args.out, title='serving-bench capacity plan')}")
    return 0 if all(r["gpus"] is not None for r in doc["rows"]) else 1
