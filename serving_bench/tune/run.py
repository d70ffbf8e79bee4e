"""``run_tune(TuneOptions(...))``: the whole tune, as ``serving-bench tune`` runs it (:mod:`serving_bench.tune.cli`
has the command's options and its documentation).

The steps: the question set up (:func:`_set_up`: the load, SLOs, profile, search space and objective), the search on
the simulator (:func:`_search`: screened on a long load, then confirmed), the pick's capacity interval, the
verification on Triton (:func:`verify_top`), and ``OUT/tune.json`` with the recommendation (:func:`_document`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tqdm import tqdm

from serving_bench.errors import InputError, OutputError, require_count
from serving_bench.files import atomic_write_text, rescue_folder
from serving_bench.report.cli import write_report
from serving_bench.run.results import hold_results
from serving_bench.serving_config import ServingConfig, cpu_cores
from serving_bench.sim.client import client_cpu_s, through_client
from serving_bench.sim.intervals import (DEFAULT_CONFIDENCE, DEFAULT_REPLICATIONS, IntervalOptions, Replications,
                                         described, host_sigma, replications_from)
from serving_bench.tune import adapters
from serving_bench.tune import verify
from serving_bench.tune.checkpoint import Checkpoint, file_id
from serving_bench.tune.executors import make_executor
from serving_bench.tune.generators import choose_generator
from serving_bench.tune.intervals import CapacityQuestion, capacity_interval
from serving_bench.tune.load import GROWTHS, Load, load_from_file, load_size
from serving_bench.tune.objective import EvalContext, ObjectiveConfig, check_slos
from serving_bench.tune.build import BuiltSpace, SpaceAsk, build_space
from serving_bench.tune.recommend import Asked, config_dict, tune_recommendation
from serving_bench.tune.search import (DEFAULT_FINALISTS, SearchSettings, confirm, confirm_checkpoint, run_search,
                                       screen_context, search_header)
from serving_bench.tune.slo import resolve_slos
from serving_bench.tune.space import SearchSpace
from serving_bench.tune.variants import renamed_config
from serving_bench.tune.why import estimate_line, require_energy, variants_section, why_lines

DEFAULT_BUDGET_MINUTES = 3.0  # the search's default budget (--budget-minutes; 0: none)


@dataclass(frozen=True)
class TuneOptions:
    """Everything ``serving-bench tune`` takes (the demo builds one directly)."""

    load: str
    profile: str
    out: str = "results/tune"
    slos: str | None = None
    repo: str | None = None
    models: tuple[str, ...] = ()
    gpus: int = 0
    objective: str = "throughput"
    instances: tuple[int, ...] = (1, 2)
    max_batch_sizes: tuple[int, ...] = (1, 8, 32)
    queue_delays_us: tuple[int, ...] = (0, 1000)
    preferred: tuple[str, ...] = ("none",)
    generator: str = "auto"
    executor: str = "local"
    workers: int = 1
    ray_address: str | None = None
    ray_cpus: int | None = None
    budget_minutes: float | None = DEFAULT_BUDGET_MINUTES  # None or 0: no budget
    max_evals: int | None = None
    batch: int = 4
    seed: int | None = None
    max_scale: float = 16.0
    growth: str = "superpose"
    screen: str | float = "auto"
    finalists: int = DEFAULT_FINALISTS
    duration_s: float | None = None
    verify_top: int = 1
    url: str | None = None
    restart: bool = False
    report: bool = True
    quiet: bool = False
    client_cpu_us: float = 0.0
    threads_per_instance: int | None = None  # None: the embedded server's default for each candidate
    max_requests: int = adapters.MAX_REQUESTS  # the load's bound at scale 1 (--max-requests)
    replications: int = DEFAULT_REPLICATIONS  # behind the pick's capacity interval, and each judgment with confidence
    confidence: float | None = None  # judge the SLOs at the upper end of this interval (None: as simulated)
    host_spread: float | None = None  # the host spread replications draw from (None: the profile's)
    variants: str | None = None  # --variants: auto or a list (None: each model its own entry)
    memory_gb: float | None = None  # --memory-gb per device (None: the device's; on a CPU the host's available)



def base_config(repo: str | None, profile, load: Load) -> ServingConfig:
    """Serving config of the entries the load touches: from the repository, else one per profiled model."""
    if repo:
        return ServingConfig.from_repo(repo, list(load.base.models))
    return adapters.config_from_profile(profile, load.base.models)


def hardware_text(profile) -> str:
    return adapters.profile_description(profile)


def _log(opts: TuneOptions, text: str) -> None:
    if not opts.quiet:
        print(text, flush=True)


def run_tune(opts: TuneOptions) -> dict:
    """The whole tune; returns what it writes to ``OUT/tune.json``. The load's size is checked and ``OUT`` held
    (free space for the verification replays' results) before the load is built; a write into ``OUT`` that fails
    later is an :class:`OutputError` saying what was kept where."""
    require_count("--threads-per-instance", opts.threads_per_instance)
    require_count("--max-requests", opts.max_requests)
    IntervalOptions(opts.replications, DEFAULT_CONFIDENCE if opts.confidence is None else opts.confidence,
                    opts.host_spread).check()
    if not opts.max_scale >= 1:
        raise InputError("--max-scale", f"{opts.max_scale:g}", "expected a load multiple >= 1")
    requests, duration_s = load_size(opts.load, opts.duration_s, opts.max_requests)
    # each verified candidate is replayed at 1x, at its capacity and one rung above (at most max_scale's requests),
    # the pick perhaps once more at its interval's end
    replayed = int(requests * (1 + 2 * opts.max_scale))
    with hold_results(opts.out, replayed, duration_s, folders=3 * max(opts.verify_top, 0) + 2):
        try:
            return _tune(opts)
        except OSError as err:
            if not _written_in(err, Path(opts.out)):
                raise
            raise OutputError(f"{opts.out}: cannot write {err.filename2 or err.filename} ({err.strerror or err}); "
                              f"the observations written before it are in {Path(opts.out) / 'observations.jsonl'}, "
                              "and the same command resumes from them") from None


def _interval_options(opts: TuneOptions, profile) -> tuple[Replications | None, str]:
    """The replications behind the pick's capacity interval and, with ``--confidence``, each judgment (None: none
    asked), on the search's simulator seed; and where their host spread comes from."""
    if opts.confidence is not None and opts.replications < 1:
        raise InputError("--confidence", None, f"{opts.confidence:g} judges over replications: needs "
                                               "--replications >= 1")
    sigma, source = host_sigma(profile, opts.host_spread)
    confidence = DEFAULT_CONFIDENCE if opts.confidence is None else opts.confidence
    return replications_from(opts.replications, confidence, sigma, ObjectiveConfig().sim_seed), source


