"""Replays that cancel no request on a live server (``serving_bench.load.uncancelled``): on the real tritonserver."""

from __future__ import annotations

import numpy as np
import pytest

from serving_bench.load.uncancelled import cut_after_s, replay_or_cut
from serving_bench.run.schedule import Schedule

pytestmark = pytest.mark.server


def _burst(model: str, n: int, spacing_s: float) -> Schedule:
    t = np.arange(n) * spacing_s
    return Schedule(t, np.zeros(n), (model,), np.zeros(n, dtype=int), np.ones(n, dtype=int),
                    {"duration_s": float(t[-1]) + 0.1, "warmup_s": 0.0, "seed": 0})


def test_a_replay_past_its_cut_ends_the_server_instead_of_cancelling_and_keeps_every_request(tmp_path):
    """A replay that keeps answering past its cut is ended with the server, never by cancelling a request; every
    request is accounted for, the answered ones as answered."""
    from serving_bench.export.sleep import write_sleep_entry
    from serving_bench.run.records import check_accounting, counts
    from serving_bench.serve.server import TritonServer

    write_sleep_entry(tmp_path, "sleep", base_ms=20.0, per_item_ms=0.0, max_batch_size=0)
    with TritonServer(tmp_path) as server:
        light, cut = replay_or_cut(server, _burst("sleep", 5, 0.05), cut_s=0.5)
        assert not cut and not light.info.partial and counts(light.table)["ok"] == 5
        heavy, cut = replay_or_cut(server, _burst("sleep", 150, 0.001), cut_s=0.3)  # 3 s of work for one instance
        assert cut and heavy.info.partial and server.pid is None
        check_accounting(heavy.table)
        tally = counts(heavy.table)
        assert tally["sent"] == 150 == tally["ok"] + tally["failed"] + tally["timeout"]
        assert 5 <= tally["ok"] <= 60 and tally["timeout"] == 0  # ~0.45 s of answers; nothing reached a deadline


def test_the_cut_is_twenty_times_the_largest_bound_and_at_least_two_seconds():
    assert cut_after_s({"a": {"p99": 0.05, "p50": 0.01}, "b": {"p99": 0.2}}) == pytest.approx(4.0)
    assert cut_after_s({"a": {"p99": 0.01}}) == 2.0 and cut_after_s({}) == 2.0
