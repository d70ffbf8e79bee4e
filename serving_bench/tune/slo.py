"""Per-model latency SLOs from the command line or a YAML file, in seconds.

Form: ``MODEL=STAT:VALUEUNIT,...`` with STAT one of ``p50, p90, p95, p99, p99.9, mean`` and UNIT ``us``, ``ms`` or
``s`` (required: no guessing); a model may appear more than once (``a=p99:20ms,a=p50:5ms``). The result maps entry
name to ``{stat: bound_s}``, the shape :func:`serving_bench.run.metrics.summarize` takes as ``slos``. In YAML (forecast
files) durations follow the load profiles' rule: a bare number is seconds, or a string with a unit.
"""

from __future__ import annotations

import math
import re
from typing import Mapping

from serving_bench.errors import InputError
from serving_bench.load.fields import Where, seconds
from serving_bench.run.schedule import Schedule
from serving_bench.units import SECONDS_PER

STATS = ("p50", "p90", "p95", "p99", "p99.9", "mean")
SLO_FORM = "expected MODEL=STAT:VALUE(us|ms|s), comma-separated, STAT one of " + ", ".join(STATS) + \
    " (e.g. resnet50_onnxruntime=p99:20ms,tiny_cnn_tvm=p99:5ms)"

_ITEM = re.compile(r"^(?P<model>[A-Za-z0-9][A-Za-z0-9_.\-]*)=(?P<stat>p[0-9.]+|mean):(?P<value>[0-9]*\.?[0-9]+)"
                   r"(?P<unit>us|ms|s)$")


def parse_slos(text: str, source: str = "--slo") -> dict[str, dict[str, float]]:
    """Parse ``--slo`` text; any malformed item is an :class:`InputError` naming it and the expected form."""
    out: dict[str, dict[str, float]] = {}
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise InputError(source, None, SLO_FORM)
    for item in items:
        match = _ITEM.match(item)
        if not match or match.group("stat") not in STATS or float(match.group("value")) <= 0:
            raise InputError(source, item, SLO_FORM)
        bound = float(match.group("value")) * SECONDS_PER[match.group("unit")]
        out.setdefault(match.group("model"), {})[match.group("stat")] = bound
    return out


def slos_from_mapping(data: Mapping, source: str, field: str = "slos") -> dict[str, dict[str, float]]:
    """SLOs written in YAML as ``{model: {p99: 20ms, ...}}`` (or ``{model: "p99:20ms"}``) -> seconds; a bare number
    is seconds (the load profiles' rule, :func:`serving_bench.load.fields.seconds`)."""
    if not isinstance(data, Mapping):
        raise InputError(source, field, "expected a mapping MODEL: {STAT: DURATION}")
    out: dict[str, dict[str, float]] = {}
    for model, stats in data.items():
        if isinstance(stats, str):
            out.update(parse_slos(f"{model}={stats}", source))
            continue
        if not isinstance(stats, Mapping) or not stats:
            raise InputError(source, f"{field}.{model}", "expected a mapping STAT: DURATION, e.g. {p99: 20ms}")
        for stat, bound in stats.items():
            if str(stat) not in STATS:
                raise InputError(source, f"{field}.{model}.{stat}", f"expected a statistic among {', '.join(STATS)}")
            bound_s = seconds(bound, Where(str(source), f"{field}.{model}.{stat}"), allow_zero=False)
            out.setdefault(str(model), {})[str(stat)] = bound_s
    return out


def format_slos(slos: Mapping[str, Mapping[str, float]]) -> str:
    """The ``--slo`` form of ``slos`` (milliseconds), for messages and reports."""
    return ",".join(f"{m}={s}:{b * 1e3:g}ms" for m, stats in slos.items() for s, b in stats.items())


def slos_from_meta(data: Mapping, source: str = "load profile") -> dict[str, dict[str, float]]:
    """The ``slos`` a schedule's meta carries (already seconds, from the load profile)."""
    out: dict[str, dict[str, float]] = {}
    for model, stats in (data or {}).items():
        for stat, bound in dict(stats).items():
            if stat not in STATS or not isinstance(bound, (int, float)) or not math.isfinite(bound) or bound <= 0:
                raise InputError(source, f"slos.{model}.{stat}", "expected a statistic among "
                                 f"{', '.join(STATS)} with a bound > 0 s")
            out.setdefault(str(model), {})[str(stat)] = float(bound)
    return out


def resolve_slos(text: str | None, schedule: Schedule) -> dict[str, dict[str, float]]:
    """``--slo`` if given, else the load profile's ``slos`` (the schedule's meta); every model must be in the
    schedule."""
    if text:
        slos = parse_slos(text)
        source = "--slo"
    else:
        slos = slos_from_meta(schedule.meta.get("slos") or {}, str(schedule.meta.get("profile") or "load profile"))
        source = "load profile"
    if not slos:
        raise InputError("--slo", None, "no SLOs: pass --slo or set slos in the load profile; " + SLO_FORM)
    for model in slos:
        if model not in schedule.models:
            raise InputError(source, model, f"not a model of the load; models: {', '.join(schedule.models)}")
    return slos