def _pick_interval(opts: TuneOptions, ctx: EvalContext, best: dict, replications: Replications | None,
                   source: str) -> None:
    """The pick's capacity interval (:func:`~serving_bench.tune.intervals.capacity_interval`) into its result
    (``capacity_interval``): where replications are asked and the pick meets the SLOs at 1x."""
    result = best["result"]
    if replications is None or not result["feasible"]:
        return
    _log(opts, f"capacity interval: the pick's capacity searched again in {replications.count} replications, each "
               f"its own realisation of the load, simulator seed and host speed")
    question = CapacityQuestion(ctx.profile_for(best["params"]), ctx.space.config(best["params"]), ctx.load,
                                ctx.slos, ctx.objective.ladder, ctx.objective.max_failed_fraction)  # its variants
    found = capacity_interval(question, replications, result["capacity_scale"])
    result["capacity_interval"] = dict(found.to_json(), host_spread_source=source,
                                       low_rps=None if found.low is None else found.low * ctx.offered_rps,
                                       high_rps=None if found.high is None else found.high * ctx.offered_rps,
                                       ceiling_rps=None if found.ceiling is None else found.ceiling * ctx.offered_rps)


def _written_in(err: OSError, folder: Path) -> bool:
    """Whether ``err`` came from a file inside ``folder``."""
    return err.filename is not None and Path(os.path.abspath(err.filename)).is_relative_to(Path(os.path.abspath(folder)))


