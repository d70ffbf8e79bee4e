"""``serving-bench replay PROFILE.yaml --repo model_repo/ [--url host:port] --out results/NAME/``

Builds the schedule from the profile (or loads ``--schedule saved.npz``), starts the embedded tritonserver with only
the models the profile needs (unless ``--url`` names a running server), replays the schedule open loop (or closed
loop with ``--concurrency``) with a progress bar showing the live rate and p99, samples telemetry, and writes the
results folder (:mod:`serving_bench.run.results`). Before any of it the schedule's size is checked
(``--max-requests``) and the results folder checked and held for the run (writable, room for the results, no other
run in it). On Ctrl-C or SIGTERM (to the process or its whole group, at any moment after the schedule is built), on
server death or a dead model instance the records of what was sent are saved, marked partial; the exit status is
then 130 or 3. Results that cannot be written after all are saved elsewhere, marked partial (exit 4). With
``--url``, the server's metrics address is the one ``serve`` announced for it, ``--metrics-url``, or else guessed
at the gRPC port + 1 (Triton's default layout; a guess that does not answer is an input error saying so).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from serving_bench.errors import InputError, require_count
from serving_bench.files import atomic_write_json
from serving_bench.interrupts import RunInterrupted, deferred_interrupts
from serving_bench.load import scenarios
from serving_bench.load.driver import SendOptions, TritonTarget
from serving_bench.load.fields import Where, seconds
from serving_bench.load.native import choose_sender
from serving_bench.load.profile import MAX_REQUESTS, LoadProfile, build_schedule, check_schedule_size
from serving_bench.run.records import not_sent_records
from serving_bench.run.results import hold_results, write_results
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop, OpenLoop
from serving_bench.serve.control import metrics_answer
from serving_bench.serve.server import connect
from serving_bench.telemetry import Telemetry


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", metavar="PROFILE.yaml", help="load profile (see docs/load.md)")
    parser.add_argument("--repo", default="model_repo", help="model repository for the embedded server")
    parser.add_argument("--url", help="gRPC host:port of a running Triton (then no server is started)")
    parser.add_argument("--metrics-url", help="with --url: that server's metrics host:port (default: what a running "
                                              "serve announced for the --url, else the gRPC port + 1)")
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
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS,
                        help=f"refuse a schedule of more requests (default {MAX_REQUESTS:,})")
    group = parser.add_argument_group("MLPerf-style scenarios (the profile gives the traffic mix and SLOs)")
    group.add_argument("--scenario", choices=["server", "offline", "singlestream", "peak"],
                       help="server: Poisson at --qps, valid if p99 <= bound; offline: --queries at t=0; "
                            "singlestream: one at a time; peak: highest valid server qps (from --qps)")
    group.add_argument("--qps", type=float, help="server: target rate; peak: starting rate")
    group.add_argument("--bound", help="latency bound for server/peak (default: each model's p99 SLO)")
    group.add_argument("--min-duration", default="10s", help="server/singlestream/peak minimum duration")
    group.add_argument("--min-queries", type=int, default=256, help="server/singlestream/peak minimum queries")
    group.add_argument("--queries", type=int, default=1024, help="offline: number of queries")


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
    timeout_s, instances = _checked_options(args)
    if args.scenario:
        return _run_scenario(args, out, timeout_s, instances)
    profile = LoadProfile.load(args.profile)
    saved = Schedule.load(args.schedule) if args.schedule else None
    requests = len(saved) if saved is not None else check_schedule_size(profile, args.max_requests)
    mode = ClosedLoop(concurrency=args.concurrency) if args.concurrency else \
        OpenLoop(max_in_flight=args.max_in_flight, on_cap=args.on_cap)
    repo = Path(args.repo)
    if not args.url and not repo.is_dir():
        raise InputError("--repo", None, f"{repo} is not a folder; export models first (serving-bench export)")
    duration_s = saved.duration_s if saved is not None else profile.duration_s
    with hold_results(out, requests, duration_s, empty=not args.overwrite):
        schedule = saved if saved is not None else build_schedule(profile, args.max_requests)
        # A Ctrl-C or SIGTERM from here on stops the run where it is safe and the results folder is still written:
        # the records of what was sent, marked partial (every request not_sent when it came before the start).
        server = connect(repo, url=args.url, metrics_url=args.metrics_url, models=list(schedule.models),
                         instances=instances)
        stopped_early = None
        try:
            server.start()  # a Ctrl-C while it starts: it cleans up after itself
        except KeyboardInterrupt:
            server, stopped_early = None, "interrupted (Ctrl-C) before the start"
        if server is not None and not args.no_telemetry:
            try:
                _check_metrics(server)
            except InputError:
                server.stop()
                raise
        with deferred_interrupts() as signals:
            records, telemetry = _replay(args, server, schedule, mode, timeout_s, signals, stopped_early)
            summary = write_results(out, records, schedule, telemetry=telemetry, clear=args.overwrite)
    _print_summary(summary, out)
    reason = records.info.stop_reason or ""
    if records.info.partial:
        print(f"run stopped early ({reason}); partial records saved in {out}/", file=sys.stderr)
        return 130 if reason.startswith("interrupted") else 3
    return 0


def _checked_options(args) -> tuple[float, dict[str, int]]:
    """The options checked before anything is read or started: the per-request timeout (s) and the instance
    overrides."""
    if args.url and args.instances:
        raise InputError("--instances", None, "only for the embedded server; it cannot change a server at --url")
    if args.metrics_url and not args.url:
        raise InputError("--metrics-url", None, "only with --url: the embedded server's metrics address is known")
    require_count("--concurrency", args.concurrency)
    require_count("--max-in-flight", args.max_in_flight)
    require_count("--max-requests", args.max_requests)
    timeout_s = seconds(args.timeout, Where("--timeout"), allow_zero=False)
    instances = _instances(args.instances)
    try:
        choose_sender(args.sender)  # --sender native where it cannot run: say why before starting anything
    except ValueError as err:
        raise InputError("--sender", None, str(err)) from None
    return timeout_s, instances


def _send_options(args, timeout_s: float) -> SendOptions:
    """The replay's sending options: ``--timeout`` (checked, in s), ``--senders``, ``--sender``."""
    return SendOptions(timeout_s=timeout_s, senders=args.senders, sender=args.sender)


