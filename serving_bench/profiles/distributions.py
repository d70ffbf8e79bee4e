"""The building blocks of a profile: distributions of seconds (:class:`Dist`), co-location curves (:class:`Curve`) and
the cost of starting after idle time (:class:`IdleEffect`), each with its JSON parser (one :class:`InputError` line
naming the profile file and field).

A distribution is ``{"samples_s": [...]}``, ``{"quantiles": {"q": [...], "s": [...]}}`` (q from 0 to 1) or
``{"constant_s": x}``; all become one quantile function (linear between points).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, Mapping, Sequence

from serving_bench.errors import InputError


@dataclass(frozen=True)
class Dist:
    """A distribution of seconds as a quantile function: ``q`` strictly increasing from 0 to 1, ``s`` non-decreasing."""

    q: tuple[float, ...]
    s: tuple[float, ...]

    @classmethod
    def constant(cls, value: float) -> "Dist":
        return cls((0.0, 1.0), (float(value), float(value)))

    @classmethod
    def from_samples(cls, samples: Iterable[float]) -> "Dist":
        s = sorted(float(x) for x in samples)
        if len(s) == 1:
            return cls.constant(s[0])
        n = len(s)
        return cls(tuple(i / (n - 1) for i in range(n)), tuple(s))

    def quantile(self, u: float) -> float:
        """Q(u) for u in [0, 1], linear between points."""
        q, s = self.q, self.s
        i = bisect.bisect_right(q, u) - 1
        if i >= len(q) - 1:
            return s[-1]
        if i < 0:
            return s[0]
        w = (u - q[i]) / (q[i + 1] - q[i])
        return s[i] + w * (s[i + 1] - s[i])

    def grid(self, points: int) -> list[float]:
        """Q at ``points`` evenly spaced probabilities 0..1 (what the simulator samples from, linear between them; a
        new list each call, computed once per ``points``) — but for the last point, set so that the last cell keeps
        the distribution's mean over its probabilities: a single high sample (a stall) among 2,000 weighs 1/2,000 of
        the draws, not its share of the cell (with 257 points, 1/256) drawn up to it."""
        cache = self.__dict__.setdefault("_grids", {})  # a frozen value's derived data, not a field
        if points not in cache:
            values = [self.quantile(i / (points - 1)) for i in range(points)]
            top = 1.0 - 1.0 / (points - 1)
            values[-1] = max(2.0 * self.mean_between(top, 1.0) - values[-2], values[-2])
            cache[points] = tuple(values)
        return list(cache[points])

    def mean_between(self, lo: float, hi: float) -> float:
        """The mean of the distribution between probabilities ``lo < hi`` (its quantile function's average there)."""
        area, a = 0.0, lo
        for i in range(max(bisect.bisect_right(self.q, lo) - 1, 0), len(self.q) - 1):
            b = min(self.q[i + 1], hi)
            if b > a:
                area += (b - a) * (self.quantile(a) + self.quantile(b)) / 2
            if b >= hi:
                break
            a = max(a, b)
        return area / (hi - lo)

    @cached_property  # a frozen value: computed once (simulations of one profile ask it again and again)
    def mean(self) -> float:
        """Mean of the piecewise-linear quantile function (trapezoids)."""
        return sum((self.q[i + 1] - self.q[i]) * (self.s[i] + self.s[i + 1]) / 2 for i in range(len(self.q) - 1))

    @property
    def median(self) -> float:
        return self.quantile(0.5)

    def to_json(self) -> dict:
        if self.s[0] == self.s[-1]:
            return {"constant_s": self.s[0]}
        n = len(self.q)
        if n > 2 and all(abs(self.q[i] - i / (n - 1)) < 1e-12 for i in range(n)):
            return {"samples_s": list(self.s)}
        return {"quantiles": {"q": list(self.q), "s": list(self.s)}}


def parse_dist(data: Any, source: str, where: str) -> Dist:
    """A :class:`Dist` from its JSON form; bad input names ``source`` and ``where``."""
    if not isinstance(data, Mapping):
        raise InputError(source, where, "expected {\"samples_s\": [...]}, {\"quantiles\": {...}} or {\"constant_s\": x}")
    if "constant_s" in data:
        value = number(data["constant_s"], source, f"{where}.constant_s")
        return Dist.constant(value)
    if "samples_s" in data:
        samples = data["samples_s"]
        if not isinstance(samples, list) or not samples:
            raise InputError(source, f"{where}.samples_s", "expected a non-empty list of seconds")
        return Dist.from_samples(number(x, source, f"{where}.samples_s") for x in samples)
    if "quantiles" in data:
        qd = data["quantiles"]
        if not isinstance(qd, Mapping) or not isinstance(qd.get("q"), list) or not isinstance(qd.get("s"), list):
            raise InputError(source, f"{where}.quantiles", "expected {\"q\": [...], \"s\": [...]}")
        q = [number(x, source, f"{where}.quantiles.q") for x in qd["q"]]
        s = [number(x, source, f"{where}.quantiles.s") for x in qd["s"]]
        if len(q) != len(s) or len(q) < 2 or q[0] != 0.0 or q[-1] != 1.0 or any(b <= a for a, b in zip(q, q[1:])):
            raise InputError(source, f"{where}.quantiles.q", "expected strictly increasing probabilities from 0 to 1, "
                             "as many as values in s")
        if any(b < a for a, b in zip(s, s[1:])):
            raise InputError(source, f"{where}.quantiles.s", "expected non-decreasing seconds")
        return Dist(tuple(q), tuple(s))
    raise InputError(source, where, "expected one of samples_s, quantiles, constant_s")


def number(value: Any, source: str, where: str, *, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise InputError(source, where, f"expected a finite number >= {minimum:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Curve:
    """Co-location speed-up S(k): total throughput of k concurrent batches over one batch alone (S(1) = 1).

    Measured at batch size ``batch``. Between measured k it is linear; beyond the last it continues with the last
    segment's slope clamped to [0, 1] (never faster than linear, never decreasing).
    """

    batch: int
    k: tuple[float, ...]
    speedup: tuple[float, ...]

    def __call__(self, k: float) -> float:
        ks, ss = self.k, self.speedup
        if k <= ks[0]:
            return ss[0] * k / ks[0]
        i = bisect.bisect_right(ks, k) - 1
        if i >= len(ks) - 1:
            slope = (ss[-1] - ss[-2]) / (ks[-1] - ks[-2]) if len(ks) > 1 else 0.0
            return ss[-1] + min(max(slope, 0.0), 1.0) * (k - ks[-1])
        w = (k - ks[i]) / (ks[i + 1] - ks[i])
        return ss[i] + w * (ss[i + 1] - ss[i])

    @property
    def interference(self) -> float:
        """rho in [0, 1]: how much one more concurrent batch slows this one (0 = not at all, 1 = time-sliced),
        fitted at the largest measured k from S(k)/k = 1 / (1 + (k - 1) rho)."""
        k, s = self.k[-1], self.speedup[-1]
        if k <= 1:
            return 0.0
        return min(max((k / max(s, 1e-12) - 1.0) / (k - 1.0), 0.0), 1.0)

    def to_json(self) -> dict:
        return {"batch": self.batch, "k": list(self.k), "speedup": list(self.speedup)}


def parse_curve(data: Any, source: str, where: str) -> Curve:
    if not isinstance(data, Mapping):
        raise InputError(source, where, "expected {\"batch\": B, \"k\": [...], \"speedup\": [...]}")
    batch = data.get("batch", 1)
    if not isinstance(batch, int) or batch < 1:
        raise InputError(source, f"{where}.batch", "expected a batch size >= 1")
    ks, ss = data.get("k"), data.get("speedup")
    if not isinstance(ks, list) or not isinstance(ss, list) or len(ks) != len(ss) or not ks:
        raise InputError(source, where, "expected equally long non-empty lists k and speedup")
    k = [number(x, source, f"{where}.k", minimum=1.0) for x in ks]
    s = [number(x, source, f"{where}.speedup") for x in ss]
    if any(b <= a for a, b in zip(k, k[1:])):
        raise InputError(source, f"{where}.k", "expected strictly increasing instance counts")
    if any(v <= 0 for v in s):
        raise InputError(source, f"{where}.speedup", "expected positive speed-ups")
    if k[0] != 1.0:
        k, s = [1.0] + k, [1.0] + s
    return Curve(batch, tuple(k), tuple(s))


@dataclass(frozen=True)
class IdleEffect:
    """How much slower work is after idle time (a *cold* start: runtime threads parked, caches and clocks cold).

    An executed batch whose instance's *recent idle time* is ``service_idle_s[i]`` seconds takes
    ``service_extra_s[i]`` longer than back-to-back ("hot"): the exponentially weighted mean of the instance's idle
    times before its batches, the newest weighing ``service_memory`` (1: the last idle time alone, as older profiles
    have it; a model's warmth follows its recent rate, not only its last gap:
    docs/profiles.md#cold-starts-under-irregular-arrivals). A request that reaches the server
    ``overhead_gap_s[i]`` seconds after the previous request (any model) has an overhead ``overhead_extra_s[i]``
    longer than the hot one, and its dispatch inside the server ``dispatch_extra_s[i]`` longer (empty: 0). Those two
    are medians; ``overhead_extra_p90_s`` / ``dispatch_extra_p90_s`` (empty: none measured) are the same extras at
    the 90th percentile — a cold way's tail grows more than its middle — and a draw at probability ``u`` takes the
    median extra up to ``u = 0.5``, the p90 one from 0.9, linear between (``sim.workload.cold_extra``). All linear
    between points; the first and last values hold outside."""

    service_idle_s: tuple[float, ...]
    service_extra_s: tuple[float, ...]
    overhead_gap_s: tuple[float, ...]
    overhead_extra_s: tuple[float, ...]
    dispatch_extra_s: tuple[float, ...] = ()
    overhead_extra_p90_s: tuple[float, ...] = ()
    dispatch_extra_p90_s: tuple[float, ...] = ()
    service_memory: float = 1.0

    def service_extra(self, idle: float) -> float:
        return interp(idle, self.service_idle_s, self.service_extra_s)

    def overhead_extra(self, gap: float) -> float:
        return interp(gap, self.overhead_gap_s, self.overhead_extra_s)

    def to_json(self) -> dict:
        out = {"service": {"idle_s": list(self.service_idle_s), "extra_s": list(self.service_extra_s)},
               "overhead": {"gap_s": list(self.overhead_gap_s), "extra_s": list(self.overhead_extra_s)}}
        if self.service_memory != 1.0:
            out["service"]["memory"] = self.service_memory
        if self.dispatch_extra_s:
            out["overhead"]["dispatch_extra_s"] = list(self.dispatch_extra_s)
        for key in ("overhead_extra_p90_s", "dispatch_extra_p90_s"):
            if getattr(self, key):
                out["overhead"][key] = list(getattr(self, key))
        return out


@dataclass(frozen=True)
class EnsembleExtra:
    """What an ensemble's request takes beyond the path of its members' steps (their ways, executions and cold
    starts as the profile has them): Triton's ensemble scheduler hands each step's request to its member and the
    outputs on, waking threads that slept. A request sent ``gap_s[i]`` seconds after the previous request (any model)
    takes ``extra_s[i]`` longer at the median and ``extra_p90_s[i]`` at the 90th percentile, drawn as a way's
    cold-start extra (``sim.workload.cold_extra``: the median extra up to probability 0.5, the p90 one from 0.9,
    linear between; linear between points, the first and last values hold outside). Measured alone on the server
    at random quiet times, against the simulator (:func:`serving_bench.calibrate.cold.ensemble_extra`)."""

    gap_s: tuple[float, ...]
    extra_s: tuple[float, ...]
    extra_p90_s: tuple[float, ...]

    def to_json(self) -> dict:
        return {"gap_s": list(self.gap_s), "extra_s": list(self.extra_s), "extra_p90_s": list(self.extra_p90_s)}


def parse_ensemble_extra(data: Any, source: str, where: str) -> EnsembleExtra:
    if not isinstance(data, Mapping):
        raise InputError(source, where, "expected {\"gap_s\": [...], \"extra_s\": [...], \"extra_p90_s\": [...]}")
    lists = [data.get(key) for key in ("gap_s", "extra_s", "extra_p90_s")]
    if not all(isinstance(v, list) and v for v in lists) or len({len(v) for v in lists}) != 1:
        raise InputError(source, where, "expected equally long non-empty lists gap_s, extra_s and extra_p90_s")
    gaps, medians, p90s = (tuple(number(v, source, f"{where}.{key}") for v in values)
                           for key, values in zip(("gap_s", "extra_s", "extra_p90_s"), lists))
    if any(b <= a for a, b in zip(gaps, gaps[1:])):
        raise InputError(source, f"{where}.gap_s", "expected strictly increasing seconds")
    if any(p < m for m, p in zip(medians, p90s)):
        raise InputError(source, f"{where}.extra_p90_s", "expected each at least the median extra_s beside it")
    return EnsembleExtra(gaps, medians, p90s)


def recent_means(values: Sequence[float], memory: float) -> list[float]:
    """The exponentially weighted running mean of ``values`` in order, the newest weighing ``memory`` (1: each value
    itself): what a profile calls a *recent* idle or quiet time. A value that is not finite (nothing before it) is
    kept as it is until a finite one starts the mean."""
    out, mean = [], math.inf
    for value in values:
        mean = value if memory >= 1.0 or not math.isfinite(mean) else mean + memory * (value - mean)
        out.append(mean)
    return out


def interp(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x) - 1
    return ys[i] + (x - xs[i]) / (xs[i + 1] - xs[i]) * (ys[i + 1] - ys[i])


def parse_idle(data: Any, source: str, where: str) -> IdleEffect:
    if not isinstance(data, Mapping):
        raise InputError(source, where, "expected {\"service\": {\"idle_s\": [...], \"extra_s\": [...]}, "
                         "\"overhead\": {\"gap_s\": [...], \"extra_s\": [...]}}")
    parts = []
    for part, axis in (("service", "idle_s"), ("overhead", "gap_s")):
        d = data.get(part)
        if not isinstance(d, Mapping):
            raise InputError(source, f"{where}.{part}", f"expected {{\"{axis}\": [...], \"extra_s\": [...]}}")
        xs, ys = d.get(axis), d.get("extra_s")
        if not isinstance(xs, list) or not isinstance(ys, list) or not xs or len(xs) != len(ys):
            raise InputError(source, f"{where}.{part}", f"expected equally long non-empty lists {axis} and extra_s")
        xs = tuple(number(v, source, f"{where}.{part}.{axis}") for v in xs)
        ys = tuple(number(v, source, f"{where}.{part}.extra_s") for v in ys)
        if any(b <= a for a, b in zip(xs, xs[1:])):
            raise InputError(source, f"{where}.{part}.{axis}", "expected strictly increasing seconds")
        parts += [xs, ys]
    extras = {}
    for key in ("dispatch_extra_s", "overhead_extra_p90_s", "dispatch_extra_p90_s"):
        values = (data.get("overhead") or {}).get(key)
        if values is None:
            continue
        if not isinstance(values, list) or len(values) != len(parts[2]):
            raise InputError(source, f"{where}.overhead.{key}", "expected a list as long as gap_s")
        extras[key] = tuple(number(v, source, f"{where}.overhead.{key}") for v in values)
    memory = data["service"].get("memory", 1.0)
    if isinstance(memory, bool) or not isinstance(memory, (int, float)) or not 0.0 < memory <= 1.0:
        raise InputError(source, f"{where}.service.memory", "expected a number in (0, 1]: the newest idle time's "
                         "weight in the instance's recent idle time")
    return IdleEffect(*parts, **extras, service_memory=float(memory))
