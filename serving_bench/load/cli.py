"""``serving-bench replay PROFILE.yaml --repo model_repo/ [--url host:port] --out results/NAME/``

Builds the schedule from the profile (or loads ``--schedule saved.npz``), starts the embedded tritonserver with only
the models the profile needs (unless ``--url`` names a running server), replays the schedule open loop (or closed
loop with ``--concurrency``) with a progress bar showing the live rate and p99, samples telemetry, and writes the
results folder (:mod:`serving_bench.run.results`). On Ctrl-C or SIGTERM (to the process or its whole group, at any
moment after the schedule is built), on server death or a dead model instance the records of what was sent are
saved, marked partial; the exit status is then 130 or 3.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from tqdm import tqdm

from serving_bench.errors import InputError, require_count
from serving_bench.files import atomic_write_json
from serving_bench.interrupts import RunInterrupted, deferred_interrupts
from serving_bench.load import scenarios
from serving_bench.load.driver import TritonTarget
from serving_bench.load.fields import Where, seconds
from serving_bench.load.native import choose_sender
from serving_bench.load.profile import LoadProfile, build_schedule
from serving_bench.run.records import not_sent_records
from serving_bench.run.results import write_results
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop, OpenLoop
from serving_bench.serve.server import connect
from serving_bench.telemetry import Telemetry


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", metavar="PROFILE.yaml", help="load profile (see docs/load.md)")
    parser.add_argument("--repo", default="model_repo", help="model repository for the embedded server")
    parser.add_argument("--url", help="gRPC host:port of a running Triton (then no server is started)")
    parser.add_argument("--out", required=True, help="results folder")
    parser.add_argument("--schedule", help="replay this saved schedule (.npz) instead of building one")
    parser.add_argument("--concurrency", type=int, help="closed loop: requests in flight per model")
    parser.add_argument("--max-in-flight", type=int, help="open loop: cap on outstanding requests")
    parser.add_argument("--on-cap", choices=["wait", "drop"], default="wait",
                        help="at the cap, send late (wait) or not at all (drop)")
    parser.add_argument("--timeout", default="30s", help="per-request deadline (default 30s)")
    parser.add_argument("--senders", type=int, default=1,
                        help="sender processes (default 1: a process of its own, away from telemetry and the "
                             "progress bar; 0: a thread of this process)")
    parser.add_argument("--sender", choices=["auto", "native", "python"], default="auto",
                        help="auto (default): the native C++ sender where it builds (g++, libgrpc++-dev), else the "
                             "Python one; the run says which it used")
    parser.add_argument("--instances", action="append", default=[], metavar="MODEL=N",
                        help="instance count override for the embedded server (repeatable)")
    parser.add_argument("--no-telemetry", action="store_true", help="do not sample /metrics, CPU and GPU")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing results folder")
    group = parser.add_argument_group("MLPerf-style scenarios (the profile gives the traffic mix and SLOs)")
    group.add_argument("--scenario", choices=["server", "offline", "singlestream", "peak"],
                       help="server: Poisson at --qps, valid if p99 <= bound; offline: --queries at t=0; "
                            "singlestream: one at a time; peak: highest valid server qps (from --qps)")
    group.add_argument("--qps", type=float, help="server: target rate; peak: starting rate")
    group.add_argument("--bound", help="latency bound for server/peak (default: each model's p99 SLO)")
    group.add_argument("--min-duration", default="10s", help="server/singlestream/peak minimum duration")
    group.add_argument("--min-queries", type=int, default=256, help="server/singlestream/peak minimum queries")
    group.add_argument("--queries", type=int, default=1024, help="offline: number of queries")


def _schedule(args) -> Schedule:
    profile = LoadProfile.load(args.profile)
    if args.schedule:
        return Schedule.load(args.schedule)
    return build_schedule(profile)


def _instances(values) -> dict[str, int]:
    out = {}
    for value in values:
        name, sep, count = value.partition("=")
        if not sep or not count.isdigit():
            raise InputError("--instances", value, "expected MODEL=N")
        out[name] = int(count)
    return out


class _Bar:
    """tqdm progress: finished requests of the schedule, with live completion rate and p99 (from intended time)."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            self.bar = tqdm(total=total, unit="req", dynamic_ncols=True, file=sys.stderr, desc="replay")

    def __call__(self, progress) -> None:
        if self.bar is None:
            return
        self.bar.n = progress.finished
        p99 = f"{progress.p99_s * 1e3:.1f}ms" if progress.p99_s is not None else "-"
        self.bar.set_postfix_str(f"rate={progress.rate_rps:.0f}/s p99={p99} in_flight={progress.in_flight} "
                                 f"failed={progress.failed}", refresh=False)
        self.bar.refresh()

    def close(self):
        if self.bar is not None:
            self.bar.close()


