"""The forecast file of ``serving-bench plan`` (its fields: :mod:`serving_bench.tune.plan`), read and checked:
any problem is one :class:`~serving_bench.errors.InputError` line naming the file, the field and what was
expected."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from serving_bench.errors import InputError
from serving_bench.files import read_yaml
from serving_bench.tune import adapters
from serving_bench.tune.load import GROWTHS, SCREEN_FORM, screen_asked
from serving_bench.tune.slo import slos_from_mapping
from serving_bench.tune.space import PREFERRED_RULES

GROUPINGS = ("auto", "together", "separate")
SEARCH_KEYS = {"instances": int, "max_batch_size": int, "max_queue_delay_us": int, "preferred": str}


@dataclass(frozen=True)
class Forecast:
    """A forecast file's fields, checked; ``path`` the file, ``load`` and ``profile`` resolved paths (or
    ``builtin:...``), SLO bounds in seconds."""

    path: str
    load: str
    profile: str
    growth: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0)
    slos: dict | None = None
    max_gpus: int = 64
    grouping: str = "auto"
    search: dict = field(default_factory=lambda: {"instances": (1, 2, 4), "max_batch_size": (1, 8, 32),
                                                  "max_queue_delay_us": (0, 2000), "preferred": ("none",)})
    max_evals: int = 40
    seed: int | None = None
    duration_s: float | None = None
    screen: str | float = "auto"
    growth_rule: str = "superpose"


def load_forecast(path: str | Path) -> Forecast:
    """Parse and check a forecast file; any problem is one :class:`InputError` line (file, field, expected)."""
    path = Path(path)
    data = read_yaml(path, "forecast")
    if not isinstance(data, dict):
        raise InputError(path, None, "expected a mapping with load, profile and growth")
    known = {"load", "profile", "growth", "growth_rule", "slos", "max_gpus", "grouping", "search", "max_evals", "seed",
             "duration_s", "screen"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(path, unknown[0], f"unknown field; expected one of {', '.join(sorted(known))}")
    here = path.parent

    def file_field(name: str) -> str:
        value = data.get(name)
        if not isinstance(value, str) or not value:
            raise InputError(path, name, "expected a file path")
        resolved = (here / value) if not Path(value).is_absolute() else Path(value)
        if not resolved.is_file():
            raise InputError(path, name, f"{value}: file not found (relative to the forecast file)")
        return str(resolved)

    profile_value = data.get("profile")
    if isinstance(profile_value, str) and profile_value.startswith("builtin:"):
        if profile_value not in adapters.BUILTIN_PROFILES:
            raise InputError(path, "profile", f"{profile_value!r}: expected a file or one of "
                                              f"{', '.join(adapters.BUILTIN_PROFILES)}")
        profile_path = profile_value
    else:
        profile_path = file_field("profile")
    growth = data.get("growth", [1, 2, 5, 10])
    if not isinstance(growth, list) or not growth or not all(
            isinstance(g, (int, float)) and not isinstance(g, bool) and g > 0 for g in growth):
        raise InputError(path, "growth", "expected a list of positive numbers, e.g. [1, 2, 5, 10]")
    slos = slos_from_mapping(data["slos"], str(path), "slos") if data.get("slos") is not None else None

    def int_field(name: str, default: int, minimum: int) -> int:
        value = data.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise InputError(path, name, f"expected an integer >= {minimum}")
        return value

    grouping = data.get("grouping", "auto")
    if grouping not in GROUPINGS:
        raise InputError(path, "grouping", f"expected one of {', '.join(GROUPINGS)}")
    growth_rule = data.get("growth_rule", "superpose")
    if growth_rule not in GROWTHS:
        raise InputError(path, "growth_rule", f"expected one of {', '.join(GROWTHS)}")
    search = dict(Forecast.__dataclass_fields__["search"].default_factory())
    given = data.get("search") or {}
    if not isinstance(given, dict):
        raise InputError(path, "search", f"expected a mapping of {', '.join(SEARCH_KEYS)} to lists")
    for key, values in given.items():
        if key not in SEARCH_KEYS:
            raise InputError(path, f"search.{key}", f"unknown knob; expected one of {', '.join(SEARCH_KEYS)}")
        kind = SEARCH_KEYS[key]
        if not isinstance(values, list) or not values or not all(isinstance(v, kind) and not isinstance(v, bool)
                                                                 for v in values):
            raise InputError(path, f"search.{key}", f"expected a non-empty list of {kind.__name__} values")
        if key == "preferred" and any(v not in PREFERRED_RULES for v in values):
            raise InputError(path, f"search.{key}", f"expected values among {', '.join(PREFERRED_RULES)}")
        if kind is int and any(v < (1 if key == "instances" else 0) for v in values):
            raise InputError(path, f"search.{key}", "expected values >= 1" if key == "instances" else
                             "expected values >= 0")
        search[key] = tuple(values)
    duration = data.get("duration_s")
    if duration is not None and (not isinstance(duration, (int, float)) or duration <= 0):
        raise InputError(path, "duration_s", "expected a positive number of seconds")
    try:
        screen_value = screen_asked(data.get("screen", "auto"))
    except ValueError:
        raise InputError(path, "screen", f"expected {SCREEN_FORM}") from None
    return Forecast(str(path), file_field("load"), profile_path, tuple(float(g) for g in growth), slos,
                    int_field("max_gpus", 64, 1), grouping, search, int_field("max_evals", 40, 1),
                    None if data.get("seed") is None else int_field("seed", 0, 0),
                    None if duration is None else float(duration), screen_value, growth_rule)
