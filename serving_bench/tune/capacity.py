"""Capacity by bisection on a ladder of load scales, for any target: the simulator (tune's objective) or real Triton.

A :class:`Ladder` is the scales ``2 ** (i / steps_per_doubling)`` from the rung at or below ``min_scale`` to the rung
at or above ``max_scale``; rung 0 is the load as given (scale 1, always on it). :func:`bisect_capacity` asks
``probe(scale, attempt)`` whether the SLOs hold at a rung (a :class:`Probe`): rung 0 first; when it holds, the top
rung (met there: the capacity is *capped*, at least the top); when it does not, the bottom rung; then bisection
between the highest rung that met and the lowest that failed, until they are neighbours. The capacity is the highest
rung that met (0 when none at or above ``min_scale`` did), so it is known to one rung (``2 ** (1 /
steps_per_doubling) - 1``, 9 % at 8 steps) — as far as each probe's verdict is right.

The two ends of the bracket are the *decisive* steps. With :class:`Repeats` ``count`` > 1 each decisive step is
judged again until it has ``count`` probes, and its verdict is the ``rule`` over them (``majority``: more than half
met; ``all``: every one met). A verdict that changes moves the bracket and the bisection goes on from the rungs known
so far; every rung is repeated at most once to ``count``, so it ends. With ``count`` 1 (the default) each rung is
probed once and the search is the plain bisection.

Inside the final bracket :func:`interpolate` places the capacity where the worst ``value / bound`` crosses 1,
linearly in ``log(violation)`` over ``log(scale)`` between the two decisive steps (the median of each step's
probes), so that two targets bisected on one ladder are compared finer than a rung; each repeat pair of probes gives
that crossing again (their range: the repeats' spread in capacity). Where the repeats disagree so that the medians
do not cross inside the bracket, the capacity is the bracket's geometric middle; the repeat pairs' crossings still
take the medians' slope where it rises.

A probe for real Triton replays the same seeded schedule for the same scale each attempt (``attempt`` counts from 0
per rung, to name its results folder); the load at a scale comes from :meth:`serving_bench.tune.load.Load.at`, whose
growth rule (superpose or scale) is the load's, so both targets grow it alike.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Mapping

RULES = ("majority", "all")


@dataclass(frozen=True)
class Ladder:
    """Load scales ``2 ** (i / steps_per_doubling)`` for rungs ``i_min .. i_max`` (see the module doc)."""

    min_scale: float = 1.0
    max_scale: float = 16.0
    steps_per_doubling: int = 8

    def __post_init__(self):
        if not (self.min_scale > 0 and self.max_scale > 0) or self.steps_per_doubling < 1:
            raise ValueError("a ladder needs scales > 0 and steps_per_doubling >= 1")

    def scale(self, rung: int) -> float:
        """The load scale of ``rung`` (rung 0: scale 1)."""
        return 2 ** (rung / self.steps_per_doubling)

    @property
    def i_min(self) -> int:
        """The lowest rung: at or below ``min_scale``."""
        return int(math.floor(math.log2(self.min_scale) * self.steps_per_doubling + 1e-9))

    @property
    def i_max(self) -> int:
        """The highest rung: at or above ``max_scale``."""
        return int(math.ceil(math.log2(self.max_scale) * self.steps_per_doubling - 1e-9))

    def rung(self, scale: float) -> int:
        """The rung at or below ``scale`` (> 0)."""
        return int(math.floor(math.log2(scale) * self.steps_per_doubling + 1e-9))

    def above(self, scale: float) -> float:
        """The scale one rung above the rung at or below ``scale``."""
        return self.scale(self.rung(scale) + 1)


@dataclass(frozen=True)
class Probe:
    """One judgment of one scale: ``ok`` (every SLO met), ``violation`` (the worst ``value / bound``; above 1 when an
    SLO was missed) and ``detail`` (JSON-able figures of that run, e.g. per-model p99)."""

    scale: float
    ok: bool
    violation: float
    detail: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class Repeats:
    """How often a decisive step is judged (``count`` probes in all) and how its probes combine (:data:`RULES`)."""

    count: int = 1
    rule: str = "majority"

    def __post_init__(self):
        if self.count < 1 or self.rule not in RULES:
            raise ValueError(f"repeats need count >= 1 and a rule among {', '.join(RULES)}")

    def verdict(self, probes) -> bool:
        met = sum(1 for p in probes if p.ok)
        return met == len(probes) if self.rule == "all" else 2 * met > len(probes)


@dataclass(frozen=True)
class Step:
    """Every probe of one rung, in the order run, and its verdict (the repeats' rule when ``repeated``)."""

    rung: int
    scale: float
    probes: tuple[Probe, ...]
    ok: bool
    repeated: bool = False

    @property
    def violation_range(self) -> tuple[float, float]:
        """The smallest and largest ``violation`` over the step's probes (the repeats' spread)."""
        values = [p.violation for p in self.probes]
        return min(values), max(values)


@dataclass(frozen=True)
class Bisection:
    """What :func:`bisect_capacity` found. ``capacity_scale``: the highest rung that met below the lowest that
    failed (0 when none met); ``capped``: the top rung met (the capacity is at least it); ``met`` / ``failed``: the
    bracket's steps (None where the ladder ends); ``steps``: every rung probed, by scale; ``probes``: every probe in
    the order run."""

    ladder: Ladder
    repeats: Repeats
    capacity_scale: float
    capped: bool
    met: Step | None
    failed: Step | None
    steps: tuple[Step, ...]
    probes: tuple[Probe, ...]

    @property
    def decisive(self) -> tuple[Step, ...]:
        """The steps that fix the bracket: ``met`` and ``failed``, where they exist."""
        return tuple(s for s in (self.met, self.failed) if s is not None)

    def step(self, rung: int) -> Step | None:
        return next((s for s in self.steps if s.rung == rung), None)


ProbeFn = Callable[[float, int], Probe]  # probe(scale, attempt) -> Probe; attempt counts from 0 per rung


def bisect_capacity(probe: ProbeFn, ladder: Ladder = Ladder(), repeats: Repeats = Repeats()) -> Bisection:
    """The capacity of whatever ``probe`` judges, on ``ladder`` (see the module doc)."""
    judged: dict[int, list[Probe]] = {}
    order: list[Probe] = []
    repeated: set[int] = set()
    top, bottom = max(ladder.i_max, 0), min(ladder.i_min, 0)  # rung 0 is always probed

    def run(rung: int) -> None:
        result = probe(ladder.scale(rung), len(judged.setdefault(rung, [])))
        judged[rung].append(result)
        order.append(result)

    def verdict(rung: int) -> bool:
        return repeats.verdict(judged[rung]) if rung in repeated else judged[rung][0].ok

    def bracket() -> tuple[int, int]:
        """(highest rung that met below ``hi``, else ``bottom - 1``; lowest rung that failed, else ``top + 1``):
        every rung between them is unprobed."""
        hi = min((r for r in judged if not verdict(r)), default=top + 1)
        return max((r for r in judged if r < hi and verdict(r)), default=bottom - 1), hi

    run(0)
    if (top if verdict(0) else bottom) != 0:
        run(top if verdict(0) else bottom)
    while True:
        lo, hi = bracket()
        if hi - lo > 1:
            run((lo + hi) // 2)
            continue
        todo = [r for r in (lo, hi) if r in judged and r not in repeated] if repeats.count > 1 else []
        if not todo:
            break
        for rung in todo:
            repeated.add(rung)
            while len(judged[rung]) < repeats.count:
                run(rung)
    steps = {r: Step(r, ladder.scale(r), tuple(judged[r]), verdict(r), r in repeated) for r in sorted(judged)}
    return Bisection(ladder, repeats, ladder.scale(lo) if lo >= ladder.i_min else 0.0, hi > top, steps.get(lo),
                     steps.get(hi), tuple(steps.values()), tuple(order))


INTERPOLATION = ("interpolated", "midpoint", "rung")  # how an :class:`Interpolated` was found


@dataclass(frozen=True)
class Interpolated:
    """A bisection's capacity inside its final bracket (:func:`interpolate`): ``scale``; ``repeats``: the crossing
    from each repeat pair of the decisive steps' probes (empty when they were probed once); ``how`` (one of
    :data:`INTERPOLATION`): ``interpolated``, ``midpoint`` (the medians' violations give no crossing inside the
    bracket: its geometric middle; ``repeats`` still from the medians' slope where it rises) or ``rung`` (no bracket:
    the capacity is capped or 0, taken as the bisection found it)."""

    scale: float
    repeats: tuple[float, ...] = ()
    how: str = "interpolated"

    @property
    def spread(self) -> float | None:
        """The repeats' range over ``scale`` (``(max - min) / scale``); None without repeats or a capacity."""
        if len(self.repeats) < 2 or self.scale <= 0:
            return None
        return (max(self.repeats) - min(self.repeats)) / self.scale


def _log_violations(step: Step) -> list[float] | None:
    """``log(violation)`` of each of the step's probes; None where one is not a finite positive number."""
    values = [p.violation for p in step.probes]
    if not all(math.isfinite(v) and v > 0 for v in values):
        return None
    return [math.log(v) for v in values]


def zero_of_line(x_lo: float, x_hi: float, y_lo: float, y_hi: float) -> float:
    """Where the line through ``(x_lo, y_lo)`` and ``(x_hi, y_hi)`` (``y_lo != y_hi``) crosses ``y = 0``."""
    return x_lo - y_lo * (x_hi - x_lo) / (y_hi - y_lo)


def interpolate(found: Bisection) -> Interpolated:
    """Where ``log(violation)`` crosses 0 on the line through the decisive steps' medians, in ``log(scale)`` (module
    doc). Each repeat pair ``i`` (probe ``i`` of the met step and of the failed one) crosses the line of the same slope
    through its own two points; those crossings are kept within one bracket's width outside it. Where the medians' line
    does not cross inside the bracket (the repeats disagree) the capacity is its geometric middle (``midpoint``) and
    the pairs still take that line's slope where it rises (none where it does not)."""
    if found.met is None or found.failed is None:
        return Interpolated(found.capacity_scale, (), "rung")
    x_lo, x_hi = math.log(found.met.scale), math.log(found.failed.scale)
    y_lo, y_hi = _log_violations(found.met), _log_violations(found.failed)
    middle = (x_lo + x_hi) / 2
    if y_lo is None or y_hi is None:
        return Interpolated(math.exp(middle), (), "midpoint")
    width = x_hi - x_lo
    slope = (statistics.median(y_hi) - statistics.median(y_lo)) / width
    if statistics.median(y_lo) <= 0 < statistics.median(y_hi):
        crossing, how = zero_of_line(x_lo, x_hi, statistics.median(y_lo), statistics.median(y_hi)), "interpolated"
    else:
        crossing, how, slope = middle, "midpoint", slope if slope > 0 else None
    pairs = list(zip(y_lo, y_hi)) if min(len(y_lo), len(y_hi)) > 1 and slope is not None else []
    repeats = tuple(math.exp(min(max(middle - (a + b) / (2 * slope), x_lo - width), x_hi + width))
                    for a, b in pairs)
    return Interpolated(math.exp(crossing), repeats, how)
