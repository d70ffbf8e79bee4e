"""``serving-bench validate LOAD.yaml --profile P.json --repo model_repo/ --out DIR``: the same schedule on the real
server and in the simulator, and a table of relative errors per model: p50, p90, p99 (latency from intended time),
throughput, mean executed batch size (items per execution), utilisation, and the replay's send lateness.

Relative error = (simulated - measured) / measured. Utilisation: simulated = busy instance-seconds / (instances x
run length); measured = Triton's compute time (``compute_input + compute_infer + compute_output``) summed over its
per-batch-size statistics during the replay / (instances x run length); run length = the later of the schedule's
end and the last answer, on each side. A utilisation error at equal throughput and batch size means the server
computed slower or faster during the replay than when the profile was measured (a busy shared machine), not a
queueing error. ``send late p99`` is the load generator's own lateness (sent - intended) in the replay: the simulated
client is never late, so a large value there is measured latency the simulator cannot know. Each measured latency
percentile carries its distribution-free 95 % interval (``measured_low``, ``measured_high``; an end None where too
few requests bound it): a simulated value inside it is as close as the replay itself can tell.

``--threads-per-instance N`` serves and simulates every instance with ``N`` runtime threads (default: the embedded
server's, cores // all served instances). ``--replay DIR`` reuses a replay of the same schedule instead of running
the server (the per-batch statistics are then unknown: executions x mean compute time per request is used, which
weights each batch by its size, an upward bias when batch sizes vary). Writes ``DIR/real/``, ``DIR/sim/`` (the
usual results folders, one writer: :mod:`serving_bench.run.results`) and ``DIR/validation.json`` /
``validation.csv``.

It sits above both targets (``load.driver.TritonTarget`` and ``sim.target.SimTarget``): the simulator knows nothing
of real servers.

``server mean`` compares the mean time a request spends queued and computed (Triton's ``queue`` + ``compute`` means
per request; the simulator's time from reaching the batcher to the answer): the server model alone, free of the
ways in and out (client, network, hand-overs), which on a busy shared machine often dominate p50.

Each predicted p50, p90, p99 and throughput carries its interval at ``--confidence`` (default 90 %) over
``--replications`` (default 40; 0: none) of the same schedule, each on its own simulator seed and its own draw of the
host's speed (the profile's ``host_spread`` or ``--host-spread``: :mod:`serving_bench.sim.intervals`); the
``simulated`` figure stays the ``--seed`` run's. A row says whether the measured figure lies inside
(``predicted_low``, ``predicted_high``, ``inside``), and ``validation.json``'s ``coverage`` sums them up
(:func:`coverage`): the share of measured figures inside their predicted interval, the median half-width of the
predicted intervals relative to their middle, and beside it the measurement's own: the half-width of each measured
percentile's distribution-free interval at the same confidence, relative to the measured figure (``measured_spread``;
a replay's throughput of a fixed schedule has none that one replay can tell).
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from serving_bench.errors import InputError, require_count
from serving_bench.files import atomic_write, atomic_write_json, read_json, rescue_folder
from serving_bench.load.driver import TritonTarget
from serving_bench.load.profile import MAX_REQUESTS, LoadProfile, build_schedule, check_schedule_size
from serving_bench.profiles.schema import Profile
from serving_bench.run.metrics import quantile_intervals, simulated_inside, summarize
from serving_bench.run.records import Records, load_records
from serving_bench.run.results import hold_results, write_results
from serving_bench.run.schedule import Schedule
from serving_bench.serve.control import Control
from serving_bench.serve.server import connect
from serving_bench.serving_config import ServingConfig, add_threads_option
from serving_bench.sim.intervals import (IntervalOptions, add_interval_options, described, interval_text, replicate,
                                         summary_intervals)
from serving_bench.sim.target import SimTarget

METRICS = (("p50_s", "p50"), ("p90_s", "p90"), ("p99_s", "p99"), ("throughput_rps", "throughput"),
           ("mean_exec_batch", "mean batch"), ("utilisation", "utilisation"), ("server_mean_s", "server mean"),
           ("lateness_p99_s", "send late p99"))


TIME_METRICS = {"p50", "p90", "p99", "server mean", "send late p99"}
PREDICTED = {"p50": "p50_s", "p90": "p90_s", "p99": "p99_s", "throughput": "throughput_rps"}  # rows with intervals
FIELDS = ("model", "metric", "measured", "simulated", "rel_error", "measured_low", "measured_high", "predicted_low",
          "predicted_high", "inside", "measured_spread")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("load_profile", help="load profile YAML")
    parser.add_argument("--profile", required=True, help="simulator profile JSON")
    parser.add_argument("--repo", required=True, help="model repository (served, and the serving config)")
    parser.add_argument("--out", required=True, help="folder for real/, sim/ and the error table")
    parser.add_argument("--replay", help="results folder of an earlier replay of the same schedule (skip the server)")
    parser.add_argument("--url", help="an external Triton (gRPC host:port) serving the repository")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed")
    add_threads_option(parser)
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS,
                        help=f"refuse a schedule of more requests (default {MAX_REQUESTS:,})")
    add_interval_options(parser)


def _measured_utilisation(records: Records, config, duration: float) -> dict[str, float | None]:
    """Busy instance-seconds over instances x ``duration``: from Triton's per-batch-size statistics around the replay
    (``info.batch_busy_s``, exact) or, for a reused replay, executions x mean compute per request (biased up when
    batch sizes vary)."""
    busy = records.info.batch_busy_s or {}
    stats = records.info.server_stats or {}
    out = {}
    for m in config.models:
        if busy.get(m.name) is not None:
            out[m.name] = busy[m.name] / (m.instance_count * duration)
            continue
        s = stats.get(m.name)
        if not s or not s.get("execution_count"):
            out[m.name] = None
            continue
        compute = sum(s.get(f"compute_{p}_mean_s") or 0.0 for p in ("input", "infer", "output"))
        out[m.name] = s["execution_count"] * compute / (m.instance_count * duration)
    return out


def replay_with_busy_time(server, schedule: Schedule) -> Records:
    """Replay ``schedule`` open loop (``load.driver``) on ``server`` (a started ``TritonServer`` or
    ``ExternalServer``) and record Triton's busy time per model during it, from its per-batch-size statistics
    (``records.info.batch_busy_s``, seconds)."""
    models = list(schedule.models)
    with Control(server.endpoints.grpc_url) as control:
        before = control.batch_stats(models)
        records = TritonTarget(server).run(schedule)
        after = control.batch_stats(models)
    return records.with_info(batch_busy_s={
        m: sum(ns - before[m].get(b, (0, 0))[1] for b, (_, ns) in after[m].items()) * 1e-9 for m in models})


def server_mean_s(stats: Mapping) -> float | None:
    """A model's mean time inside Triton per request (s), queued and computed, from its statistics over a run
    (``records.info.server_stats[model]``: queue + compute input, infer and output means); None where one is missing."""
    parts = [stats.get(f"{p}_mean_s") for p in ("queue", "compute_input", "compute_infer", "compute_output")]
    return sum(parts) if all(p is not None for p in parts) else None


def compare(real_summary: dict, sim_summary: dict, real_util: dict, sim_util: dict,
            real_stats: dict | None = None, sim_batch: dict | None = None, sim_server: dict | None = None) -> list[dict]:
    """Rows ``{model, metric, measured, simulated, rel_error, measured_low, measured_high}`` for every model and
    metric. ``mean batch`` is items per executed batch over the whole run on both sides (Triton's ``inference_count /
    execution_count``; the simulator's ``items_per_execution``), not the request-weighted mean of the summaries. A
    latency percentile's ``measured_low`` / ``measured_high`` is its measured 95 % interval where ``real_summary``
    has them (``summarize(..., intervals=True)``; an end None where the requests are too few to bound it); other
    rows have None."""
    rows = []
    real_stats = real_stats or {}
    for model in real_summary["models"]:
        r, s = real_summary["models"][model], sim_summary["models"].get(model, {})
        for key, label in METRICS:
            if key == "utilisation":
                mv, sv = real_util.get(model), sim_util.get(model)
            elif key == "mean_exec_batch":  # items per execution on both sides (Triton's inference/execution count)
                mv = (real_stats.get(model) or {}).get("mean_exec_batch")
                sv = (sim_batch or {}).get(model)
            elif key == "server_mean_s":
                mv, sv = server_mean_s(real_stats.get(model) or {}), (sim_server or {}).get(model)
            elif key == "lateness_p99_s":
                mv, sv = r.get(key), None  # the simulated client is never late: nothing to compare
            else:
                mv, sv = r.get(key), s.get(key)
            err = (sv - mv) / mv if mv not in (None, 0) and sv is not None else None
            low, high = (r.get("intervals_s") or {}).get(label, (None, None))
            rows.append({"model": model, "metric": label, "measured": mv, "simulated": sv, "rel_error": err,
                         "measured_low": low, "measured_high": high})
    return rows


def with_predicted(rows: list[dict], intervals: Mapping[str, Mapping[str, list]] | None,
                   spreads: Mapping[str, Mapping[str, float | None]]) -> list[dict]:
    """``rows`` with each predicted figure's interval (``predicted_low``, ``predicted_high``; :data:`PREDICTED`
    rows, from the replications' ``intervals``), whether the measured figure lies inside it (``inside``) and the
    measurement's own relative half-width (``measured_spread``, from ``spreads``); None where there is none."""
    for row in rows:
        ends = ((intervals or {}).get(row["model"]) or {}).get(PREDICTED.get(row["metric"], ""), (None, None))
        low, high, measured = ends[0], ends[1], row["measured"]
        row.update(predicted_low=low, predicted_high=high,
                   inside=None if None in (low, high, measured) else bool(low <= measured <= high),
                   measured_spread=(spreads.get(row["model"]) or {}).get(row["metric"]))
    return rows


def measured_spreads(real: Records, summary: dict, confidence: float) -> dict[str, dict[str, float | None]]:
    """Per model, the half-width of each measured latency percentile's distribution-free interval at
    ``confidence`` (:func:`~serving_bench.run.metrics.quantile_intervals`, the requests in the summary's window)
    relative to the percentile; None where an end is unbounded (too few requests)."""
    table = real.table
    ok = table["status"].astype(str).to_numpy() == "ok"
    intended, done = table["intended_s"].to_numpy(), table["done_s"].to_numpy()
    names = table["model"].astype(str).to_numpy()
    out = {}
    for model, s in summary["models"].items():
        start, end = s["window_s"]
        rows = ok & (names == model) & (intended >= start) & (intended < end)
        latency = done[rows] - intended[rows]
        labels = [label for label in PREDICTED if label.startswith("p")]
        found = quantile_intervals(latency, [float(label[1:]) / 100 for label in labels], confidence)
        out[model] = {label: (high - low) / 2 / s[PREDICTED[label]] if None not in (low, high) and
                      s.get(PREDICTED[label]) else None for label, (low, high) in zip(labels, found)}
    return out


def coverage(rows: list[dict], confidence: float) -> dict | None:
    """The rows' coverage at ``confidence`` (None where no row has a predicted interval): how many measured figures
    lie inside their predicted interval, the share, the median half-width of those intervals relative to their
    middle (``median_half_width``), and over the rows where the measurement's own spread is known, the median of
    each (``median_half_width_vs_own``, ``median_measured_spread``) and their ratio (``width_ratio``)."""
    judged = [r for r in rows if r.get("inside") is not None]
    if not judged:
        return None

    def half_width(r):
        middle = (r["predicted_low"] + r["predicted_high"]) / 2
        return (r["predicted_high"] - r["predicted_low"]) / 2 / abs(middle) if middle else None

    def median(values):
        values = [v for v in values if v is not None]
        return float(np.median(values)) if values else None

    own = [r for r in judged if r.get("measured_spread") is not None]
    width_own, spread = median(map(half_width, own)), median(r["measured_spread"] for r in own)
    inside = sum(bool(r["inside"]) for r in judged)
    return {"confidence": confidence, "rows": len(judged), "inside": inside, "coverage": inside / len(judged),
            "metrics": sorted({r["metric"] for r in judged}), "median_half_width": median(map(half_width, judged)),
            "median_half_width_vs_own": width_own, "median_measured_spread": spread,
            "width_ratio": width_own / spread if width_own is not None and spread else None}


def coverage_line(cov: dict | None, about: dict | None) -> str:
    """The coverage in words (one line), or why there is none."""
    if cov is None:
        return "coverage: no predicted intervals (--replications 0)"
    line = (f"coverage: {cov['inside']} of {cov['rows']} measured figures ({', '.join(cov['metrics'])}) inside their "
            f"predicted {cov['confidence']:.0%} interval ({cov['coverage']:.0%}); median half-width "
            f"{cov['median_half_width'] * 100:.1f} %")
    if cov["width_ratio"] is not None:
        line += (f"; on the percentiles {cov['median_half_width_vs_own'] * 100:.1f} % against the measurement's own "
                 f"{cov['median_measured_spread'] * 100:.1f} % ({cov['width_ratio']:.2f}x)")
    if about:
        line += (f"; {about['count']} replications of the same schedule, host spread "
                 f"{about['host_spread'] * 100:.1f} % ({about['host_spread_source']})")
    return line


def sender_note(profile: Profile, real: Records) -> str | None:
    """A line where the profile was measured through another load sender than the replay ran through (None where
    they agree or either is unknown): a request's ways in and out include its sender's own time."""
    measured, replayed = profile.host.get("sender"), real.info.sender
    if not measured or not replayed or measured == replayed:
        return None
    return (f"the profile was measured through the {measured} sender, the replay ran through the {replayed} one: "
            "each request's ways in and out include its sender's own time (on the 2-core VM the python sender's "
            "took 0.3-0.5 ms more per request at the median, 1-2 ms at p99: "
            "docs/profiles.md#measurement-profile---repo), so the simulation is "
            "the profile's sender's")


@dataclass(frozen=True)
class ValidateOptions:
    """How ``validate`` runs: ``replay_dir`` (an earlier replay of the same schedule, instead of a new one), ``url``
    (a running Triton instead of the embedded one), the simulator's ``seed``, ``threads_per_instance`` (None: the
    embedded server's default; served and simulated alike), the schedule's bound ``max_requests`` and the predicted
    ``intervals``."""

    replay_dir: str | Path | None = None
    url: str | None = None
    seed: int = 0
    threads_per_instance: int | None = None
    max_requests: int = MAX_REQUESTS
    intervals: IntervalOptions = IntervalOptions()


def run_validation(load_profile, repo, profile_path, out_dir, options: ValidateOptions = ValidateOptions(), *,
                   note: Callable[[str], None] | None = None) -> list[dict]:
    """Run (or reuse) the replay and the simulation of one schedule as ``options`` say; write results; return the
    error rows, with their predicted intervals (:func:`with_predicted`; ``validation.json``'s ``coverage``). What the
    comparison should be read with (:func:`sender_note`) goes to ``validation.json``'s ``notes`` and ``note``."""
    replay_dir, url, seed = options.replay_dir, options.url, options.seed
    threads_per_instance, max_requests, intervals = (options.threads_per_instance, options.max_requests,
                                                     options.intervals)
    require_count("--threads-per-instance", threads_per_instance)
    schedule = build_schedule(LoadProfile.load(load_profile) if not isinstance(load_profile, LoadProfile)
                              else load_profile, max_requests)
    profile = Profile.load(profile_path)
    config = ServingConfig.from_repo(repo, list(schedule.models)).with_threads(threads_per_instance)
    target = SimTarget(profile, config, seed=seed)  # checks first; the config carries its ensembles' step graphs
    replications, source = intervals.resolve(profile, seed)
    if replay_dir is not None:
        real = load_records(replay_dir)
        if len(real) != len(schedule):
            raise InputError(replay_dir, "records", f"{len(real)} requests, but the schedule has {len(schedule)}")
    else:
        with connect(repo, url=url, models=list(schedule.models),
                     threads_per_instance=threads_per_instance) as server:
            real = replay_with_busy_time(server, schedule)
    notes = [n for n in (sender_note(profile, real),) if n]
    if note is not None:
        for line in notes:
            note(line)
    sim = target.run(schedule)
    real_summary, sim_summary = summarize(real, intervals=True), summarize(sim)
    out = Path(out_dir)
    write_results(out / "sim", sim, schedule)
    if replay_dir is None:
        write_results(out / "real", real, schedule)
    done = real.table["done_s"].to_numpy()
    length = max(schedule.duration_s, float(np.nanmax(done)) if np.isfinite(done).any() else 0.0)
    rows = compare(real_summary, sim_summary, _measured_utilisation(real, config, length),
                   sim.info.sim.utilisation, real.info.server_stats or {},
                   sim.info.sim.items_per_execution, sim.info.sim.server_mean_s)
    predicted = (summary_intervals(replicate(profile, config, lambda _draw: schedule, replications), replications)
                 if replications is not None else None)
    confidence = intervals.confidence
    rows = with_predicted(rows, predicted, measured_spreads(real, real_summary, confidence))
    about = described(replications, source, "the same schedule") if replications is not None else None
    doc = {"load_profile": str(getattr(load_profile, "path", load_profile)), "profile": str(profile_path),
           "notes": notes, "rows": rows, "coverage": coverage(rows, confidence), "replications": about}

    def write_table(folder: Path) -> None:
        atomic_write_json(folder / "validation.json", doc, sort_keys=False)
        atomic_write(folder / "validation.csv", lambda tmp: _write_csv(tmp, rows))

    try:
        write_table(out)
    except OSError as err:
        raise rescue_folder(out, err, write_table) from None
    return rows


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def format_table(rows: list[dict], confidence: float | None = None) -> str:
    """The rows as text: the predicted interval (at ``confidence``; ``ms`` for times) and whether the measured figure
    is inside it (``in``/``OUT``), then a latency percentile's measured 95 % interval ("…" for an end too few
    requests bound) and ``*`` where the simulated value falls outside it."""
    predicted = "predicted" if confidence is None else f"predicted {confidence:.0%}"
    lines = [f"{'model':<26} {'metric':<12} {'measured':>12} {'simulated':>12} {'rel. error':>10} {predicted:>19}     "
             "measured 95 % interval"]
    for r in rows:
        def fmt(v, metric=r["metric"]):
            if v is None:
                return f"{'-':>12}"
            return f"{v * 1e3:10.3f}ms" if metric in TIME_METRICS else f"{v:12.3f}"
        err = f"{r['rel_error'] * 100:+9.1f}%" if r["rel_error"] is not None else f"{'-':>10}"
        unit = 1e3 if r["metric"] in TIME_METRICS else 1.0
        band = interval_text((r.get("predicted_low"), r.get("predicted_high")), unit)
        verdict = {None: "   ", True: " in", False: "OUT"}[r.get("inside")]
        inside = simulated_inside(r)
        ends = ["…" if r.get(end) is None else f"{r[end] * 1e3:.3f}" for end in ("measured_low", "measured_high")]
        interval = "" if inside is None else f"  {ends[0]} – {ends[1]} ms{'' if inside else ' *'}"
        lines.append(f"{r['model']:<26} {r['metric']:<12} {fmt(r['measured'])} {fmt(r['simulated'])} {err} {band} "
                     f"{verdict}{interval}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    require_count("--max-requests", args.max_requests)
    intervals = IntervalOptions.from_args(args).check()
    load = LoadProfile.load(args.load_profile)
    requests = check_schedule_size(load, args.max_requests)
    with hold_results(args.out, requests, load.duration_s, folders=1 if args.replay else 2):
        options = ValidateOptions(replay_dir=args.replay, url=args.url, seed=args.seed,
                                  threads_per_instance=args.threads_per_instance, max_requests=args.max_requests,
                                  intervals=intervals)
        rows = run_validation(load, args.repo, args.profile, args.out, options,
                              note=lambda line: print(f"note: {line}", file=sys.stderr))
    doc = read_json(Path(args.out) / "validation.json", "validation")
    print(format_table(rows, args.confidence if args.replications else None))
    print(coverage_line(doc["coverage"], doc["replications"]))
    print(f"wrote {args.out}/validation.json, validation.csv, sim/" + ("" if args.replay else ", real/"))
    return 0