@dataclass(eq=False)
class _Question:
    """What a tune searches: the load and its SLOs, the profile, the search space, the objective's context, the
    generator and the replications behind intervals."""

    load: Load
    slos: Mapping[str, Mapping[str, float]]
    profile: Any
    space: SearchSpace
    ctx: EvalContext
    tuned: list[str]
    intervals: Replications | None
    sigma_source: str
    settings: SearchSettings
    choice: Any
    built: BuiltSpace


@dataclass(eq=False)
class _Found:
    """The search's outcome: the searched result (on the screen when one was used) and the final one."""

    searched: Any
    result: Any
    search_ctx: EvalContext
    fraction: float | None


def _tune(opts: TuneOptions) -> dict:
    t0 = time.perf_counter()
    out = Path(opts.out)
    question = _set_up(opts)
    found = _search(opts, question, out)
    best = found.result.best
    if best is not None:
        _pick_interval(opts, question.ctx, best, question.intervals, question.sigma_source)
    verification, tuned_repo = [], None
    if best is not None and opts.repo:
        space = question.space
        chosen = space.entries(best["params"])
        tuned_repo = str(verify.write_tuned_repo(opts.repo, renamed_config(space.config(best["params"]), chosen),
                                                 out / "tuned_repo", verify.served_entries(space.base, chosen)
                                                 if space.has_variants else None))
        _log(opts, f"tuned repository: {tuned_repo}")
    if opts.verify_top > 0 and best is not None and (opts.repo or opts.url):
        verification = verify_top(opts, question.ctx, found.result, question.load, question.slos, out)
    elif opts.verify_top > 0:
        _log(opts, "verification skipped: no --repo or --url to run real Triton with")
    doc = _document(opts, question, found, verification, tuned_repo)
    doc["wall_s"] = time.perf_counter() - t0
    text = json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n"
    try:
        atomic_write_text(out / "tune.json", text)
    except OSError as err:
        raise rescue_folder(out, err, lambda folder: atomic_write_text(folder / "tune.json", text)) from None
    for line in doc["recommendation"]:
        _log(opts, line)
    if opts.report:
        _log(opts, f"report: {write_report(out)}")
    return doc


