"""Variants in the search: which measured variant of its zoo model serves each tuned entry.

A tuned entry of the load (a *slot*: the name its requests carry, ``resnet50_onnxruntime``) may be served by any
variant of the same zoo model that the profile measured (``resnet50_onnxruntime_int8``, ``resnet50_tvm_trials-64``:
entries whose profile names the same ``model``). ``tune --variants auto`` offers every measured one; a list
(``onnxruntime,onnxruntime:int8,tvm:trials=64``) offers those of it the profile holds, and says which it does not:
the tuner chooses only among measured variants (:func:`variant_candidates`).

On the simulator the slot keeps its name and takes the chosen variant's measurements (:func:`profile_view`); on
Triton the chosen entry is served under its own name and the load's requests for the slot go to it
(:func:`renamed_config`, :func:`renamed_schedule`, :func:`summary_for_slots`).

What the profile rules out before anything is simulated (:func:`dominated`): a variant whose service time (mean and
p99) at every batch size it was measured at, at every thread count either was measured at, its memory per instance,
its CPU-seconds and its energy per request are all no better than another's, and worse in one, is dropped.

Memory (:func:`config_memory`): per device, each model's instances ``k * USS`` plus the pages they share (RSS - USS)
once per framework on that device (:meth:`~serving_bench.profiles.entries.ModelOnDevice.memory_for`), each read at
the model's ``max_batch_size`` (:meth:`~serving_bench.profiles.entries.ModelOnDevice.memory_at`); on a GPU the
device memory per instance times the instances. Energy (:func:`predicted_energy`): each simulated request's share of
its executed batch, ``rows * E(n) / n`` for a batch of ``n`` rows, ``E(n)`` the profile's energy (or CPU-seconds) of
a request of ``n`` rows alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import psutil

from serving_bench.errors import InputError
from serving_bench.export.variants import parse_variants
from serving_bench.run.records import Records
from serving_bench.run.schedule import Schedule
from serving_bench.serving_config import ServingConfig

GB = 1e9  # --memory-gb: 10^9 bytes


@dataclass(frozen=True)
class Candidates:
    """Per slot its candidate entries (the first: the slot's own entry when it is one), and what was asked for but
    not measured, or dropped, in words."""

    per_slot: Mapping[str, tuple[str, ...]]
    notes: tuple[str, ...] = ()

    def searched(self) -> dict[str, tuple[str, ...]]:
        """The slots with a choice to make (two candidates or more)."""
        return {s: c for s, c in self.per_slot.items() if len(c) > 1}


def zoo_of(profile, name: str) -> str:
    """The zoo model an entry is a variant of: its profile's ``model``, else the longest measured ``model`` its name
    starts with (``resnet50`` for ``resnet50_onnxruntime``); "" when none."""
    own = profile.models.get(name)
    if own is not None and own.model:
        return own.model
    known = sorted({mp.model for mp in profile.models.values() if mp.model}, key=len, reverse=True)
    return next((z for z in known if name.startswith(z + "_")), "")


def variant_candidates(profile, slots: Sequence[str], asked: str | None, devices: Mapping[str, Sequence[str]],
                       fixed: Iterable[str] = ()) -> Candidates:
    """Each slot's candidates for ``--variants`` ``asked`` (None: none, each slot its own entry; ``auto``: every
    measured variant of its zoo model; else a list of variants). ``devices``: where each slot is served (a candidate
    must be measured there); ``fixed``: slots that keep their entry (an ensemble's members)."""
    if not asked:
        return Candidates({s: (s,) for s in slots})
    listed = None if asked.strip() == "auto" else parse_variants(asked)
    per_slot, notes = {}, []
    for slot in slots:
        zoo = zoo_of(profile, slot)
        if slot in fixed or not zoo:
            per_slot[slot] = (slot,)
            notes.append(f"{slot}: served as it is ({'an ensemble member' if slot in fixed else 'no zoo model known'}"
                         ": its variants are not searched)")
            continue
        if listed is None:
            names = [n for n, mp in profile.models.items() if mp.model == zoo]
        else:
            names = [v.entry_name(zoo) for v in listed]
            for v, name in zip(listed, names):
                if name not in profile.models:
                    notes.append(f"{slot}: variant {v.id} ({name}) is not in the profile: tune chooses only among "
                                 f"measured variants (serving-bench profile --models {name})")
            names = [n for n in names if n in profile.models]
        names = [n for n in names if all(d in profile.models[n].devices for d in devices[slot])]
        if not names:
            raise InputError("--variants", asked, f"no variant of {zoo} for {slot} is measured in the profile on "
                                                  f"{', '.join(devices[slot])}")
        per_slot[slot] = tuple(sorted(names, key=lambda n: (n != slot, n)))
    return Candidates(per_slot, tuple(notes))


def _thread_counts(md) -> set[int]:
    return {md.threads, *md.other_threads}


def _no_better(a, b, sizes: Sequence[int]) -> tuple[bool, bool] | None:
    """(b no worse than a everywhere, b better somewhere) on service, memory and CPU-seconds per request; None
    when they cannot be compared (a size or thread count one of them cannot run)."""
    better = False
    for t in sorted(_thread_counts(a) | _thread_counts(b)):
        at, bt = a.for_threads(t), b.for_threads(t)
        for size in sizes:
            try:
                sa, sb = at.service(at.executed_size(size)), bt.service(bt.executed_size(size))
            except KeyError:
                return None
            pairs = [(sa.mean, sb.mean), (sa.quantile(0.99), sb.quantile(0.99))]
            if any(y > x for x, y in pairs):
                return False, False
            better = better or any(y < x for x, y in pairs)
    costs = [(a.memory_for(1), b.memory_for(1))]
    if a.energy is not None and b.energy is not None:
        costs += [(a.energy.cpu_s.get(s), b.energy.cpu_s.get(s)) for s in sizes]
        if a.energy.measure == b.energy.measure:
            costs += [(a.energy.at(s), b.energy.at(s)) for s in sizes]
    for x, y in costs:
        if x is None or y is None:
            continue
        if y > x:
            return False, False
        better = better or y < x
    return True, better


def dominated(profile, candidates: Sequence[str], device: str) -> dict[str, str]:
    """The candidates another candidate dominates on ``device`` (module doc), each with the one that does."""
    out: dict[str, str] = {}
    for a in candidates:
        ma = profile.models[a].devices[device]
        for b in candidates:
            if b == a or b in out:
                continue
            judged = _no_better(ma, profile.models[b].devices[device], ma.batch_sizes)
            if judged is not None and all(judged):
                out[a] = b
                break
    return out


def profile_view(profile, chosen: Mapping[str, str]):
    """``profile`` with each slot's measurements those of its chosen entry (``chosen``: slot -> entry); pair curves
    of a slot served by another entry are dropped (they were measured with the slot's own)."""
    swapped = {slot: entry for slot, entry in chosen.items() if entry != slot}
    if not swapped:
        return profile
    models = dict(profile.models)
    for slot, entry in swapped.items():
        models[slot] = dataclasses.replace(profile.models[entry], name=slot)
    pairs = tuple(p for p in profile.pairs if not set(p.models) & set(swapped))
    return dataclasses.replace(profile, models=models, pairs=pairs)


def config_memory(profile, config: ServingConfig) -> tuple[dict[str, int], tuple[str, ...]]:
    """(bytes per device the config's instances are predicted to hold, the models with no memory in the profile)."""
    own: dict[str, int] = {}
    shared: dict[tuple[str, str], int] = {}
    missing = []
    for ms in config.models:
        for device, count in ms.instances:
            md = profile.on_device(ms.name, device)
            rss, uss = md.memory_at(max(ms.max_batch_size, 1))
            if rss is None:
                missing.append(ms.name)
                continue
            if uss is None:
                own[device] = own.get(device, 0) + count * rss
                continue
            own[device] = own.get(device, 0) + count * uss
            key = (device, profile.models[ms.name].framework)
            shared[key] = max(shared.get(key, 0), rss - uss)
    for (device, _), extra in shared.items():
        own[device] += extra
    return own, tuple(dict.fromkeys(missing))


def memory_budget(profile, devices: Iterable[str], memory_gb: float | None) -> dict[str, int]:
    """Bytes each device may hold: ``memory_gb`` GB (10^9 bytes) on every device; by default the host's available
    memory now (``MemAvailable``) for a CPU, the profile's memory for a GPU (none where it does not say)."""
    out = {}
    for device in devices:
        if memory_gb is not None:
            out[device] = int(memory_gb * GB)
        elif profile.devices[device].kind == "cpu":
            out[device] = int(psutil.virtual_memory().available)
        elif profile.devices[device].memory_bytes:
            out[device] = int(profile.devices[device].memory_bytes)
    return out


def over_budget(memory: Mapping[str, int], budget: Mapping[str, int]) -> float:
    """The largest ``memory / budget`` over the devices with a budget (0 when there is none)."""
    return max((memory.get(d, 0) / b for d, b in budget.items() if b > 0), default=0.0)


def predicted_energy(records: Records, profile) -> dict | None:
    """Energy (or CPU-seconds, the proxy) per answered request of a simulated run (module doc), overall and per
    model, in the profile's measure; None where a model of the run has no energy in the profile."""
    table = records.table
    ok = table[table["status"].astype(str) == "ok"]
    if ok.empty:
        return None
    per_model, measures, total = {}, set(), 0.0
    for model, group in ok.groupby(ok["model"].astype(str), observed=True):
        mp = profile.models.get(model)
        md = next(iter(mp.devices.values())) if mp is not None else None
        if md is None or md.energy is None:
            return None
        measures.add((md.energy.measure, md.energy.unit))
        executed = group["exec_batch"].to_numpy(dtype=float)
        executed = np.where(np.isfinite(executed) & (executed > 0), executed, group["batch"].to_numpy(dtype=float))
        sizes = np.unique(executed)
        cost = dict(zip(sizes, (md.energy.at(int(n)) for n in sizes)))
        shares = group["batch"].to_numpy(dtype=float) * np.vectorize(cost.get)(executed) / executed
        per_model[model] = float(shares.mean())
        total += float(shares.sum())
    measure, unit = sorted(measures)[0] if len(measures) == 1 else \
        ("mixed: " + ", ".join(sorted(m for m, _ in measures)), "mixed")
    return {"per_request": total / len(ok), "measure": measure, "unit": unit, "models": per_model}


def renamed_config(config: ServingConfig, chosen: Mapping[str, str]) -> ServingConfig:
    """``config`` with each slot's serving under its chosen entry's name."""
    return dataclasses.replace(config, models=tuple(m.replace(name=chosen.get(m.name, m.name)) for m in config.models))


def renamed_schedule(schedule: Schedule, chosen: Mapping[str, str]) -> Schedule:
    """``schedule`` with each slot's requests sent to its chosen entry."""
    return dataclasses.replace(schedule, models=tuple(chosen.get(m, m) for m in schedule.models))


def summary_for_slots(summary: dict, chosen: Mapping[str, str]) -> dict:
    """A summary of a run on the chosen entries with its per-model figures under the slots' names again."""
    back = {entry: slot for slot, entry in chosen.items()}
    return dict(summary, models={back.get(m, m): s for m, s in summary.get("models", {}).items()})
