"""What ``tune`` says about variants and its own cost: the estimate of the search's time printed after its first
evaluation, why each model's variant was chosen (speed, memory and energy against the runners-up), and the
comparison per model the report shows (variant x batch size -> latency, throughput, memory, energy)."""

from __future__ import annotations

from typing import Mapping, Sequence

from serving_bench.errors import InputError
from serving_bench.tune.space import SearchSpace


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_line(obs: dict, points: int, settings) -> str:
    """The search's expected wall time from one evaluation's (``obs``), against its budget and ``--max-evals``."""
    each = max(float(obs["result"].get("eval_s", 0.0)), 1e-3)
    line = (f"estimate: one configuration took {each:.2f} s to simulate; all {points:,} would take "
            f"~{_duration(each * points)} one at a time")
    planned = min(points, settings.max_evals) if settings.max_evals else points
    if settings.budget_s:
        covered = int(settings.budget_s / each)
        line += (f"; the budget of {settings.budget_s / 60:g} min (--budget-minutes) covers ~{min(covered, planned):,}"
                 + (" of them: the generator samples the space" if covered < planned else ""))
    else:
        line += "; no budget (--budget-minutes 0): the search runs to the end"
    return line


def require_energy(profile, space: SearchSpace) -> None:
    """An :class:`InputError` when ``--objective energy`` has no energy to go by for a candidate entry."""
    for knob in space.knobs:
        for entry in knob.variant or (knob.name,):
            if any(md.energy is None for md in profile.models[entry].devices.values()):
                raise InputError("--objective", "energy", f"the profile has no energy (or CPU-seconds) per request for "
                                                          f"{entry}: measure it with serving-bench profile (without "
                                                          "--no-resources)")


def _device(space: SearchSpace, slot: str) -> str:
    instances = space.base[slot].instances
    return instances[0][0] if instances else "cpu"


def _row(profile, entry: str, device: str, batch: int) -> dict:
    """One entry at one measured batch size, as measured (its own threads per instance)."""
    md = profile.models[entry].devices[device]
    service = md.service(batch)
    energy = md.energy
    return {"batch": batch, "latency_s": service.mean, "p99_s": service.quantile(0.99),
            "throughput_rps": batch / service.mean if service.mean > 0 else None,
            "memory_bytes": md.memory_for(1, batch),
            "energy_per_request": energy.at(batch) if energy is not None else None,
            "energy_unit": energy.unit if energy is not None else None,
            "energy_measure": energy.measure if energy is not None else None}


def variants_section(profile, space: SearchSpace, best: dict | None, candidates: Mapping[str, Sequence[str]]) -> dict:
    """Per model with variants: its ``candidates`` (searched, or dropped before the search: ``searched`` false),
    each with its profile's figures per measured batch size (:func:`_row`), and the pick: its entry, its instances
    and ``pick_batch``, the largest measured batch size at or below its ``max_batch_size`` (``tune.json``'s
    ``variants``; the report's table)."""
    chosen = space.entries(best["params"]) if best else {}
    out = {}
    for knob in space.knobs:
        if not knob.variant:
            continue
        device = _device(space, knob.name)
        rows = []
        for entry in candidates.get(knob.name, knob.variant):
            md = profile.models[entry].devices[device]
            rows.append({"entry": entry, "variant": _variant(profile, entry), "searched": entry in knob.variant,
                         "picked": chosen.get(knob.name) == entry, "threads": md.threads,
                         "batches": [_row(profile, entry, device, b) for b in md.batch_sizes]})
        pick_batch = pick_instances = None
        if best and knob.name in chosen:
            params = best["params"]
            pick_batch = _at(profile, chosen[knob.name], device, int(params[f"{knob.name}.max_batch_size"]))["batch"]
            pick_instances = int(params[f"{knob.name}.instances"])
        out[knob.name] = {"device": device, "pick": chosen.get(knob.name), "pick_batch": pick_batch,
                          "pick_instances": pick_instances, "candidates": rows}
    return out


def _variant(profile, entry: str) -> str:
    return profile.models[entry].variant or profile.models[entry].framework


def _at(profile, entry: str, device: str, batch: int) -> dict:
    md = profile.models[entry].devices[device]
    size = max([b for b in md.batch_sizes if b <= max(batch, 1)] or [md.batch_sizes[0]])
    return _row(profile, entry, device, size)


def _figures(row: dict) -> str:
    parts = [f"{row['latency_s'] * 1e3:.1f} ms a batch of {row['batch']}"]
    if row["memory_bytes"] is not None:
        parts.append(f"{row['memory_bytes'] / 1e6:.0f} MB an instance")
    if row["energy_per_request"] is not None:
        unit = "CPU-ms" if row["energy_unit"] == "CPU-s" else "J"
        scale = 1e3 if unit == "CPU-ms" else 1.0
        parts.append(f"{row['energy_per_request'] * scale:.3g} {unit} a request")
    return ", ".join(parts)


def _outcome(result: dict) -> str:
    if result.get("memory_exceeded"):
        return "over the memory budget"
    if not result["feasible"]:
        return f"misses the SLOs ({result['violation']:.2f}x a bound)"
    energy = (result.get("energy") or {}).get("per_request")
    return f"{result['capacity_rps']:,.1f} req/s" + (f", {energy:.3g} {result['energy']['unit']} a request"
                                                      if energy is not None else "")


def why_lines(profile, space: SearchSpace, best: dict, ranked: Sequence[dict],
              candidates: Mapping[str, Sequence[str]]) -> list[str]:
    """Per model with variants: the one chosen and why — the best configuration with it against the best with each
    runner-up, and their profiles' speed, memory and energy at the pick's batch size; the variants dropped before the
    search (dominated) named."""
    lines = []
    chosen = space.entries(best["params"])
    for knob in space.knobs:
        if len(candidates.get(knob.name, ())) < 2:
            continue
        slot, pick = knob.name, chosen[knob.name]
        runners: dict[str, dict] = {}
        for obs in ranked:
            entry = space.entries(obs["params"])[slot]
            if entry != pick and entry not in runners:
                runners[entry] = obs
        device, batch = _device(space, slot), max(int(best["params"][f"{slot}.max_batch_size"]), 1)
        mine = _at(profile, pick, device, batch)
        text = (f"Variant of {slot}: {pick} ({_variant(profile, pick)}); the best configuration with it: "
                f"{_outcome(best['result'])}; measured alone: {_figures(mine)}.")
        others = [f"{entry}: at best {_outcome(obs['result'])} ({_figures(_at(profile, entry, device, batch))})"
                  for entry, obs in runners.items()]
        dropped = [f"{e} ({_figures(_at(profile, e, device, batch))})" for e in candidates[slot]
                   if e not in knob.variant]
        unsearched = [e for e in knob.variant if e != pick and e not in runners]
        if others:
            text += " Runners-up — " + "; ".join(others) + "."
        if dropped:
            text += " Dropped before the search, dominated: " + "; ".join(dropped) + "."
        if unsearched:
            text += f" Not reached within the search's budget: {', '.join(unsearched)}."
        lines.append(text)
    return lines