def _set_up(opts: TuneOptions) -> _Question:
    """The load, SLOs, profile (through the client asked, on the GPUs asked), search space and objective."""
    load = load_from_file(opts.load, seed=opts.seed, duration_s=opts.duration_s, growth=opts.growth,
                          max_requests=opts.max_requests)
    slos = resolve_slos(opts.slos, load.base)
    profile = through_client(adapters.load_profile(opts.profile), client_cpu_s(opts.client_cpu_us))
    if opts.gpus >= 1:
        profile = adapters.with_gpus(profile, opts.gpus)
    base = base_config(opts.repo, profile, load).with_threads(opts.threads_per_instance)
    tuned = list(opts.models) or list(base.names)
    for m in tuned:
        if m not in base.names:
            raise InputError("--models", m, f"not served for this load; served: {', '.join(base.names)}")
    if opts.gpus and any(d == "cpu" for m in base.models for d, _ in m.instances) and opts.repo:
        _log(opts, f"note: --gpus {opts.gpus} places the models on GPUs in the search (the profile's devices); the "
                   f"repository's instances are KIND_CPU here")
    built = build_space(base, profile, load.base, tuned, SpaceAsk(
        opts.instances, opts.max_batch_sizes, opts.queue_delays_us, opts.preferred, opts.gpus, opts.variants,
        opts.memory_gb, opts.max_scale, opts.repo))
    space = built.space
    if opts.objective == "energy":
        require_energy(profile, space)
    for note in built.candidates.notes + built.pruned:
        _log(opts, f"note: {note}")
    intervals, sigma_source = _interval_options(opts, profile)
    ctx = EvalContext(space, profile, load, slos, ObjectiveConfig(
        opts.objective, max_scale=opts.max_scale, confidence=opts.confidence, replications=opts.replications,
        host_sigma=intervals.host_sigma if intervals else 0.0, memory_budget=tuple(sorted(built.budget.items()))))
    if opts.objective == "gpus" and opts.gpus < 1:
        raise InputError("--objective", "gpus", "needs --gpus N (the most GPUs the models may use)")
    settings = SearchSettings(generator=opts.generator, seed=load.seed, batch_size=opts.batch,
                              max_evals=opts.max_evals, first_alone=True,
                              budget_s=opts.budget_minutes * 60.0 if opts.budget_minutes else None)
    choice = choose_generator(opts.generator, space)
    require_count("--finalists", opts.finalists)
    return _Question(load, slos, profile, space, ctx, tuned, intervals, sigma_source, settings, choice, built)


def _search(opts: TuneOptions, q: _Question, out: Path) -> _Found:
    """The search on the simulator, checkpointed in ``out``: on a screen of a long load, the best confirmed on all."""
    search_ctx, fraction = screen_context(q.ctx, opts.screen)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = Checkpoint(out / "observations.jsonl",
                            search_header(search_ctx, q.choice, q.settings, file_id(opts.profile) + (
                                f"; client +{opts.client_cpu_us:g} us" if opts.client_cpu_us else "")))
    _log(opts, f"tune: {len(q.load.base)} requests over {q.load.duration_s:.1f} s ({q.ctx.offered_rps:,.1f} req/s), "
               f"{len(q.tuned)} models, {q.choice.space_points} configurations ({q.choice.name}: "
               f"{q.choice.reason}), {opts.executor} executor")
    if search_ctx is not q.ctx:
        _log(opts, f"screen: candidates ranked on {fraction:.1%} of the load's time ({len(search_ctx.load.base):,} "
                   f"requests in {len(search_ctx.load.base.meta['screen_spans'])} windows), the best "
                   f"{opts.finalists} at a time then simulated on all of it")
    planned = min(q.choice.space_points, opts.max_evals or q.choice.space_points)
    workers = opts.workers if opts.workers > 0 else cpu_cores()
    with make_executor(opts.executor, workers=workers, address=opts.ray_address,
                       num_cpus=opts.ray_cpus) as executor:
        with _progress(opts, "screen" if search_ctx is not q.ctx else "tune", planned,
                       lambda obs: _log(opts, estimate_line(obs, q.choice.space_points, q.settings))) as progress:
            result = searched = run_search(search_ctx, executor, q.settings, checkpoint=checkpoint,
                                           restart=opts.restart, choice=q.choice, on_observation=progress)
        _log(opts, f"search: {searched.evaluated} evaluated"
                   f"{f' ({searched.resumed} resumed)' if searched.resumed else ''}, stopped: {searched.stopped}, "
                   f"{searched.wall_s:.1f} s")
        if search_ctx is not q.ctx:
            confirmed = confirm_checkpoint(out / "confirmed.jsonl", q.ctx, q.choice, q.settings,
                                           file_id(opts.profile), checkpoint)
            with _progress(opts, "whole load", None) as progress:
                result = confirm(q.ctx, executor, searched, opts.finalists, checkpoint=confirmed,
                                 restart=opts.restart, on_observation=progress)
            _log(opts, f"whole load: {result.evaluated + result.resumed} best screened candidates simulated"
                       f"{f' ({result.resumed} resumed)' if result.resumed else ''}, {result.wall_s:.1f} s")
    return _Found(searched, result, search_ctx, fraction)


