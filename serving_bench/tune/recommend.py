"""The recommendation in plain words, for the terminal and the top of the report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from serving_bench.serving_config import ServingConfig
from serving_bench.tune.load import GROWTHS


def describe_model(m, entry: str | None = None) -> str:
    """``resnet50_onnxruntime: 2 instances on gpu0, max_batch_size 8, queue delay 500 µs, preferred [8]``; served by
    another ``entry`` (a variant), ``resnet50_onnxruntime as resnet50_tvm_trials-64: ...``."""
    where = ", ".join(f"{count} on {device}" for device, count in m.instances)
    parts = [f"{m.instance_count} instance{'s' if m.instance_count != 1 else ''} ({where})"]
    if m.max_batch_size > 0:
        parts.append(f"max_batch_size {m.max_batch_size}")
        parts.append(f"queue delay {m.max_queue_delay_us} µs")
        if m.preferred_batch_sizes:
            parts.append("preferred batch sizes " + ",".join(map(str, m.preferred_batch_sizes)))
    else:
        parts.append("no batching")
    served = f" as {entry}" if entry and entry != m.name else ""
    return f"{m.name}{served}: " + ", ".join(parts)


def config_dict(config: ServingConfig) -> dict:
    """JSON form of a config for ``tune.json`` and the report."""
    return {m.name: {"instances": m.instance_count, "device": ",".join(d for d, _ in m.instances),
                     "max_batch_size": m.max_batch_size, "max_queue_delay_us": m.max_queue_delay_us,
                     "preferred_batch_sizes": list(m.preferred_batch_sizes)} for m in config.models}


def _slo_text(slos: Mapping[str, Mapping[str, float]]) -> str:
    return "; ".join(f"{m} " + ", ".join(f"{s} ≤ {b * 1e3:g} ms" for s, b in st.items()) for m, st in slos.items())


def scale_text(scale: float, growth: str) -> str:
    """``2.38× (superpose)``: a load multiple named with its growth rule."""
    return f"{scale:.2f}× ({growth})"


def interval_lines(result: dict, growth: str) -> list[str]:
    """How sure a candidate's capacity is: its interval over the replicated searches (``capacity_interval``) and,
    where the SLOs were judged at a confidence (``judged_at``), at which."""
    lines = []
    judged = result.get("judged_at")
    if judged:
        lines.append(f"Each SLO was judged at the upper end of its {judged['confidence']:.0%} interval over "
                     f"{judged['replications']} replications a probe (tune --confidence; host spread "
                     f"{judged['host_spread'] * 100:.1f} %): a capacity most runs of that length keep.")
    found = result.get("capacity_interval")
    if found and found["low_scale"] is not None:
        capped = sum(found["capped"])
        lines.append(f"Its capacity's {found['confidence']:.0%} interval: {scale_text(found['low_scale'], growth)} to "
                     f"{found['high_scale']:.2f}× ({found['low_rps']:,.1f} to {found['high_rps']:,.1f} req/s), over "
                     f"{found['replications']} searches each on its own realisation of the load, simulator seed and "
                     f"host speed (host spread {found['host_spread'] * 100:.1f} %: {found['host_spread_source']})"
                     + (f"; {capped} of them met the SLOs at the top of the search." if capped else "."))
        if found.get("extrapolated"):
            lines.append(f"It reaches above the busiest load the profile measured "
                         f"({scale_text(found['ceiling_scale'], growth)}, {found['ceiling_rps']:,.1f} req/s): the "
                         f"simulator extrapolates there, so the interval runs down to that load.")
    return lines


def capacity_check_text(check: dict) -> str:
    """What a candidate's replays at its capacity say (``verify.capacity_check``), in words."""
    growth, capacity = check["growth"], check["predicted_scale"]
    met, failed = check["measured_met_scale"], check["measured_failed_scale"]
    if capacity <= 0:
        return ("missed the SLOs at 1×, as predicted" if check["agrees"] else
                "met the SLOs at 1× although the simulator predicted a miss")
    if met is None:
        bracket = f"below {scale_text(failed, growth)}"
    elif failed is None:
        bracket = f"at least {scale_text(met, growth)}"
    else:
        bracket = f"between {scale_text(met, growth)} and {failed:.2f}×"
    at = f"the predicted capacity {scale_text(capacity, growth)}" + (" (the top of the search)" if check["capped"]
                                                                       else "")
    held = "held at" if check["held_at_capacity"] else "were missed at"
    how = "as predicted" if check["agrees"] else ("below the prediction" if not check["held_at_capacity"] else
                                                   "above the prediction")
    interval = check.get("interval")
    return (f"the SLOs {held} {at}; measured capacity {bracket}, {how}"
            + (f"; that is {interval_text(interval)}" if interval else ""))


def interval_text(interval: dict, whose: str = "its") -> str:
    """Where the measured capacity lies against a candidate's capacity interval (``verify.capacity_check``'s
    ``interval``), in words: inside, outside, or not placed by the replays."""
    span = f"{whose} {interval['confidence']:.0%} interval" if interval.get("confidence") else f"{whose} interval"
    span += f" ({interval['low_scale']:.2f}× to {interval['high_scale']:.2f}×)"
    return {True: "inside ", False: "outside ", None: "not placed by the replays against "}[interval["holds"]] + span


