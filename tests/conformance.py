"""The Target contract, checked on any target's records (TritonTarget here; the simulator's SimTarget reuses it).

    from conformance import assert_target_contract   # tests/ is on sys.path under pytest
    assert_target_contract(schedule, target.run(schedule))
"""

from __future__ import annotations

import numpy as np

from serving_bench.run.records import COLUMNS, STATUSES, Records, RunInfo, check_accounting, counts
from serving_bench.run.schedule import Schedule


def assert_target_contract(schedule: Schedule, records: Records, *, closed_loop: bool = False,
                           allow_not_sent: bool | None = None) -> dict:
    """Assert every rule a target's records must follow; return the status counts.

    * the columns of :data:`serving_bench.run.records.COLUMNS`, one row per scheduled request (``request_id`` 0..n-1),
      each with exactly one status from :data:`STATUSES`, and ``sent = ok + failed + timed out``;
    * model, batch and intended time copied from the schedule (a closed loop sets ``intended_s`` to the send time
      and may end before using every request: then its rows are a subset, in schedule order per model);
    * times: nothing is sent before it was intended; nothing is done before it was sent; ``ok`` has a ``done_s``,
      ``timeout`` and ``not_sent`` have none; every non-ok status carries an error text, except plain ``not_sent``;
    * ``info`` (a :class:`RunInfo`): ``target`` (str), ``partial`` (bool), ``meta`` carrying the schedule's meta; a
      run that is not partial leaves nothing ``not_sent`` except requests it dropped on purpose (error
      ``dropped: ...``).
    """
    info = records.info
    assert isinstance(info, RunInfo)
    records = records.table
    assert tuple(records.columns) == COLUMNS, f"columns {tuple(records.columns)} != {COLUMNS}"
    check_accounting(records)
    status = records["status"].astype(str).to_numpy()
    assert set(status) <= set(STATUSES)
    n = len(records)
    intended = records["intended_s"].to_numpy()
    sent = records["sent_s"].to_numpy()
    done = records["done_s"].to_numpy()
    error = records["error"].astype(str).to_numpy()
    names = records["model"].astype(str).to_numpy()
    if not closed_loop:
        assert n == len(schedule), f"{n} rows for {len(schedule)} scheduled requests"
        np.testing.assert_array_equal(names, schedule.model_names().astype(str))
        np.testing.assert_array_equal(records["batch"].to_numpy(), schedule.batch)
        np.testing.assert_array_equal(intended, schedule.arrival_s)
    else:
        assert n <= len(schedule)
        np.testing.assert_array_equal(intended[~np.isnan(sent)], sent[~np.isnan(sent)])
    was_sent = ~np.isnan(sent)
    assert np.all(sent[was_sent] >= intended[was_sent] - 1e-9), "a request was sent before its intended time"
    both = was_sent & ~np.isnan(done)
    assert np.all(done[both] >= sent[both]), "a request finished before it was sent"
    assert np.all(np.isnan(done[status == "timeout"])), "a timed-out request has a done_s"
    assert np.all(np.isnan(done[status == "not_sent"]))
    failed = np.isin(status, ["error", "timeout", "rejected"])
    assert np.all(error[failed] != ""), "a failed request carries no error text"
    assert np.all(error[status == "ok"] == ""), "an ok request carries an error text"
    assert isinstance(info.target, str)
    assert isinstance(info.partial, bool)
    meta = info.meta
    for key, value in schedule.meta.items():
        assert meta.get(key) == value, f"records.info.meta[{key!r}] differs from the schedule's"
    c = counts(records)
    dropped = int(np.sum((status == "not_sent") & np.char.startswith(error.astype(str), "dropped:")))
    partial = info.partial
    if allow_not_sent is None:
        allow_not_sent = partial
    if not allow_not_sent:
        assert c["not_sent"] == dropped, f"{c['not_sent'] - dropped} requests not sent in a complete run"
    return c