def _document(opts: TuneOptions, q: _Question, found: _Found, verification: list[dict],
              tuned_repo: str | None) -> dict:
    """What ``OUT/tune.json`` holds: the question, the search, the best candidates, the verification and the
    recommendation."""
    result, searched = found.result, found.searched
    top = [{"rank": rank, "key": obs["key"], "params": obs["params"],
            "config": config_dict(q.space.config(obs["params"])), "result": obs["result"],
            "screened": obs.get("screened", False)}
           for rank, obs in enumerate(result.ranked[:max(opts.verify_top, 5)], 1)]
    best = result.best
    hardware = hardware_text(q.profile)
    asked = Asked(slos=q.slos, offered_rps=q.ctx.offered_rps, objective=opts.objective, hardware=hardware,
                  max_scale=opts.max_scale, growth=q.load.growth)
    chosen = q.space.entries(best["params"]) if best else {}
    recommendation = tune_recommendation(best, q.space.config(best["params"]) if best else None, asked,
                                         verification, chosen)
    if best is not None and q.space.has_variants:
        recommendation[1:1] = why_lines(q.profile, q.space, best, result.ranked, q.built.candidates.per_slot)
    screen = None if searched is result else {
        "fraction": found.fraction, "requests": len(found.search_ctx.load.base),
        "spans_s": found.search_ctx.load.base.meta["screen_spans"], "finalists": opts.finalists,
        "confirmed": result.evaluated + result.resumed, "confirm_wall_s": result.wall_s}
    return {
        "load": {"file": str(opts.load), "requests": len(q.load.base), "duration_s": q.load.duration_s,
                 "offered_rps": q.ctx.offered_rps, "models": list(q.load.base.models), "growth": q.load.growth},
        "growth": q.load.growth, "growth_meaning": GROWTHS[q.load.growth],
        "profile": str(opts.profile), "hardware": hardware, "objective": opts.objective,
        "threads_per_instance": opts.threads_per_instance,
        "intervals": described(q.intervals, q.sigma_source, "each its own realisation of the load")
        if q.intervals else None,
        "confidence": opts.confidence, "slos": q.slos, "satisfiable": result.satisfiable,
        "search": {"generator": q.choice.name, "reason": q.choice.reason, "space_points": q.choice.space_points,
                   "evaluated": searched.evaluated, "resumed": searched.resumed, "stopped": searched.stopped,
                   "wall_s": searched.wall_s, "executor": opts.executor, "space": q.space.describe(),
                   "screen": screen, "budget_s": q.settings.budget_s,
                   "pruned": list(q.built.candidates.notes + q.built.pruned)},
        "memory_budget_bytes": q.built.budget,
        "variants": variants_section(q.profile, q.space, best, q.built.candidates.per_slot)
        if q.space.has_variants else None,
        "best": top[0] if top else None, "top": top, "verification": verification,
        "tuned_repo": tuned_repo, "recommendation": recommendation,
    }


@contextmanager
def _progress(opts: TuneOptions, desc: str, planned: int | None, first=None):
    """A progress bar of candidates done and the best so far; yields the search's ``on_observation``; ``first``
    is called with the first simulated observation (the estimate of the search's time)."""
    best_so_far: list = [None]
    bar = None if opts.quiet else tqdm(total=planned, unit="config", desc=desc, file=sys.stderr, dynamic_ncols=True)

    def progress(obs: dict, total: int) -> None:
        nonlocal first
        if first is not None and not obs["result"].get("memory_exceeded"):
            first, say = None, first
            say(obs)
        if best_so_far[0] is None or obs["value"] > best_so_far[0]["value"]:
            best_so_far[0] = obs
        best = best_so_far[0]["result"]
        if bar is not None:
            bar.n = total if planned is None else min(total, planned)
            bar.set_postfix_str(f"best {best['capacity_rps']:,.1f} req/s" if best["feasible"] else
                                f"best misses SLOs ({best['violation']:.2f}x bound)", refresh=True)
    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()


