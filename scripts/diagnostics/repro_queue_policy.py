#!/usr/bin/env python3
"""Reproduce the queue-policy collapse of the bundled tritonserver 2.51 and show where it happens (under a minute).

One server serves two sleep entries that differ only in ``dynamic_batching.default_queue_policy``:
``sleep_nopolicy`` (none) and ``sleep_policy`` (``--queue-size`` and/or ``--queue-timeout-us``). The capacity is
measured first, in the same run, with a closed loop on ``sleep_nopolicy`` (enough requests in flight to keep every
instance busy). Then both entries get the same open-loop load (``--load`` x capacity, Poisson or constant, from the
team's driver; ``--client perf_analyzer`` sends it with perf_analyzer 2.50 instead, an independent client).

Per entry it prints what the client saw (sent, ok, rejected, timeout, answered req/s and its share of the capacity,
latency from the intended time, the sender's lateness, the longest gap between two answers) and what Triton counted
(executed batches, their compute time as a share of the run = utilisation, mean queue time). The signature of the
defect: the policy entry answers far below capacity with its instance idle most of the time, and answers come in
bursts separated by ~0.5 s, the dynamic batcher's own timer (docs/serve.md#queue-policies-under-overload-the-bundled-tritonserver-251).

    .venv/bin/python scripts/diagnostics/repro_queue_policy.py [options]

    (no options)                                   0.65 load, batch-8 requests, queue 16
    --load 4 --timeout 150ms                       4x overload with a client deadline
    --load 4 --timeout 150ms --max-in-flight 4     the workaround
    --queue-size 0 --queue-timeout-us 10000000     a timeout-only policy
    --client perf_analyzer --queue-size 100000     perf_analyzer as the client, a queue never full

Bad arguments: one line ``--option: expected ...`` and exit 2. Times on the command line: ``150ms``, ``5s``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from serving_bench.errors import InputError  # noqa: E402

ENTRIES = ("sleep_nopolicy", "sleep_policy")
STALL_S = 0.4  # a gap between two answers this long, with requests waiting, is the batcher's 0.5 s timer


@dataclass
class Result:
    """One entry under the open-loop load. Rates per second, times in seconds."""

    entry: str
    client: str
    sent: int | None
    ok: int | None
    rejected: int | None
    timeout: int | None
    error: int | None
    answered_rps: float | None
    of_capacity: float | None
    p50_s: float | None
    p99_s: float | None
    lateness_p99_s: float | None
    longest_gap_s: float | None
    stalls: int | None            # gaps >= STALL_S between consecutive answers
    executions: int
    executions_per_s: float
    utilisation: float            # Triton's compute time of the run's batches / (instances x run length)
    queue_mean_s: float | None    # Triton's mean queue time of the answered requests
    flag: str | None              # the replay's queue_policy_collapse reason, if any
    note: str = ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", type=float, default=0.65, help="offered load as a multiple of the measured capacity")
    parser.add_argument("--batch", type=int, default=8, help="rows per request")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--queue-size", type=int, default=16, help="max_queue_size of sleep_policy (0: not set)")
    parser.add_argument("--queue-timeout-us", type=int, default=0, help="default_timeout_microseconds (0: not set)")
    parser.add_argument("--delay-us", type=int, default=0, help="max_queue_delay_microseconds of both entries")
    parser.add_argument("--preferred", default="", help="preferred batch sizes of both entries, e.g. 4,8")
    parser.add_argument("--instances", type=int, default=1, help="instances of each entry")
    parser.add_argument("--base-ms", type=float, default=5.0, help="sleep per executed batch (ms)")
    parser.add_argument("--per-item-ms", type=float, default=1.0, help="sleep per row of the batch (ms)")
    parser.add_argument("--duration", default="8s", help="open-loop run per entry")
    parser.add_argument("--capacity-duration", default="3s", help="closed-loop capacity run")
    parser.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    parser.add_argument("--timeout", default="5s", help="client deadline per request")
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="bound the queue at the client: at most N requests outstanding, the rest dropped "
                             "(the driver's on_cap='drop'; the workaround docs/serve.md gives)")
    parser.add_argument("--client", choices=("driver", "perf_analyzer"), default="driver")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    from serving_bench.load.fields import Where, seconds

    for name in ("duration", "capacity_duration", "timeout"):
        setattr(args, f"{name}_s", seconds(getattr(args, name), Where(f"--{name.replace('_', '-')}"),
                                           allow_zero=False))
    checks = (("--load", args.load > 0, "a number > 0"), ("--batch", args.batch >= 1, "an integer >= 1"),
              ("--max-batch-size", args.max_batch_size >= 1, "an integer >= 1"),
              ("--queue-size", args.queue_size >= 0, "an integer >= 0"),
              ("--queue-timeout-us", args.queue_timeout_us >= 0, "an integer >= 0"),
              ("--delay-us", args.delay_us >= 0, "an integer >= 0"),
              ("--instances", args.instances >= 1, "an integer >= 1"),
              ("--max-in-flight", args.max_in_flight is None or args.max_in_flight >= 1, "an integer >= 1"))
    for option, good, expected in checks:
        if not good:
            raise InputError(option, None, f"expected {expected}, got {getattr(args, option[2:].replace('-', '_'))}")
    if args.max_in_flight is not None and args.client != "driver":
        raise InputError("--max-in-flight", None, "expected only with --client driver (perf_analyzer has no cap)")
    if args.batch > args.max_batch_size:
        raise InputError("--batch", None, f"expected at most --max-batch-size {args.max_batch_size}")
    if not (args.queue_size or args.queue_timeout_us):
        raise InputError("--queue-size", None, "expected a queue policy: --queue-size N and/or --queue-timeout-us T")
    try:
        args.preferred_sizes = tuple(int(p) for p in args.preferred.split(",") if p.strip())
    except ValueError:
        raise InputError("--preferred", None, f"expected batch sizes like 4,8, got {args.preferred!r}") from None
    if any(not 1 <= p <= args.max_batch_size for p in args.preferred_sizes):
        raise InputError("--preferred", None, f"expected sizes between 1 and --max-batch-size {args.max_batch_size}")
    return args


def write_repo(repo: Path, args: argparse.Namespace) -> None:
    """The two sleep entries, identical except for the queue policy of ``sleep_policy``."""
    from serving_bench.export.sleep import write_sleep_entry
    from serving_bench.serving_config import ServingConfig

    for name in ENTRIES:
        write_sleep_entry(repo, name, base_ms=args.base_ms, per_item_ms=args.per_item_ms,
                          max_batch_size=args.max_batch_size, instances=args.instances,
                          max_queue_delay_us=args.delay_us, preferred_batch_sizes=args.preferred_sizes)
    config = ServingConfig.from_repo(repo, ["sleep_policy"])
    policy = config["sleep_policy"].replace(max_queue_size=args.queue_size, queue_timeout_us=args.queue_timeout_us)
    config.with_model(policy).apply_to_repo(repo)


def schedule_for(entry: str, rate: float, duration_s: float, args: argparse.Namespace):
    from serving_bench.load.profile import LoadProfile, build_schedule

    return build_schedule(LoadProfile.from_mapping(
        {"name": f"repro_{entry}", "duration": duration_s, "seed": args.seed,
         "arrival": {"process": args.arrival, "rate": rate}, "models": {entry: {"share": 1, "batch": args.batch}}}))


def measure_capacity(url: str, args: argparse.Namespace) -> float:
    """Answered req/s of ``sleep_nopolicy`` in a closed loop that keeps every instance busy with full batches."""
    from serving_bench.load.driver import SendOptions, TritonTarget
    from serving_bench.run.target import ClosedLoop

    per_batch = max(1, args.max_batch_size // args.batch)
    concurrency = 2 * args.instances * per_batch
    schedule = schedule_for("sleep_nopolicy", 1e4, args.capacity_duration_s, args)
    records = TritonTarget(url, mode=ClosedLoop(concurrency=concurrency, duration_s=args.capacity_duration_s),
                           send=SendOptions(timeout_s=30.0)).run(schedule)
    return float((records.table["status"].astype(str) == "ok").sum()) / args.capacity_duration_s


def _triton(stats: dict, instances: int, length_s: float) -> dict:
    return {"executions": int(stats["execution_count"]), "executions_per_s": stats["execution_count"] / length_s,
            "utilisation": stats["busy_s"] / (instances * length_s), "queue_mean_s": stats["queue_mean_s"]}


def run_driver(url: str, entry: str, rate: float, capacity: float, args: argparse.Namespace) -> Result:
    import warnings

    from serving_bench.load.driver import SendOptions, TritonTarget
    from serving_bench.run.target import OpenLoop

    schedule = schedule_for(entry, rate, args.duration_s, args)
    mode = OpenLoop(max_in_flight=args.max_in_flight, on_cap="drop")
    with warnings.catch_warnings():  # the flag is reported in the table below
        warnings.simplefilter("ignore")
        records = TritonTarget(url, mode=mode, send=SendOptions(timeout_s=args.timeout_s)).run(schedule)
    table = records.table
    status = table["status"].astype(str)
    count = status.value_counts().to_dict()
    ok = table[status == "ok"]
    latency = (ok["done_s"] - ok["intended_s"]).to_numpy()
    late = (table["sent_s"] - table["intended_s"]).dropna().to_numpy()
    gaps = np.diff(np.sort(ok["done_s"].to_numpy()))
    answered = len(ok) / args.duration_s
    flag = (records.info.queue_policy_collapse or {}).get(entry)
    dropped = records.info.dropped or 0
    return Result(entry, "driver", int((status != "not_sent").sum()), count.get("ok", 0), count.get("rejected", 0),
                  count.get("timeout", 0), count.get("error", 0), answered, answered / capacity,
                  float(np.percentile(latency, 50)) if len(latency) else None,
                  float(np.percentile(latency, 99)) if len(latency) else None,
                  float(np.percentile(late, 99)) if len(late) else None,
                  float(gaps.max()) if len(gaps) else None, int((gaps >= STALL_S).sum()),
                  **_triton(records.info.server_stats[entry], args.instances, args.duration_s),
                  flag=flag["reason"] if flag else None,
                  note=f"{dropped} not sent (client bound --max-in-flight {args.max_in_flight})" if dropped else "")


def run_perf_analyzer(url: str, entry: str, rate: float, capacity: float, args: argparse.Namespace) -> Result:
    """perf_analyzer 2.50 in its asynchronous request-rate mode at the same rate and batch. It stops at the first
    error answer (a rejection), so its own figures exist only where nothing was rejected; Triton's statistics cover
    whatever it sent."""
    import subprocess

    from serving_bench.load.driver import TritonTarget
    from serving_bench.peers.perf_analyzer import find_perf_analyzer, parse_measurement
    from serving_bench.serve.control import stats_delta

    pa = find_perf_analyzer()
    window_ms = int(args.duration_s * 1000 / 3)
    with tempfile.TemporaryDirectory(prefix="repro-pa-") as tmp:
        csv_path = Path(tmp) / "pa.csv"
        command = [str(pa.binary), "-m", entry, "-u", url, "-i", "grpc", "-b", str(args.batch), "-a",
                   "--request-rate-range", f"{rate:g}", "--request-distribution", args.arrival,
                   "--measurement-mode", "time_windows", "--measurement-interval", str(window_ms),
                   "-s", "1000", "--max-trials", "3", "-f", str(csv_path)]
        target = TritonTarget(url)
        before = target._stats([entry])
        start = time.perf_counter()
        out = subprocess.run(command, env=pa.env, capture_output=True, text=True, timeout=args.duration_s * 4 + 60)
        length = time.perf_counter() - start
        after = target._stats([entry])
        text = out.stdout + out.stderr
        measured = None
        if out.returncode == 0 and csv_path.is_file():
            import csv

            rows = list(csv.DictReader(csv_path.read_text().splitlines()))
            measured = parse_measurement(rows[-1], text, "request_rate", rate, tuple(command))
    stats = stats_delta(before, after)[entry]
    errors = [line.strip() for line in text.splitlines() if "error" in line.lower()]
    note = "" if measured else f"perf_analyzer stopped (exit {out.returncode}): {errors[0] if errors else text[-200:]}"
    answered = measured.throughput_ips / args.batch if measured else stats["success_count"] / length
    return Result(entry, "perf_analyzer", None, int(stats["success_count"]), None, None, None, answered,
                  answered / capacity, measured.p50_s if measured else None, measured.p99_s if measured else None,
                  None, None, None, **_triton(stats, args.instances, length), flag=None, note=note)


def fmt(value, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def report(results: list[Result], capacity: float, rate: float, args: argparse.Namespace) -> None:
    print(f"offered {rate:.1f} req/s ({args.load:g} x capacity {capacity:.1f} req/s), {args.arrival}, batch "
          f"{args.batch}, max_batch_size {args.max_batch_size}, {args.instances} instance(s), delay "
          f"{args.delay_us} us, client {args.client}, deadline {args.timeout_s:g} s"
          + (f", at most {args.max_in_flight} in flight" if args.max_in_flight else ""))
    header = (f"{'entry':15s} {'sent':>5s} {'ok':>5s} {'rej':>5s} {'tmo':>5s} {'req/s':>6s} {'%cap':>5s} "
              f"{'p50 ms':>7s} {'p99 ms':>7s} {'late99':>6s} {'gap s':>5s} {'stall':>5s} {'batch':>5s} "
              f"{'b/s':>5s} {'util':>5s} {'queue ms':>8s}")
    print(header)
    for r in results:
        print(f"{r.entry:15s} {fmt(r.sent, digits=0):>5s} {fmt(r.ok, digits=0):>5s} {fmt(r.rejected, digits=0):>5s} "
              f"{fmt(r.timeout, digits=0):>5s} {fmt(r.answered_rps):>6s} {fmt(r.of_capacity, 100, 0):>5s} "
              f"{fmt(r.p50_s, 1e3):>7s} {fmt(r.p99_s, 1e3):>7s} {fmt(r.lateness_p99_s, 1e3, 2):>6s} "
              f"{fmt(r.longest_gap_s, digits=2):>5s} {fmt(r.stalls, digits=0):>5s} {r.executions:5d} "
              f"{r.executions_per_s:5.1f} {r.utilisation:5.2f} {fmt(r.queue_mean_s, 1e3):>8s}")
    for r in results:
        if r.note:
            print(f"{r.entry}: {r.note}")
        if r.flag:
            print(f"flagged (queue_policy_collapse): {r.flag}")
    base, policy = results
    if base.of_capacity and policy.of_capacity is not None:
        print(f"verdict: with the policy the server answered {policy.of_capacity:.0%} of capacity "
              f"(without: {base.of_capacity:.0%}), its instance(s) busy {policy.utilisation:.0%} of the run "
              f"(without: {base.utilisation:.0%})"
              + (f"; {policy.stalls} gaps >= {STALL_S:g} s between answers (longest {policy.longest_gap_s:.2f} s)"
                 if policy.stalls else ""))


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except InputError as err:
        print(f"error: {err.line()}", file=sys.stderr)
        return 2
    from serving_bench.serve.server import TritonServer

    with tempfile.TemporaryDirectory(prefix="repro-queue-policy-") as tmp:
        repo = Path(tmp)
        write_repo(repo, args)
        with TritonServer(repo) as server:
            url = server.endpoints.grpc_url
            capacity = measure_capacity(url, args)
            rate = args.load * capacity
            run = run_driver if args.client == "driver" else run_perf_analyzer
            results = [run(url, entry, rate, capacity, args) for entry in ENTRIES]
    report(results, capacity, rate, args)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "json"},
                                         "capacity_rps": capacity, "rate_rps": rate,
                                         "results": [asdict(r) for r in results]}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
