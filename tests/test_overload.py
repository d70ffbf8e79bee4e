"""Overload on the real server: without Triton 2.51's queue-policy defect the answered rate stays near the measured
capacity at 2x and 4x overload with every request accounted for; with a queue policy the collapse is flagged.

One server, two sleep entries (5 ms + 1 ms per row, max batch 8, requests of 8 rows: one request per batch, ~75 req/s
on one instance): ``sleep_open`` without a queue policy, ``sleep_q16`` with ``max_queue_size: 16``. The capacity is
measured in the same module (closed loop, every batch full), so a slower machine lowers both sides of the ratio.
The queue is bounded at the client (``max_in_flight`` with ``on_cap="drop"``), the workaround docs/serve.md gives
for the defect; client deadlines count as timeouts. See docs/serve.md, "Queue policies under overload".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conformance import assert_target_contract

from serving_bench.load.collapse import QueuePolicyCollapseWarning, queue_policy_collapse
from serving_bench.load.driver import SendOptions, TritonTarget
from serving_bench.run.metrics import summarize
from serving_bench.run.records import Records, counts, new_records
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop, OpenLoop

pytestmark = pytest.mark.server

BATCH = 8          # rows per request = max_batch_size: one request per executed batch
RUN_S = 3.0        # each overload run
WARMUP_S = 0.5     # left out of the answered rate (the queue fills)
DEADLINE_S = 0.15  # client deadline
IN_FLIGHT = 4      # client-side bound: at most ~4 x 13 ms queued, well inside the deadline
# The answered rate is held to 90 % of capacity on a quiet machine (0.97-0.99 measured); on the shared 2-core
# machine the sender, the server and other engineers' tests take turns on the cores between the capacity run and the
# overload run, so the assertion keeps a margin below that. The same criterion inside the one run, immune to the
# machine changing speed between runs: the instance computed at least 90 % of the run (Triton's own busy time).
MIN_FRACTION = 0.8
MIN_BUSY = 0.9


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from serving_bench.export.sleep import write_sleep_entry
    from serving_bench.serve.server import TritonServer
    from serving_bench.serving_config import ServingConfig

    repo = tmp_path_factory.mktemp("overload_repo")
    for name in ("sleep_open", "sleep_q16"):
        write_sleep_entry(repo, name, base_ms=5.0, per_item_ms=1.0, max_batch_size=BATCH)
    config = ServingConfig.from_repo(repo, ["sleep_q16"])
    config.with_model(config["sleep_q16"].replace(max_queue_size=16)).apply_to_repo(repo)
    with TritonServer(repo) as srv:
        yield srv


def poisson(model: str, rate: float, duration_s: float, seed: int) -> Schedule:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, int(rate * duration_s * 1.5) + 10))
    t = t[t < duration_s]
    n = len(t)
    return Schedule(t, np.zeros(n), (model,), np.arange(n) % 16, np.full(n, BATCH),
                    {"duration_s": duration_s, "warmup_s": WARMUP_S, "seed": seed})


@pytest.fixture(scope="module")
def capacity(server) -> float:
    """Answered req/s of sleep_open with the instance never idle (closed loop, 4 in flight)."""
    seconds = 2.5
    records = TritonTarget(server, mode=ClosedLoop(concurrency=4, duration_s=seconds)).run(
        poisson("sleep_open", 1000, seconds, seed=0))
    return counts(records.table)["ok"] / seconds


@pytest.mark.exclusive
@pytest.mark.parametrize("factor", [2, 4])
def test_overload_without_the_defect_answers_near_capacity(server, capacity, factor):
    schedule = poisson("sleep_open", factor * capacity, RUN_S, seed=factor)
    target = TritonTarget(server, mode=OpenLoop(max_in_flight=IN_FLIGHT, on_cap="drop"),
                          send=SendOptions(timeout_s=DEADLINE_S))
    records = target.run(schedule)

    assert_target_contract(schedule, records)
    c = counts(records.table)
    assert c["sent"] == c["ok"] + c["failed"] + c["timeout"]
    assert c["scheduled"] == c["sent"] + c["not_sent"] == len(schedule)
    assert c["not_sent"] == records.info.dropped > 0  # the client-side bound shed the excess
    stats = records.info.server_stats["sleep_open"]
    assert stats["success_count"] >= c["ok"]  # Triton answered at least what the client counted as ok

    summary = summarize(records)
    answered = summary["models"]["sleep_open"]["throughput_rps"]  # ok answers per second after the warm-up
    busy = stats["busy_s"] / RUN_S
    print(f"{factor}x: capacity {capacity:.1f} req/s, answered {answered:.1f} req/s ({answered / capacity:.0%}), "
          f"instance busy {busy:.0%}, {c}")
    assert answered >= MIN_FRACTION * capacity, (answered, capacity, c)
    assert busy >= MIN_BUSY, (busy, c)
    assert summary["queue_policy_collapse"] is None and records.info.queue_policy_collapse is None


def test_queue_policy_collapse_is_flagged(server, capacity):
    schedule = poisson("sleep_q16", 4 * capacity, RUN_S, seed=7)
    with pytest.warns(QueuePolicyCollapseWarning, match=r"sleep_q16: answered .*\(max_queue_size 16\)"):
        records = TritonTarget(server, send=SendOptions(timeout_s=DEADLINE_S)).run(schedule)

    assert_target_contract(schedule, records)
    c = counts(records.table)
    assert c["sent"] == c["ok"] + c["failed"] + c["timeout"] == len(schedule)
    flag = records.info.queue_policy_collapse["sleep_q16"]
    summary = summarize(records)
    assert summary["queue_policy_collapse"] == records.info.queue_policy_collapse
    print(f"capacity {capacity:.1f} req/s; {flag['reason']}")
    assert flag["settings"] == ["max_queue_size 16"] and flag["refused"] == c["rejected"] + c["timeout"]
    assert flag["utilisation"] < 0.5 and flag["answered_rps"] < 0.5 * capacity


def _records(model: str, statuses: dict[str, int], busy_s: float, duration_s: float = 10.0,
             policies: dict | None = None) -> Records:
    """A finished run's records as the driver leaves them (statuses, server statistics, served facts)."""
    status = [s for s, k in statuses.items() for _ in range(k)]
    n = len(status)
    schedule = Schedule(np.linspace(0, duration_s, n, endpoint=False), np.zeros(n), (model,), np.zeros(n),
                        np.ones(n), {"duration_s": duration_s})
    records = new_records(schedule, "triton")
    table = records.table
    table["status"] = pd.Categorical(status, categories=table["status"].cat.categories)
    table["sent_s"] = np.where(table["status"] == "not_sent", np.nan, table["intended_s"])
    meta = {**records.info.meta, "instances": {model: 1},
            "queue_policies": policies if policies is not None else {model: ["max_queue_size 16"]}}
    return records.with_info(meta=meta, server_stats={model: {"busy_s": busy_s,
                                                              "execution_count": statuses.get("ok", 0)}})


def test_detection_needs_refusals_with_idle_instances_and_a_policy():
    # the probe's run: 3021 sent, 112 ok, 2620 rejected, 289 timed out, 116 batches of 13 ms in 10 s
    probe = _records("m", {"ok": 112, "rejected": 2620, "timeout": 289}, busy_s=116 * 0.013)
    found = queue_policy_collapse(probe)["m"]
    assert found["refused"] == 2909 and found["sent"] == 3021 and abs(found["utilisation"] - 0.1508) < 1e-3
    assert abs(found["capacity_rps"] - 11.2 / 0.1508) < 0.1
    # a healthy overloaded server rejects as much but is busy all the time
    assert queue_policy_collapse(_records("m", {"ok": 700, "rejected": 2300}, busy_s=9.5)) is None
    # idle and a few rejections from one burst: not a collapse
    assert queue_policy_collapse(_records("m", {"ok": 300, "rejected": 10}, busy_s=3.0)) is None
    # no queue policy: the defect cannot be the cause
    assert queue_policy_collapse(_records("m", {"ok": 112, "rejected": 2909}, busy_s=1.5, policies={})) is None