def verify_top(opts: TuneOptions, ctx: EvalContext, result, load: Load, slos, out: Path) -> list[dict]:
    """Replay each of the best ``verify_top`` feasible (else the best) candidates on Triton at 1x, at its predicted
    capacity and one ladder rung above (``verify.capacity_replays``), the load grown by its rule; where they disagree
    with a capacity interval's prediction, once more at the interval's end (``verify.interval_replay``)."""
    rows = []
    candidates = [o for o in result.ranked if o["result"]["feasible"]][:opts.verify_top] or result.ranked[:1]
    for rank, obs in enumerate(candidates, 1):
        chosen = ctx.space.entries(obs["params"])
        config = renamed_config(ctx.space.config(obs["params"]), chosen)
        replays = list(verify.capacity_replays(obs["result"], ctx.objective.ladder))
        schedules = [load.at(r.scale) for r in replays]
        _log(opts, f"verify #{rank} on {'Triton at ' + opts.url if opts.url else 'embedded Triton'}: "
                   f"{len(replays)} replay{'s' if len(replays) != 1 else ''} of {load.duration_s:.1f} s, the load "
                   f"grown by {load.growth}: " + ", ".join(f"{r.label} {r.scale:.2f}× ({len(s):,} requests)"
                                                          for r, s in zip(replays, schedules)))

        def progress(p) -> None:
            _log(opts, f"  replay {p.elapsed_s:5.1f} s: {p.finished}/{p.scheduled} done, {p.rate_rps:.0f} req/s"
                       + (f", p99 {p.p99_s * 1e3:.1f} ms" if p.p99_s is not None else ""))

        folder = out / "verify" / f"rank{rank}"

        def check_interval(summaries: list[dict]) -> list:
            outcomes = [(r, check_slos(s, slos, ctx.objective.max_failed_fraction)[0])
                        for r, s in zip(replays, summaries)]
            extra = verify.interval_replay(obs["result"], outcomes, ctx.objective.ladder)
            if extra is None:
                return []
            replays.append(extra)
            schedules.append(load.at(extra.scale))
            _log(opts, f"  the replays disagree with the prediction: once more at the capacity interval's "
                       f"{extra.label.split('-')[1]} end, {extra.scale:.2f}× ({len(schedules[-1]):,} requests)")
            return [(schedules[-1], folder / extra.folder)]

        where = verify.Where(opts.repo, opts.url, progress, lambda line: _log(opts, line))
        measured = verify.verify_on_entries(config, chosen, [(s, folder / r.folder) for r, s in zip(replays, schedules)],
                                            slos, where, more=check_interval)
        runs = []
        for replay, schedule, summary in zip(replays, schedules, measured):
            met, violation = check_slos(summary, slos, ctx.objective.max_failed_fraction)
            runs.append({"label": replay.label, "scale": replay.scale, "requests": len(schedule),
                         "duration_s": schedule.duration_s, "offered_rps": len(schedule) / schedule.duration_s,
                         "slo_met": met, "violation": violation, "folder": str(folder / replay.folder),
                         **verify.compare(ctx.summary(obs["params"], replay.scale), summary)})
        at_one = next(run for run in runs if abs(run["scale"] - 1.0) < 1e-9)
        outcomes = [(r, run["slo_met"]) for r, run in zip(replays, runs)]
        rows.append({"rank": rank, "key": obs["key"], "server": opts.url or "embedded", "slo_met": at_one["slo_met"],
                     "simulated": at_one["simulated"], "measured": at_one["measured"], "replays": runs,
                     "capacity": verify.capacity_check(obs["result"], outcomes, load.growth, ctx.objective.ladder)})
    return rows
