"""Replays on our own server that cancel no request while the server lives.

A request cancelled at its gRPC deadline can crash the bundled tritonserver 2.51's gRPC front end (upstream issue
7368, fixed in 24.12; three servers in a row died so in docs/notes/capacity-fidelity.md). Where a replay may queue
past any deadline (a load above capacity, on purpose), :func:`replay_or_cut` sends with a deadline no replay reaches
and ends an overloaded replay by stopping the server instead: its unanswered requests are failed, and the caller
starts a new server for the next replay."""

from __future__ import annotations

import threading
from typing import Callable, Mapping

from serving_bench.load.driver import Progress, SendOptions, TritonTarget
from serving_bench.run.records import Records
from serving_bench.run.schedule import Schedule
from serving_bench.serve.server import TritonServer

NO_DEADLINE_S = 3600.0  # every request's gRPC deadline: none is reached
WATCH_S = 0.2  # how often a replay looks whether it is past its cut


def cut_after_s(slos: Mapping[str, Mapping[str, float]]) -> float:
    """How long a replay judged against ``slos`` (model -> {stat: bound, s}) may run on after its schedule's last
    arrival before it is cut: 20 times the largest bound, at least 2 s (an overloaded replay ends within it; every
    request that counts toward a percentile near its bound is answered long before)."""
    return max(2.0, 20.0 * max((b for s in slos.values() for b in s.values()), default=0.0))


def replay_or_cut(server: TritonServer, schedule: Schedule, cut_s: float,
                  progress: Callable[[Progress], None] | None = None,
                  progress_interval_s: float = 5.0) -> tuple[Records, bool]:
    """``schedule`` replayed open loop on ``server`` with no request cancelled while it lives; returns the records
    and whether the replay was *cut*: still waiting for answers ``cut_s`` seconds after the schedule's last arrival,
    its server was stopped at once (SIGKILL right after SIGTERM: nothing drained or cancelled), its unanswered
    requests failed. ``progress`` is called about every ``progress_interval_s`` seconds."""
    end_s = (float(schedule.arrival_s.max()) if len(schedule) else 0.0) + cut_s
    cut = threading.Event()
    last_report = [float("-inf")]

    def watchdog(now: Progress) -> None:
        if not cut.is_set() and now.elapsed_s > end_s and now.in_flight and server.pid is not None:
            cut.set()
            server.stop(timeout_s=0.0)
        if progress is not None and now.elapsed_s - last_report[0] >= progress_interval_s:
            last_report[0] = now.elapsed_s
            progress(now)

    target = TritonTarget(server, send=SendOptions(timeout_s=NO_DEADLINE_S), progress=watchdog,
                          progress_interval_s=WATCH_S)
    return target.run(schedule), cut.is_set()
