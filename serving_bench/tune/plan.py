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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving_bench.errors import InputError
from serving_bench.files import atomic_write_text, read_yaml
from serving_bench.report.cli import write_report
from serving_bench.run.metrics import summarize
from serving_bench.run.results import hold_results
from serving_bench.serving_config import ServingConfig
from serving_bench.tune import adapters
from serving_bench.tune.checkpoint import Checkpoint, file_id
from serving_bench.tune.executors import EXECUTORS, make_executor
from serving_bench.tune.generators import choose_generator
from serving_bench.tune.load import GROWTHS, SCREEN_FORM, Load, load_from_file, restrict, screen_asked
from serving_bench.tune.objective import EvalContext, ObjectiveConfig, check_slos
from serving_bench.tune.recommend import config_dict, describe_model
from serving_bench.tune.search import (DEFAULT_FINALISTS, SearchSettings, confirm, confirm_checkpoint, run_search,
                                       screen_context, search_header)
from serving_bench.tune.slo import resolve_slos, slos_from_mapping
from serving_bench.tune.space import PREFERRED_RULES, SearchSpace, knobs_for

GROUPINGS = ("auto", "together", "separate")
SEARCH_KEYS = {"instances": int, "max_batch_size": int, "max_queue_delay_us": int, "preferred": str}


@dataclass(frozen=True)
class Forecast:
    path: str
    load: str
    profile: str
    growth: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0)
    slos: dict | None = None
    max_gpus: int = 64
    grouping: str = "auto"
    search: dict = field(default_factory=lambda: {"instances": (1, 2, 4), "max_batch_size": (1, 8, 32),
                                                  "max_queue_delay_us": (0, 2000), "preferred": ("none",)})
    max_evals: int = 40
    seed: int | None = None
    duration_s: float | None = None
    screen: str | float = "auto"
    growth_rule: str = "superpose"