def main(args) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InputError("--out", None, f"{out} is a file; expected a results folder (new, empty, or --overwrite)")
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise InputError("--out", None, f"{out} exists and is not empty; choose another folder or pass --overwrite")
    if args.url and args.instances:
        raise InputError("--instances", None, "only for the embedded server; it cannot change a server at --url")
    require_count("--concurrency", args.concurrency)
    require_count("--max-in-flight", args.max_in_flight)
    timeout_s = seconds(args.timeout, Where("--timeout"), allow_zero=False)
    instances = _instances(args.instances)
    try:
        choose_sender(args.sender)  # --sender native where it cannot run: say why before starting anything
    except ValueError as err:
        raise InputError("--sender", None, str(err)) from None
    if args.scenario:
        return _run_scenario(args, out, timeout_s, instances)
    schedule = _schedule(args)
    mode = ClosedLoop(concurrency=args.concurrency) if args.concurrency else \
        OpenLoop(max_in_flight=args.max_in_flight, on_cap=args.on_cap)
    repo = Path(args.repo)
    if not args.url and not repo.is_dir():
        raise InputError("--repo", None, f"{repo} is not a folder; export models first (serving-bench export)")

    # A Ctrl-C or SIGTERM from here on stops the run where it is safe and the results folder is still written: the
    # records of what was sent, marked partial (every request not_sent when it came before the start).
    server = connect(repo, url=args.url, models=list(schedule.models), instances=instances)
    stopped_early = None
    try:
        server.start()  # a Ctrl-C while it starts: it cleans up after itself
    except KeyboardInterrupt:
        server, stopped_early = None, "interrupted (Ctrl-C) before the start"
    with deferred_interrupts() as signals:
        bar = None
        telemetry = None
        try:
            stopped_early = stopped_early or signals.reason and f"{signals.reason} before the start"
            if stopped_early:
                records = not_sent_records(schedule, TritonTarget.name, stopped_early)
            else:
                target = TritonTarget(server, mode=mode, timeout_s=timeout_s, senders=args.senders,
                                      source=args.profile, sender=args.sender)
                print(target.sender_note, file=sys.stderr)
                target.prepare(schedule)  # unknown models, unreachable server, bad inputs: fail before anything
                bar = _Bar(len(schedule), not args.no_progress)
                target.progress = bar
                if not args.no_telemetry:
                    telemetry = Telemetry(server.endpoints.metrics_url, interval_s=0.5, pid=server.pid)
                    telemetry.start()
                try:
                    records = target.run(schedule) if not signals.reason else \
                        not_sent_records(schedule, target.name, f"{signals.reason} before the start")
                except RunInterrupted as stop:
                    records = stop.records
        finally:
            if telemetry is not None:
                telemetry.stop()
            if bar is not None:
                bar.close()
            if server is not None:
                server.stop()
        if out.exists() and args.overwrite:
            shutil.rmtree(out)
        summary = write_results(out, records, schedule, telemetry=telemetry)
    _print_summary(summary, out)
    reason = records.info.stop_reason or ""
    if records.info.partial:
        print(f"run stopped early ({reason}); partial records saved in {out}/", file=sys.stderr)
        return 130 if reason.startswith("interrupted") else 3
    return 0


def _run_scenario(args, out: Path, timeout_s: float, instances) -> int:
    """``--scenario``: run it on the embedded (or ``--url``) server; write the results folder plus scenario.json."""
    profile = LoadProfile.load(args.profile)
    bound = seconds(args.bound, Where("--bound"), allow_zero=False) if args.bound else None
    min_duration = seconds(args.min_duration, Where("--min-duration"), allow_zero=False)
    if args.scenario in ("server", "peak") and (args.qps is None or args.qps <= 0):
        raise InputError("--qps", None, f"the {args.scenario} scenario needs --qps > 0")
    if args.scenario in ("server", "peak") and bound is None:
        missing = [m.name for m in profile.models if "p99" not in dict(m.slo)]
        if missing:
            raise InputError(args.profile, f"models.{missing[0]}.slo.p99", "missing; give --bound or a p99 SLO")
    with connect(Path(args.repo), url=args.url, models=[m.name for m in profile.models],
                 instances=instances) as server:
        target = TritonTarget(server, mode=OpenLoop(max_in_flight=args.max_in_flight, on_cap=args.on_cap),
                              timeout_s=timeout_s, senders=args.senders, source=args.profile, sender=args.sender)
        print(target.sender_note, file=sys.stderr)
        if args.scenario == "server":
            result = scenarios.Server(args.qps, bound, 99.0, min_duration, args.min_queries).run(target, profile)
        elif args.scenario == "offline":
            result = scenarios.Offline(args.queries).run(target, profile)
        elif args.scenario == "singlestream":
            result = scenarios.SingleStream(min_duration, args.min_queries).run(target, profile)
        else:
            result = scenarios.peak_qps(target, profile, start_qps=args.qps, latency_bound_s=bound,
                                        min_duration_s=min_duration, min_queries=args.min_queries,
                                        on_step=lambda s: print(f"qps {s['qps']:9.1f}: "
                                                                f"{'valid' if s['valid'] else 'invalid'} "
                                                                f"{'; '.join(s['reasons'])}", file=sys.stderr))
    figures = scenarios.scenario_figures(result)
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(result, "records"):
        write_results(out, result.records)
    atomic_write_json(out / "scenario.json", figures)
    print(json.dumps(figures, indent=2, default=str))
    return 0


def _print_summary(summary: dict, out: Path) -> None:
    def ms(v):
        return f"{v * 1e3:8.2f}" if v is not None else "       -"

    print(f"{'model':32s} {'ok':>7s} {'failed':>7s} {'timeout':>7s} {'p50 ms':>8s} {'p99 ms':>8s} {'req/s':>8s} "
          f"{'SLO':>5s}")
    for name, s in [*summary["models"].items(), ("overall", summary["overall"])]:
        c = s["counts"]
        slo = "" if "slo_met" not in s else {True: "met", False: "MISS", None: "n/a"}[s["slo_met"]]
        print(f"{name:32s} {c['ok']:7d} {c['failed']:7d} {c['timeout']:7d} {ms(s['p50_s'])} {ms(s['p99_s'])} "
              f"{s['throughput_rps']:8.1f} {slo:>5s}")
    late = summary["overall"].get("lateness_p99_s")
    print(f"send lateness p99: {ms(late).strip()} ms; results in {out}/")