def _memory_energy(result: dict) -> list[str]:
    """The pick's predicted memory per device and energy per request, where the profile has them."""
    parts = []
    if result.get("memory_bytes"):
        parts.append("its instances are predicted to hold " + ", ".join(f"{v / 1e9:.2f} GB on {d}" for d, v in
                                                                       result["memory_bytes"].items()))
    energy = result.get("energy")
    if energy:
        parts.append(f"{energy['per_request']:.3g} {energy['unit']} a request at the load ({energy['measure']})")
    return [f"Resources: {'; '.join(parts)}."] if parts else []


def _verification_line(v: dict, slos: Mapping) -> str:
    """One verified candidate: its 1x figures and, where replayed, what its capacity replays say."""
    measured = v.get("measured", {})
    figures = [f"{model} {stat} {measured[model][f'{stat}_s'] * 1e3:.1f} ms" for model, stats in slos.items()
               for stat in stats if measured.get(model, {}).get(f"{stat}_s") is not None]
    status = "meets" if v.get("slo_met") else "does NOT meet"
    line = (f"Verified on real Triton ({v.get('server', 'embedded')}), candidate #{v['rank']}: {status} the SLOs at "
            f"1× — " + ("; ".join(figures) or "no completed requests"))
    replays = v.get("replays") or []
    if v.get("capacity") and replays:
        scales = ", ".join(f"{r['scale']:.2f}×" for r in replays)
        line += (f"; replayed at {scales} ({replays[0]['duration_s']:.1f} s each): "
                 f"{capacity_check_text(v['capacity'])}")
    return line + "."


@dataclass(frozen=True)
class Asked:
    """What a tune was asked, as its recommendation states it: the SLOs (model -> stat -> bound, s), the load's
    offered req/s at 1x and its growth rule, the objective, the hardware (words) and the ladder's top scale."""

    slos: Mapping
    offered_rps: float
    objective: str
    hardware: str
    max_scale: float
    growth: str = "superpose"


def tune_recommendation(best: dict | None, config: ServingConfig | None, asked: Asked,
                        verification: list[dict], chosen: Mapping[str, str] | None = None) -> list[str]:
    """Lines of plain text: what to deploy (``chosen``: the entry serving each model, where a variant was chosen),
    what it achieves, how it was checked."""
    slos, offered_rps, hardware, growth = asked.slos, asked.offered_rps, asked.hardware, asked.growth
    if best is None or config is None:
        return ["Nothing was evaluated: the search space was empty or the budget was spent before the first result."]
    r = best["result"]
    lines = []
    models = "; ".join(describe_model(m, (chosen or {}).get(m.name)) for m in config.models)
    if r["feasible"]:
        bound = "at least " if r["capacity_capped"] else "up to "
        threads = (f", {config.threads_per_instance} runtime thread{'s' if config.threads_per_instance != 1 else ''} "
                   f"per instance (serve --threads-per-instance {config.threads_per_instance})"
                   if config.threads_per_instance else "")
        lines.append(f"Deploy: {models}{threads}.")
        gpus = f" on {r['gpus']} GPU{'s' if r['gpus'] != 1 else ''}" if r["gpus"] else ""
        lines.append(f"On the simulator ({hardware}) this meets every SLO ({_slo_text(slos)}){gpus} at the load "
                     f"profile's {offered_rps:,.1f} req/s and {bound}{scale_text(r['capacity_scale'], growth)} that "
                     f"load ({r['capacity_rps']:,.1f} req/s; grown by {growth}: {GROWTHS[growth]})"
                     + (f"; the search stopped at {asked.max_scale:g}×." if r["capacity_capped"] else "."))
        lines += interval_lines(r, growth)
        lines += _memory_energy(r)
    elif r.get("memory_exceeded"):
        held = ", ".join(f"{d} {v / 1e9:.2f} GB" for d, v in r["memory_bytes"].items())
        lines.append(f"No configuration searched fits the memory budget (--memory-gb): the least of them, {models}, "
                     f"is predicted to hold {held}. Allow more memory, fewer instances or smaller variants.")
    else:
        worst = []
        for model, stats in slos.items():
            got = r["models"].get(model, {})
            for stat, b in stats.items():
                v = got.get(f"{stat}_s")
                worst.append(f"{model} {stat} {v * 1e3:.1f} ms (SLO {b * 1e3:g} ms)" if v is not None else
                             f"{model} {stat}: no completed requests (SLO {b * 1e3:g} ms)")
        lines.append(f"The SLOs cannot be met: no configuration searched meets them at the load profile's "
                     f"{offered_rps:,.1f} req/s on the simulator ({hardware}).")
        lines.append(f"Best achievable: {models} — " + "; ".join(worst) + ".")
        lines.append("Relax the SLOs, allow more instances or GPUs (--instances, --gpus), or lower the load.")
    lines += [_verification_line(v, slos) for v in verification]
    if asked.objective == "gpus" and r["feasible"]:
        lines.append(f"Objective: fewest GPUs, then capacity ({r['gpus']} used).")
    return lines