def load_forecast(path: str | Path) -> Forecast:
    """Parse and check a forecast file; any problem is one :class:`InputError` line (file, field, expected)."""
    path = Path(path)
    data = read_yaml(path, "forecast")
    if not isinstance(data, dict):
        raise InputError(path, None, "expected a mapping with load, profile and growth")
    known = {"load", "profile", "growth", "growth_rule", "slos", "max_gpus", "grouping", "search", "max_evals", "seed",
             "duration_s", "screen"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(path, unknown[0], f"unknown field; expected one of {', '.join(sorted(known))}")
    here = path.parent

    def file_field(name: str) -> str:
        value = data.get(name)
        if not isinstance(value, str) or not value:
            raise InputError(path, name, "expected a file path")
        resolved = (here / value) if not Path(value).is_absolute() else Path(value)
        if not resolved.is_file():
            raise InputError(path, name, f"{value}: file not found (relative to the forecast file)")
        return str(resolved)

    profile_value = data.get("profile")
    if isinstance(profile_value, str) and profile_value.startswith("builtin:"):
        if profile_value not in adapters.BUILTIN_PROFILES:
            raise InputError(path, "profile", f"{profile_value!r}: expected a file or one of "
                                              f"{', '.join(adapters.BUILTIN_PROFILES)}")
        profile_path = profile_value
    else:
        profile_path = file_field("profile")
    growth = data.get("growth", [1, 2, 5, 10])
    if not isinstance(growth, list) or not growth or not all(
            isinstance(g, (int, float)) and not isinstance(g, bool) and g > 0 for g in growth):
        raise InputError(path, "growth", "expected a list of positive numbers, e.g. [1, 2, 5, 10]")
    slos = slos_from_mapping(data["slos"], str(path), "slos") if data.get("slos") is not None else None

    def int_field(name: str, default: int, minimum: int) -> int:
        value = data.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise InputError(path, name, f"expected an integer >= {minimum}")
        return value

    grouping = data.get("grouping", "auto")
    if grouping not in GROUPINGS:
        raise InputError(path, "grouping", f"expected one of {', '.join(GROUPINGS)}")
    growth_rule = data.get("growth_rule", "superpose")
    if growth_rule not in GROWTHS:
        raise InputError(path, "growth_rule", f"expected one of {', '.join(GROWTHS)}")
    search = dict(Forecast.__dataclass_fields__["search"].default_factory())
    given = data.get("search") or {}
    if not isinstance(given, dict):
        raise InputError(path, "search", f"expected a mapping of {', '.join(SEARCH_KEYS)} to lists")
    for key, values in given.items():
        if key not in SEARCH_KEYS:
            raise InputError(path, f"search.{key}", f"unknown knob; expected one of {', '.join(SEARCH_KEYS)}")
        kind = SEARCH_KEYS[key]
        if not isinstance(values, list) or not values or not all(isinstance(v, kind) and not isinstance(v, bool)
                                                                 for v in values):
            raise InputError(path, f"search.{key}", f"expected a non-empty list of {kind.__name__} values")
        if key == "preferred" and any(v not in PREFERRED_RULES for v in values):
            raise InputError(path, f"search.{key}", f"expected values among {', '.join(PREFERRED_RULES)}")
        if kind is int and any(v < (1 if key == "instances" else 0) for v in values):
            raise InputError(path, f"search.{key}", "expected values >= 1" if key == "instances" else
                             "expected values >= 0")
        search[key] = tuple(values)
    duration = data.get("duration_s")
    if duration is not None and (not isinstance(duration, (int, float)) or duration <= 0):
        raise InputError(path, "duration_s", "expected a positive number of seconds")
    try:
        screen_value = screen_asked(data.get("screen", "auto"))
    except ValueError:
        raise InputError(path, "screen", f"expected {SCREEN_FORM}") from None
    return Forecast(str(path), file_field("load"), profile_path, tuple(float(g) for g in growth), slos,
                    int_field("max_gpus", 64, 1), grouping, search, int_field("max_evals", 40, 1),
                    None if data.get("seed") is None else int_field("seed", 0, 0),
                    None if duration is None else float(duration), screen_value, growth_rule)


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


@dataclass
class GroupCapacity:
    """The best single-GPU configuration for one group of models."""

    models: tuple[str, ...]
    config: ServingConfig
    capacity_scale: float
    capped: bool
    evaluated: int
    params: dict


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
    group_slos = {m: v for m, v in slos.items() if m in group}
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
                         best["result"]["capacity_capped"], searched.evaluated + searched.resumed, best["params"])




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
    group_slos = {m: dict(v) for m, v in slos.items() if m in cap.models}
    summary = summarize(records, slos=group_slos)
    met, _ = check_slos(summary, group_slos, ObjectiveConfig().max_failed_fraction)
    figures = {m: {"p50_s": s["p50_s"], "p99_s": s["p99_s"], "throughput_rps": s["throughput_rps"]}
               for m, s in summary["models"].items()}
    util = adapters.utilisation(records, summary)
    if util is not None:
        figures["_utilisation"] = util
    return met, figures


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
            n = max(1, math.ceil(g / cap.capacity_scale - 1e-9))
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


def run_plan(forecast: Forecast, out: str | Path, executor_name: str = "local", ray_address: str | None = None,
             ray_cpus: int | None = None, restart: bool = False, quiet: bool = False) -> dict:
    """Plan every growth factor; writes ``OUT/plan.json`` and returns it."""
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
                         + (" (capacity searched up to the largest growth factor)." if row.get("capped") else "."))
    doc = {"forecast": forecast.path, "load": forecast.load, "profile": forecast.profile, "hardware": hardware,
           "hardware_note": f"Simulated with the profile {Path(forecast.profile).name}: {hardware}; the load grown "
                            f"by {load.growth} ({GROWTHS[load.growth]}).",
           "slos": slos, "growth": list(forecast.growth), "growth_rule": load.growth, "grouping": forecast.grouping,
           "groups": [{"models": list(c.models), "capacity_scale": c.capacity_scale, "capped": c.capped,
                       "evaluated": c.evaluated, "config": config_dict(c.config)} for c in caps.values()],
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
        doc = run_plan(forecast, args.out, args.executor, args.ray_address, args.ray_cpus, args.restart, args.quiet)
        if not args.quiet:
            print(f"report: {write_report(args.out, title='serving-bench capacity plan')}")
    return 0 if all(r["gpus"] is not None for r in doc["rows"]) else 1
