"""Detecting the queue-policy collapse of the bundled tritonserver 2.51 in a replay's records.

With a queue policy (``max_queue_size``, ``default_timeout_microseconds``, ``allow_timeout_override`` or priority
levels; :func:`serving_bench.serving_config.queue_policy_settings`) Triton's dynamic batcher hands a batch to an
instance only while an instance is waiting for one, and an instance that becomes free does not wake it: the batcher
notices on the next *accepted* arrival or after its own 0.5 s timer. With a full queue arrivals are rejected before
they could wake it, so the server computes one batch per timer tick while rejecting everything else
(``docs/serve.md#queue-policies-under-overload-the-bundled-tritonserver-251``;
``scripts/diagnostics/repro_queue_policy.py`` reproduces it).

The symptom a run can see without knowing the model's capacity: the server refused or expired many requests (queue
full, queue timeout, or the client's deadline) while its instances were computing only a small part of the run.
Utilisation is Triton's own compute time of the run's executions (per-batch-size statistics, so a batch counts
once) over instances x run length; the rate the instances would answer at full use is the answered rate divided by
that utilisation (same batch sizes). A healthy overloaded server is busy nearly all the time, so the two conditions
together do not happen without the defect (or a server stalled for another reason).
"""

from __future__ import annotations

import warnings

import numpy as np

from serving_bench.run.records import Records

MAX_UTILISATION = 0.5   # instances computing less than this share of the run ...
MIN_REFUSED_SHARE = 0.05  # ... while at least this share of the sent requests was refused or expired ...
MIN_REFUSED = 20          # ... and at least this many (a short burst on a small run is not a collapse)
ATTR = "queue_policy_collapse"  # the one field: RunInfo and the summary


class QueuePolicyCollapseWarning(UserWarning):
    """A model with a queue policy answered far below what its instances could do while refusing requests."""


def queue_policy_collapse(records: Records) -> dict | None:
    """Per model with a queue policy that collapsed in this run: ``{model: {"reason": one line, "utilisation",
    "refused", "sent", "answered_rps", "capacity_rps", "settings"}}``; ``None`` when none did (or the run lacks
    Triton's statistics). Needs ``records.info``: ``meta.queue_policies``, ``meta.instances``, ``server_stats``
    (with ``busy_s``) and the run length (``meta.duration_s``; a partial or closed-loop run: ``elapsed_s`` if
    shorter)."""
    info = records.info
    meta = info.meta or {}
    policies = meta.get("queue_policies") or {}
    stats = info.server_stats or {}
    length = float(meta.get("duration_s") or info.elapsed_s or 0.0)
    if info.elapsed_s and (info.partial or info.mode == "closed"):  # the part that ran
        length = min(length, float(info.elapsed_s))
    if not policies or length <= 0:
        return None
    status = records.table["status"].astype(str).to_numpy()
    model = records.table["model"].astype(str).to_numpy()
    found = {}
    for name, settings in policies.items():
        row = stats.get(name)
        if not row or row.get("busy_s") is None:
            continue
        mine = status[model == name]
        sent = int(np.count_nonzero(mine != "not_sent"))
        refused = int(np.count_nonzero((mine == "rejected") | (mine == "timeout")))
        ok = int(np.count_nonzero(mine == "ok"))
        instances = int((meta.get("instances") or {}).get(name, 1))
        utilisation = float(row["busy_s"]) / (instances * length)
        if refused < max(MIN_REFUSED, MIN_REFUSED_SHARE * sent) or utilisation >= MAX_UTILISATION:
            continue
        answered = ok / length
        capacity = answered / utilisation if utilisation > 0 else None
        at_full = f"against ~{capacity:.1f} req/s at full use" if capacity else "with its instances idle"
        reason = (f"{name}: answered {answered:.1f} req/s {at_full} while {refused} of {sent} requests were refused "
                  f"or expired; its {instances} instance(s) computed {utilisation:.0%} of the {length:.1f} s run "
                  f"({row.get('execution_count', 0)} batches). Queue policy ({', '.join(settings)}): the bundled "
                  "Triton 2.51 batcher waits up to 0.5 s for a free instance (docs/serve.md, 'Queue policies under "
                  "overload'); bound the queue at the client instead (--max-in-flight N --on-cap drop)")
        found[name] = {"reason": reason, "utilisation": utilisation, "refused": refused, "sent": sent,
                       "answered_rps": answered, "capacity_rps": capacity, "settings": list(settings)}
    return found or None


def flag_queue_policy_collapse(records: Records) -> Records:
    """``records`` with ``info.queue_policy_collapse`` set (:func:`queue_policy_collapse`), warning once per
    collapsed model (:class:`QueuePolicyCollapseWarning`, one line)."""
    found = queue_policy_collapse(records)
    for entry in (found or {}).values():
        warnings.warn(entry["reason"], QueuePolicyCollapseWarning, stacklevel=3)
    return records.with_info(queue_policy_collapse=found)
