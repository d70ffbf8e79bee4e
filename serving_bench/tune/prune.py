"""What the profile rules out before the search (``tune``'s space, pruned; each cut named in the log and in
``tune.json``'s ``search.pruned``):

- **dominated variants** (:func:`~serving_bench.tune.variants.dominated`): a variant no faster at any batch size and
  thread count, no smaller and no cheaper per request than another of the same model, and worse in one;
- **batch sizes the load cannot fill**: at ``max_scale`` times the load, a model's rows arrive at ``r`` rows/s; in
  one batch's time at the largest candidate ``max_batch_size`` (its slowest candidate variant, the longest queue
  delay added) ``m = r * (service + delay)`` rows arrive on average, and a burst rarely brings more than
  ``n = m + 4 sqrt(m) + 1`` (four standard deviations of a Poisson count, and one), so no batch holds more;
  ``max_batch_size`` values above the smallest one ``>= n`` serve as that one does, except through the
  preferred-size rules, and are dropped;
- **instance counts over the memory budget**: ``k`` instances of a model (its smallest variant at its smallest
  candidate batch size) beside one instance of every other model on the same device (theirs smallest) that are
  predicted to hold more than the device's budget.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from serving_bench.serving_config import ServingConfig
from serving_bench.tune.space import ModelKnobs
from serving_bench.tune.variants import dominated


def slot_rows_per_s(schedule, config: ServingConfig) -> dict[str, float]:
    """Rows per second each served model receives in ``schedule`` (an ensemble's requests count for its
    members)."""
    duration = max(schedule.duration_s, 1e-9)
    rows = {m: float(schedule.batch[schedule.model == i].sum()) for i, m in enumerate(schedule.models)}
    out = {m: rows.get(m, 0.0) for m in config.names}
    for ensemble, members in config.ensembles:
        for member in members:
            out[member] = out.get(member, 0.0) + rows.get(ensemble, 0.0)
    return {m: v / duration for m, v in out.items()}


def _slowest_service(profile, entries: Sequence[str], device: str, batch: int) -> float:
    """The longest mean service time of a batch of ``batch`` rows among ``entries``, at any thread count measured."""
    worst = 0.0
    for name in entries:
        md = profile.models[name].devices[device]
        for threads in {md.threads, *md.other_threads}:
            at = md.for_threads(threads)
            size = at.executed_size(min(batch, at.batch_sizes[-1]))
            worst = max(worst, at.service(size).mean)
    return worst


def fillable(knob: ModelKnobs, profile, entries: Sequence[str], device: str, top_rows_per_s: float) -> tuple[int, ...]:
    """The ``max_batch_size`` values worth searching (module doc)."""
    values = sorted(knob.max_batch_size)
    if values == [0] or len(values) == 1:
        return tuple(values)
    delay = max(knob.max_queue_delay_us) * 1e-6
    mean = top_rows_per_s * (_slowest_service(profile, entries, device, values[-1]) + delay)
    arriving = mean + 4.0 * math.sqrt(mean) + 1.0
    keep = [v for v in values if v <= arriving]
    above = [v for v in values if v > arriving]
    return tuple(keep + above[:1])


def _memory(profile, entry: str, device: str, count: int, knob: ModelKnobs) -> int:
    """The least ``count`` instances of ``entry`` hold among ``knob``'s batch sizes."""
    return profile.models[entry].devices[device].memory_for(count, max(min(knob.max_batch_size), 1)) or 0


def memory_instances(knob: ModelKnobs, others: Sequence[ModelKnobs], profile, device: str, budget: int,
                     entries: Mapping[str, Sequence[str]]) -> tuple[int, ...]:
    """The instance counts of ``knob``'s model that fit ``budget`` bytes beside ``others`` at their least (module
    doc); its smallest count when none does (the candidates' own check then says so)."""
    rest = sum(min(_memory(profile, e, device, min(o.instances), o) for e in entries[o.name]) for o in others)
    fits = tuple(k for k in knob.instances
                 if min(_memory(profile, e, device, k, knob) for e in entries[knob.name]) + rest <= budget)
    return fits or (min(knob.instances),)


def prune(knobs: tuple[ModelKnobs, ...], profile, devices: Mapping[str, Sequence[str]],
          top_rows_per_s: Mapping[str, float], budget: Mapping[str, int],
          together: bool = True) -> tuple[tuple[ModelKnobs, ...], list[str]]:
    """``knobs`` with what the profile rules out removed (module doc), and a line for each cut; ``together``: the
    models on one device share it (not so where a search places them on several GPUs: each is judged alone)."""
    notes: list[str] = []
    out = []
    for knob in knobs:
        device = devices[knob.name][0]
        entries = list(knob.variant) or [knob.name]
        beaten = dominated(profile, entries, device) if len(entries) > 1 else {}
        for loser, winner in beaten.items():
            notes.append(f"{knob.name}: variant {loser} dropped: dominated by {winner} (no faster at any measured "
                         "batch size and thread count, no smaller per instance, no cheaper per request)")
        entries = [e for e in entries if e not in beaten]
        mbs = fillable(knob, profile, entries, device, top_rows_per_s.get(knob.name, 0.0))
        if mbs != tuple(sorted(knob.max_batch_size)):
            dropped = sorted(set(knob.max_batch_size) - set(mbs))
            notes.append(f"{knob.name}: max_batch_size {', '.join(map(str, dropped))} dropped: at the top of the "
                         f"search ({top_rows_per_s.get(knob.name, 0.0):,.1f} rows/s) no batch fills beyond "
                         f"{max(mbs)}")
        out.append(dataclasses.replace(knob, max_batch_size=mbs,
                                       variant=tuple(entries) if knob.variant else knob.variant))
    final = []
    for knob in out:
        device = devices[knob.name][0]
        if device in budget and _has_memory(profile, knob, device):
            others = [o for o in out if o is not knob and devices[o.name][0] == device] if together else []
            entries = {o.name: list(o.variant) or [o.name] for o in out}
            counts = memory_instances(knob, others, profile, device, budget[device], entries)
            if counts != knob.instances:
                dropped = ", ".join(map(str, sorted(set(knob.instances) - set(counts))))
                notes.append(f"{knob.name}: instance counts {dropped} dropped: predicted over the memory budget of "
                             f"{device} ({budget[device] / 1e9:.1f} GB)")
                knob = dataclasses.replace(knob, instances=counts)
        final.append(knob)
    return tuple(final), notes


def _has_memory(profile, knob: ModelKnobs, device: str) -> bool:
    return all(profile.models[e].devices[device].memory_bytes is not None for e in (knob.variant or (knob.name,)))


def top_rates(schedule, config: ServingConfig, max_scale: float) -> dict[str, float]:
    """Rows per second of each model at ``max_scale`` times the load."""
    return {m: float(np.float64(r) * max_scale) for m, r in slot_rows_per_s(schedule, config).items()}