def _replay(args, server, schedule: Schedule, mode, timeout_s: float, signals, stopped_early: str | None):
    """Run ``schedule`` on the started ``server`` (None: it did not start); returns the records and the stopped
    telemetry (None when off). The server is stopped on the way out, however the run ended."""
    bar = telemetry = None
    try:
        stopped_early = stopped_early or signals.reason and f"{signals.reason} before the start"
        if stopped_early:
            return not_sent_records(schedule, TritonTarget.name, stopped_early), None
        target = TritonTarget(server, mode=mode, send=_send_options(args, timeout_s), source=args.profile)
        print(target.sender_note, file=sys.stderr)
        target.prepare(schedule)  # unknown models, unreachable server, bad inputs: fail before anything
        bar = _Bar(len(schedule), not args.no_progress)
        target.progress = bar
        if not args.no_telemetry:
            telemetry = Telemetry(server.endpoints.metrics_url, interval_s=0.5, pid=server.pid).start()
        try:
            records = target.run(schedule) if not signals.reason else \
                not_sent_records(schedule, target.name, f"{signals.reason} before the start")
        except RunInterrupted as stop:
            records = stop.records
        return records, telemetry
    finally:
        if telemetry is not None:
            telemetry.stop()
        if bar is not None:
            bar.close()
        if server is not None:
            server.stop()


def _check_metrics(server) -> None:
    """An external server's metrics at a guessed address that does not answer: an input error naming the address
    and what to give instead, before anything is sent."""
    endpoints = server.endpoints
    if "metrics" in endpoints.guessed and not metrics_answer(endpoints.metrics_url):
        raise InputError("--url", None, f"cannot read Triton metrics at {endpoints.metrics_url}"
                                        f"{endpoints.guess_note('metrics')}; give --metrics-url HOST:PORT (serve "
                                        "prints it) or --no-telemetry")


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
    requests = max(args.queries, args.min_queries, int((args.qps or 0) * min_duration))
    if requests > args.max_requests:
        raise InputError("--qps" if args.qps and args.qps * min_duration > args.queries else "--queries", None,
                         f"the {args.scenario} scenario would send {requests:,} requests; expected at most "
                         f"{args.max_requests:,} (--max-requests raises the bound)")
    with hold_results(out, requests, min_duration, empty=not args.overwrite), \
            connect(Path(args.repo), url=args.url, metrics_url=args.metrics_url,
                    models=[m.name for m in profile.models], instances=instances) as server:
        target = TritonTarget(server, mode=OpenLoop(max_in_flight=args.max_in_flight, on_cap=args.on_cap),
                              send=_send_options(args, timeout_s), source=args.profile)
        print(target.sender_note, file=sys.stderr)
        server_scenario = scenarios.Server(args.qps or 0.0, bound, 99.0, min_duration, args.min_queries)
        if args.scenario == "server":
            result = server_scenario.run(target, profile)
        elif args.scenario == "offline":
            result = scenarios.Offline(args.queries).run(target, profile)
        elif args.scenario == "singlestream":
            result = scenarios.SingleStream(min_duration, args.min_queries).run(target, profile)
        else:
            result = scenarios.peak_qps(target, profile, server_scenario,
                                        on_step=lambda s: print(f"qps {s['qps']:9.1f}: "
                                                                f"{'valid' if s['valid'] else 'invalid'} "
                                                                f"{'; '.join(s['reasons'])}", file=sys.stderr))
        figures = scenarios.scenario_figures(result)
        if hasattr(result, "records"):
            write_results(out, result.records, clear=args.overwrite)
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
