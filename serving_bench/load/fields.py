"""Validation of values read from load profiles and traces: each failure is one :class:`InputError` line
``file: field: expected ...``.

Durations accept a number of seconds or a string with a unit (``"20ms"``, ``"1.5s"``, ``"250us"``, ``"2min"``,
``"1h"``); rates are requests per second (a number, or ``"50/s"``, ``"3000/min"``). Inside the program every time is
seconds as float.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from serving_bench.errors import InputError
from serving_bench.units import SECONDS_PER
_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zµ]*)\s*")
_RATE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?:/\s*(s|sec|min|h))?\s*")


@dataclass(frozen=True)
class Where:
    """Where a value came from: the file (or option) and the dotted field path inside it."""

    source: str | None
    field: str | None = None

    def child(self, name: str | int) -> "Where":
        name = f"[{name}]" if isinstance(name, int) else str(name)
        if self.field is None:
            return Where(self.source, name.lstrip("."))
        return Where(self.source, f"{self.field}{name}" if name.startswith("[") else f"{self.field}.{name}")

    def error(self, expected: str) -> InputError:
        return InputError(self.source, self.field, expected)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def seconds(value: Any, where: Where, *, allow_zero: bool = True) -> float:
    """A duration in seconds: a number (seconds) or a string with a unit (us, ms, s, min, h)."""
    number = _number(value)
    if number is None and isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match and match.group(2) in SECONDS_PER or (match and match.group(2) == ""):
            number = float(match.group(1)) * SECONDS_PER[match.group(2) or "s"]
    if number is None or not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise where.error(f"expected a duration {bound} such as 20ms, 1.5s or 2min (a bare number is seconds), "
                          f"got {value!r}")
    return number


def rate(value: Any, where: Where, *, allow_zero: bool = False) -> float:
    """A rate in requests per second: a number or ``"N/s"``, ``"N/min"``, ``"N/h"``."""
    number = _number(value)
    if number is None and isinstance(value, str):
        match = _RATE.fullmatch(value)
        if match:
            number = float(match.group(1)) / SECONDS_PER[match.group(2) or "s"]
    if number is None or not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise where.error(f"expected a rate {bound} in requests per second (a number, or like 50/s, 3000/min), "
                          f"got {value!r}")
    return number


def number(value: Any, where: Where, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, what: str = "a number") -> float:
    """A finite number within ``[low, high]`` (``low`` excluded when ``low_open``)."""
    x = _number(value)
    ok = x is not None and math.isfinite(x)
    if ok and low is not None:
        ok = x > low if low_open else x >= low
    if ok and high is not None:
        ok = x <= high
    if not ok:
        bounds = []
        if low is not None:
            bounds.append(f"{'>' if low_open else '>='} {low:g}")
        if high is not None:
            bounds.append(f"<= {high:g}")
        raise where.error(f"expected {what}{' ' + ' and '.join(bounds) if bounds else ''}, got {value!r}")
    return x


def integer(value: Any, where: Where, *, low: int | None = None, what: str = "an integer") -> int:
    """An integer (``low`` inclusive)."""
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())) \
            or (low is not None and value < low):
        raise where.error(f"expected {what}{f' >= {low}' if low is not None else ''}, got {value!r}")
    return int(value)


def mapping(value: Any, where: Where, *, what: str = "a mapping") -> Mapping:
    if not isinstance(value, Mapping):
        raise where.error(f"expected {what}, got {type(value).__name__} {value!r}")
    return value


def sequence(value: Any, where: Where, *, what: str = "a list", min_len: int = 0) -> Sequence:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) < min_len:
        raise where.error(f"expected {what}{f' with at least {min_len} items' if min_len else ''}, got {value!r}")
    return value


def choice(value: Any, where: Where, options: Sequence[str]) -> str:
    if value not in options:
        raise where.error(f"expected one of {', '.join(options)}, got {value!r}")
    return value


def no_unknown(data: Mapping, where: Where, known: Sequence[str]) -> None:
    """Reject keys outside ``known`` (a typo should not silently fall back to a default)."""
    for key in data:
        if key not in known:
            raise where.child(str(key)).error(f"unknown field; expected one of {', '.join(known)}")
