"""The profile's load at a scale: ``Load.at(2.0)`` is twice the traffic over the same time span, grown by the load's
*growth rule* (:data:`GROWTHS`), which every capacity figure names.

Both rules keep the load's timing (a diurnal curve keeps its hours, a step its length) and are seeded.

* ``superpose`` (the default): more independent users. Scale ``s`` is the superposition of ``floor(s)`` independent
  realisations of the load plus one realisation thinned to the fraction ``s - floor(s)``. Realisation 0 is the base
  schedule itself; further ones are built from the load profile with seeds ``seed + k`` when the load came from a
  profile, and otherwise (a fixed schedule or trace) are the base shifted circularly in time by ``k`` times the
  golden ratio of its duration. Bursts of independent users overlap less than their own: a bursty load grows
  smoother (gamma gaps of cv 2 superposed 8 times have gaps of cv near 1).
* ``scale``: the same users sending more. A load from a load profile is built again (same seed) with every arrival
  rate multiplied by ``s`` (``LoadProfile.scaled``: gamma keeps its cv, steps and diurnal curves keep their times, a
  trace is compressed in time and tiled); a fixed schedule with no profile is compressed in time by ``s`` and laid end
  to end (the same schedule shifted, the last copy cut) over its duration. Burstiness stays.

For Poisson loads the two agree in distribution: superposing Poisson loads gives Poisson load of the summed rate,
thinning one gives Poisson load of the thinned rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from serving_bench.run.schedule import Schedule
from serving_bench.tune import adapters

GOLDEN = 0.6180339887498949
GROWTHS = {"superpose": "more independent users", "scale": "the same users sending more"}  # rule -> in words
SCREEN_WINDOWS = 12
SCREEN_REQUESTS = 150_000  # what an automatic screen keeps of a load ...
SCREEN_ABOVE = 4 * SCREEN_REQUESTS  # ... of more requests than this


@dataclass(eq=False)
class Load:
    """``base`` is the load at scale 1; ``build(seed, factor=1.0)`` (optional, picklable) makes another realisation
    of it, its rates multiplied by ``factor``; ``nominal_rps``: the requests per second it stands for at scale 1
    (default: its own; a screen keeps its whole load's, so capacities found on it are comparable); ``growth``: how
    :meth:`at` grows it (:data:`GROWTHS`)."""

    base: Schedule
    seed: int = 0
    build: Callable[..., Schedule] | None = None
    nominal_rps: float | None = None
    growth: str = "superpose"
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.growth not in GROWTHS:
            raise ValueError(f"growth {self.growth!r}: expected one of {', '.join(GROWTHS)}")

    def __getstate__(self):  # the cache is rebuilt where the object lands (a Ray worker)
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state

    @property
    def duration_s(self) -> float:
        return self.base.duration_s

    @property
    def offered_rps(self) -> float:
        """Requests per second the load offers at scale 1 (all models)."""
        if self.nominal_rps is not None:
            return self.nominal_rps
        return len(self.base) / max(self.duration_s, 1e-12)

    def realisation(self, k: int) -> Schedule:
        """Realisation ``k`` of the load at scale 1 (0 is the base)."""
        if k == 0:
            return self.base
        if k not in self._cache:
            if self.build is not None:
                sched = self.build(self.seed + k)
            else:
                sched = circular_shift(self.base, (k * GOLDEN) % 1.0 * self.base.duration_s)
            self._cache[k] = sched
        return self._cache[k]

    def at(self, scale: float) -> Schedule:
        """The load at ``scale`` (> 0) by the load's growth rule, deterministic for a given seed."""
        if scale <= 0:
            raise ValueError("scale must be > 0")
        key = ("at", round(float(scale), 9))
        if key in self._cache:
            return self._cache[key]
        meta = dict(self.base.meta, scale=float(scale), growth=self.growth)
        parts = [self._sped_up(scale)] if self.growth == "scale" else self._superposed(scale)
        out = merge(parts, meta=meta)
        if len(self._cache) > 64:
            self._cache.clear()
        self._cache[key] = out
        return out

    def _superposed(self, scale: float) -> list[Schedule]:
        whole, frac = int(np.floor(scale + 1e-12)), float(scale - np.floor(scale + 1e-12))
        parts = [self.realisation(k) for k in range(whole)]
        if frac > 1e-9:
            extra = self.realisation(whole)
            rng = np.random.default_rng([self.seed, whole, 7919])
            parts.append(extra.select(rng.random(len(extra)) < frac))
        return parts

    def _sped_up(self, scale: float) -> Schedule:
        if abs(scale - 1.0) < 1e-12:
            return self.base
        if self.build is not None:
            return self.build(self.seed, scale)
        return compressed(self.base, scale)


def replica_load(load: Load, seed: int) -> Load:
    """Another realisation of ``load``, as a replication of a forecast runs it (:mod:`serving_bench.sim.intervals`):
    built with ``seed`` (and its growth's further realisations with ``seed + k``) where the load came from a profile,
    else its schedule shifted circularly by a seeded fraction of its duration; the same growth rule and nominal
    rate."""
    if load.build is not None:
        base = load.build(seed)
    else:
        base = circular_shift(load.base, float(np.random.default_rng([seed, 29]).random()) * load.duration_s)
    return Load(base, seed=seed, build=load.build, nominal_rps=load.nominal_rps, growth=load.growth)


def circular_shift(schedule: Schedule, shift_s: float) -> Schedule:
    """The schedule with every arrival moved ``shift_s`` later, wrapping around its duration."""
    duration = schedule.duration_s
    if duration <= 0 or len(schedule) == 0:
        return schedule
    arrival = (schedule.arrival_s + shift_s) % duration
    order = np.argsort(arrival, kind="stable")
    return Schedule(arrival[order], schedule.model[order], schedule.models, schedule.sample[order],
                    schedule.batch[order], dict(schedule.meta))


def compressed(schedule: Schedule, factor: float) -> Schedule:
    """``schedule`` sent ``factor`` times as fast over the same duration: arrivals divided by ``factor``, the result
    laid end to end (copy ``k`` shifted by ``k * duration / factor``) and cut at the duration."""
    duration = schedule.duration_s
    if duration <= 0 or len(schedule) == 0:
        return schedule
    copies = int(np.ceil(factor - 1e-9))
    n = len(schedule)
    arrival = (np.tile(schedule.arrival_s, copies) + np.repeat(np.arange(copies) * duration, n)) / factor
    keep = arrival < duration
    index = np.tile(np.arange(n), copies)[keep]
    return Schedule(arrival[keep], schedule.model[index], schedule.models, schedule.sample[index],
                    schedule.batch[index], dict(schedule.meta))


def merge(parts: list[Schedule], meta: dict | None = None) -> Schedule:
    """The union of schedules over the same model table, sorted by arrival (stable)."""
    if not parts:
        raise ValueError("nothing to merge")
    models = parts[0].models
    index = {name: i for i, name in enumerate(models)}
    arrays = {k: [] for k in ("arrival_s", "model", "sample", "batch")}
    for part in parts:
        remap = np.array([index.setdefault(name, len(index)) for name in part.models], dtype=np.int32)
        arrays["arrival_s"].append(part.arrival_s)
        arrays["model"].append(remap[part.model] if len(part) else part.model)
        arrays["sample"].append(part.sample)
        arrays["batch"].append(part.batch)
    models = tuple(sorted(index, key=index.get))
    cat = {k: np.concatenate(v) for k, v in arrays.items()}
    order = np.argsort(cat["arrival_s"], kind="stable")
    return Schedule(cat["arrival_s"][order], cat["model"][order], models, cat["sample"][order], cat["batch"][order],
                    dict(parts[0].meta if meta is None else meta))


def only_models(schedule: Schedule, names) -> Schedule:
    """The requests for the entries in ``names``, with the model table reduced to them (in schedule order)."""
    keep = [name for name in schedule.models if name in set(names)]
    remap = np.full(len(schedule.models), -1, dtype=np.int32)
    for i, name in enumerate(schedule.models):
        if name in keep:
            remap[i] = keep.index(name)
    mask = remap[schedule.model] >= 0
    return Schedule(schedule.arrival_s[mask], remap[schedule.model[mask]], tuple(keep), schedule.sample[mask],
                    schedule.batch[mask], dict(schedule.meta))


@dataclass(frozen=True)
class _Only:
    """A picklable ``build`` restricted to some models."""

    build: Callable[[int], Schedule]
    names: tuple[str, ...]

    def __call__(self, seed: int, factor: float = 1.0) -> Schedule:
        return only_models(self.build(seed, factor), self.names)


def restrict(load: Load, names) -> Load:
    """The part of ``load`` that goes to the entries in ``names`` (same seeds, same times)."""
    names = tuple(names)
    return Load(only_models(load.base, names), seed=load.seed,
                build=_Only(load.build, names) if load.build is not None else None, growth=load.growth)


def screen_spans(duration_s: float, fraction: float, count: int = SCREEN_WINDOWS) -> tuple[tuple[float, float], ...]:
    """``count`` windows ``(start_s, end_s)`` covering ``fraction`` (0, 1] of ``[0, duration_s)``, one centred in each
    of ``count`` equal parts."""
    if not 0 < fraction <= 1:
        raise ValueError("a screen's fraction must be in (0, 1]")
    part = duration_s / count
    width = fraction * part
    return tuple(((i + 0.5) * part - width / 2, (i + 0.5) * part + width / 2) for i in range(count))


def windowed(schedule: Schedule, spans) -> Schedule:
    """The requests inside ``spans`` (``[start_s, end_s)``, in order), the spans laid end to end from time 0;
    ``meta['duration_s']`` becomes their total length."""
    times, masks, offset = [], [], 0.0
    for start, end in spans:
        mask = (schedule.arrival_s >= start) & (schedule.arrival_s < end)
        masks.append(mask)
        times.append(schedule.arrival_s[mask] - start + offset)
        offset += end - start
    keep = np.concatenate([np.flatnonzero(m) for m in masks]) if masks else np.zeros(0, dtype=np.int64)
    meta = dict(schedule.meta, duration_s=offset, screen_spans=[list(span) for span in spans])
    return Schedule(np.concatenate(times) if times else np.zeros(0), schedule.model[keep], schedule.models,
                    schedule.sample[keep], schedule.batch[keep], meta)


@dataclass(frozen=True)
class _Windowed:
    """A picklable ``build`` restricted to some windows of time."""

    build: Callable[[int], Schedule]
    spans: tuple[tuple[float, float], ...]

    def __call__(self, seed: int, factor: float = 1.0) -> Schedule:
        return windowed(self.build(seed, factor), self.spans)


SCREEN_FORM = "auto or a fraction in (0, 1]"  # what a screen may be asked as (tune --screen, a forecast's screen)


def screen_asked(value) -> str | float:
    """``value`` (``"auto"`` or a number, not a bool) as :func:`screen_fraction`'s ``asked``; ValueError
    (:data:`SCREEN_FORM`) for anything else."""
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(SCREEN_FORM)
    return float(value)


def screen_fraction(load: Load, asked: str | float = "auto") -> float:
    """The fraction of ``load``'s time a search screens on: ``asked`` in (0, 1], or ``"auto"``: 1 (no screen) up to
    ``SCREEN_ABOVE`` requests, else what keeps about ``SCREEN_REQUESTS``."""
    if asked != "auto":
        return float(asked)
    n = len(load.base)
    return 1.0 if n <= SCREEN_ABOVE else SCREEN_REQUESTS / n


def screen(load: Load, fraction: float) -> Load:
    """The screen of ``load`` covering ``fraction`` of its time (module doc); same seeds, its nominal rate."""
    spans = screen_spans(load.duration_s, fraction)
    return Load(windowed(load.base, spans), seed=load.seed,
                build=_Windowed(load.build, spans) if load.build is not None else None,
                nominal_rps=load.offered_rps, growth=load.growth)


def load_size(path: str | Path, duration_s: float | None = None,
              max_requests: int = adapters.MAX_REQUESTS) -> tuple[int, float]:
    """The requests and seconds of the load at ``path`` at scale 1, before it is built (a load profile's expected
    requests, refused above ``max_requests``; a saved schedule's own)."""
    if Path(path).suffix == ".npz":
        schedule = Schedule.load(path)
        return len(schedule), schedule.duration_s
    builder = adapters.ScheduleBuilder(str(path), duration_s, max_requests)
    return builder.size(), builder.profile().duration_s


def load_from_file(path: str | Path, seed: int | None = None, duration_s: float | None = None,
                   growth: str = "superpose", max_requests: int = adapters.MAX_REQUESTS) -> Load:
    """A :class:`Load` from a load profile (YAML; ``seed`` defaults to the profile's own) or a saved schedule
    (``.npz``), grown by ``growth`` (:data:`GROWTHS`)."""
    path = Path(path)
    if path.suffix == ".npz":
        return Load(Schedule.load(path), seed=seed or 0, growth=growth)
    build = adapters.ScheduleBuilder(str(path), duration_s, max_requests)
    if seed is None:
        seed = build.profile().seed
    return Load(build(seed), seed=seed, build=build, growth=growth)


def growth_text(growth: str) -> str:
    """``superpose: more independent users`` — how a capacity figure names its rule."""
    return f"{growth}: {GROWTHS[growth]}"
