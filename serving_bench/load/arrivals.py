"""Arrival processes: when requests arrive, generated up front, vectorised, from a seed.

A registry keyed by name (``ARRIVALS``), each entry a small frozen dataclass config with

* ``from_mapping(data, where)`` — build from a load-profile mapping, raising one-line :class:`InputError` s;
* ``times(duration_s, rng) -> np.ndarray`` — sorted float64 arrival times in seconds, all in ``[0, duration_s)``;
* ``expected_rate(duration_s)`` — the expected number of arrivals per second over ``[0, duration_s)``;
* ``scaled(factor)`` — the same process with every rate multiplied by ``factor`` > 0 (the same users sending
  ``factor`` times as much): a renewal process keeps the shape of its gaps (gamma its ``cv``), a process whose rate
  changes over time keeps its timing (steps, ramp, the day's curve, the hidden chain's switching) with every rate
  multiplied; a trace is compressed in time and tiled (:meth:`serving_bench.load.traces.Trace.scaled`).
* ``requests_bound(duration_s)`` — how many times it will hold in memory while generating them (the expected count;
  a thinned process's candidates at its peak rate), known before any is drawn.

Every process takes its randomness from the ``numpy.random.Generator`` it is handed, so the same seed gives the same
times. Non-homogeneous processes (``step``, ``ramp``, ``diurnal``, ``mmpp``) are Poisson processes whose rate changes
over time: piecewise-constant rates are drawn exactly (Poisson count per piece, uniform times inside it); smooth ones
(ramp, sinusoid) by thinning a homogeneous process at the peak rate. ``trace`` replays recorded arrivals
(see :mod:`serving_bench.load.traces`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Mapping

import numpy as np

from serving_bench.load import fields as fv
from serving_bench.load.fields import Where

ARRIVALS: dict[str, type["ArrivalProcess"]] = {}


def register(cls: type["ArrivalProcess"]) -> type["ArrivalProcess"]:
    ARRIVALS[cls.name] = cls
    return cls


class ArrivalProcess:
    """Base of the configs. Subclasses are frozen dataclasses with a ``name`` and the three methods above."""

    name: ClassVar[str] = ""
    # field name -> how to read it from a profile: "rate", "duration", "positive", "fraction", "rates", "matrix", ...
    kinds: ClassVar[Mapping[str, str]] = {}
    required: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_mapping(cls, data: Mapping, where: Where) -> "ArrivalProcess":
        known = [f.name for f in fields(cls)]
        fv.no_unknown(data, where, ["process", *known])
        for name in cls.required:
            if name not in data:
                raise where.child(name).error(f"missing; the {cls.name} process needs {', '.join(cls.required)}")
        kwargs = {name: _read(cls.kinds.get(name, "number"), value, where.child(name))
                  for name, value in data.items() if name != "process"}
        config = cls(**kwargs)
        config.check(where)
        return config

    def check(self, where: Where) -> None:
        """Cross-field validation (raise ``where.child(field).error(...)``)."""

    def times(self, duration_s: float, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def expected_rate(self, duration_s: float) -> float:
        raise NotImplementedError

    def scaled(self, factor: float) -> "ArrivalProcess":
        raise NotImplementedError(f"the {self.name or type(self).__name__} process has no rate to scale")

    def requests_bound(self, duration_s: float) -> float:
        """The times it holds while generating ``duration_s`` seconds of arrivals (expected; bounds a schedule's
        size before it is built)."""
        return self.expected_rate(duration_s) * duration_s

    def describe(self) -> dict:
        """JSON-able description (for the schedule's meta)."""
        return {"process": self.name, **{f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}}


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def _read(kind: str, value: Any, where: Where) -> Any:
    if kind == "rate":
        return fv.rate(value, where)
    if kind == "rate0":
        return fv.rate(value, where, allow_zero=True)
    if kind == "duration":
        return fv.seconds(value, where, allow_zero=False)
    if kind == "duration0":
        return fv.seconds(value, where)
    if kind == "positive":
        return fv.number(value, where, low=0, low_open=True, what="a number")
    if kind == "fraction":
        return fv.number(value, where, low=0, high=1, what="a fraction")
    if kind == "rates":
        items = fv.sequence(value, where, what="a list of rates (req/s)", min_len=1)
        return tuple(fv.rate(v, where.child(i), allow_zero=True) for i, v in enumerate(items))
    if kind == "matrix":
        rows = fv.sequence(value, where, what="a square matrix (list of rows) of switching rates per second",
                           min_len=1)
        return tuple(tuple(fv.number(v, where.child(i).child(j), low=0, what="a switching rate per second")
                           for j, v in enumerate(fv.sequence(row, where.child(i), what="a row of switching rates")))
                     for i, row in enumerate(rows))
    if kind == "initial":
        if value == "stationary":
            return value
        return fv.integer(value, where, low=0, what="'stationary' or a state index")
    if kind == "text":
        if not isinstance(value, str) or not value:
            raise where.error(f"expected a non-empty string, got {value!r}")
        return value
    return fv.number(value, where)


def arrival_from_mapping(data: Any, where: Where) -> ArrivalProcess:
    """The process named by ``data['process']`` built from the rest of ``data``."""
    data = fv.mapping(data, where, what=f"a mapping with 'process: <{'|'.join(ARRIVALS)}>'")
    if "process" not in data:
        raise where.child("process").error(f"missing; expected one of {', '.join(ARRIVALS)}")
    name = fv.choice(data["process"], where.child("process"), list(ARRIVALS))
    return ARRIVALS[name].from_mapping(data, where)


# -- building blocks -------------------------------------------------------------------------------------------------

def poisson_times(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Homogeneous Poisson arrivals on ``[0, duration_s)``: a Poisson count, then sorted uniform times (exact)."""
    n = rng.poisson(rate * duration_s)
    return np.sort(rng.random(n) * duration_s)


def piecewise_poisson_times(edges: np.ndarray, rates: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals whose rate is ``rates[i]`` on ``[edges[i], edges[i+1])`` (exact, vectorised)."""
    lengths = np.diff(edges)
    counts = rng.poisson(np.maximum(rates, 0.0) * lengths)
    starts = np.repeat(edges[:-1], counts)
    return np.sort(starts + rng.random(int(counts.sum())) * np.repeat(lengths, counts))


def thinned_times(rate_fn, peak_rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals with time-varying rate ``rate_fn(t) <= peak_rate`` by thinning (Lewis and Shedler)."""
    candidates = poisson_times(peak_rate, duration_s, rng)
    keep = rng.random(len(candidates)) * peak_rate < rate_fn(candidates)
    return candidates[keep]


def renewal_times(draw, mean_gap_s: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrivals whose gaps are i.i.d. ``draw(rng, n)``, first arrival after one gap, cut at ``duration_s``."""
    expected = duration_s / mean_gap_s
    chunks: list[np.ndarray] = []
    last = 0.0
    while last < duration_s:
        n = int(expected * 1.1 + 10 * math.sqrt(expected + 1) + 100)
        t = last + np.cumsum(draw(rng, n))
        chunks.append(t)
        last = float(t[-1])
    times = np.concatenate(chunks) if chunks else np.empty(0)
    return times[times < duration_s]


# -- the processes ---------------------------------------------------------------------------------------------------

@register
@dataclass(frozen=True)
class Constant(ArrivalProcess):
    """Evenly spaced arrivals ``phase_s + k / rate`` (a perfectly regular client)."""

    name: ClassVar[str] = "constant"
    kinds: ClassVar[Mapping[str, str]] = {"rate": "rate", "phase_s": "duration0"}
    required: ClassVar[tuple[str, ...]] = ("rate",)
    rate: float = 1.0
    phase_s: float = 0.0

    def times(self, duration_s, rng):
        return np.arange(self.phase_s, duration_s, 1.0 / self.rate, dtype=np.float64)

    def expected_rate(self, duration_s):
        return self.rate

    def scaled(self, factor):
        return replace(self, rate=self.rate * factor, phase_s=self.phase_s / factor)


@register
@dataclass(frozen=True)
class Poisson(ArrivalProcess):
    """Memoryless arrivals at ``rate`` per second (exponential gaps, CV 1): many independent users."""

    name: ClassVar[str] = "poisson"
    kinds: ClassVar[Mapping[str, str]] = {"rate": "rate"}
    required: ClassVar[tuple[str, ...]] = ("rate",)
    rate: float = 1.0

    def times(self, duration_s, rng):
        return poisson_times(self.rate, duration_s, rng)

    def expected_rate(self, duration_s):
        return self.rate

    def scaled(self, factor):
        return replace(self, rate=self.rate * factor)


@register
@dataclass(frozen=True)
class Gamma(ArrivalProcess):
    """A renewal process with gamma gaps of mean ``1/rate`` and coefficient of variation ``cv``.

    ``cv`` > 1 gives bursts (shape ``1/cv**2`` < 1), ``cv`` = 1 is Poisson, ``cv`` < 1 is more regular than Poisson.
    """

    name: ClassVar[str] = "gamma"
    kinds: ClassVar[Mapping[str, str]] = {"rate": "rate", "cv": "positive"}
    required: ClassVar[tuple[str, ...]] = ("rate", "cv")
    rate: float = 1.0
    cv: float = 1.0

    def times(self, duration_s, rng):
        shape = 1.0 / self.cv ** 2
        scale = 1.0 / (self.rate * shape)
        return renewal_times(lambda g, n: g.gamma(shape, scale, n), 1.0 / self.rate, duration_s, rng)

    def expected_rate(self, duration_s):
        return self.rate

    def scaled(self, factor):
        return replace(self, rate=self.rate * factor)


@register
@dataclass(frozen=True)
class Mmpp(ArrivalProcess):
    """Markov-modulated Poisson process: a hidden state ``i`` switches to ``j`` at rate ``switching[i][j]`` per
    second; while in state ``i`` requests arrive as Poisson at ``rates[i]``. ``initial`` is a state index or
    ``stationary`` (drawn from the chain's stationary distribution)."""

    name: ClassVar[str] = "mmpp"
    kinds: ClassVar[Mapping[str, str]] = {"rates": "rates", "switching": "matrix", "initial": "initial"}
    required: ClassVar[tuple[str, ...]] = ("rates", "switching")
    rates: tuple[float, ...] = (1.0,)
    switching: tuple[tuple[float, ...], ...] = ((0.0,),)
    initial: Any = "stationary"

    def check(self, where):
        k = len(self.rates)
        if len(self.switching) != k or any(len(row) != k for row in self.switching):
            raise where.child("switching").error(f"expected a {k}x{k} matrix (one row and column per state in rates)")
        if k > 1 and any(sum(row) - row[i] <= 0 for i, row in enumerate(self.switching)):
            raise where.child("switching").error("expected every state to have a positive rate of leaving it")
        if self.initial != "stationary" and self.initial >= k:
            raise where.child("initial").error(f"expected a state index below {k} or 'stationary'")

    def generator(self) -> np.ndarray:
        q = np.array(self.switching, dtype=np.float64)
        np.fill_diagonal(q, 0.0)
        np.fill_diagonal(q, -q.sum(axis=1))
        return q

    def stationary(self) -> np.ndarray:
        """Long-run fraction of time in each state (solves ``pi Q = 0``, ``sum(pi) = 1``)."""
        q = self.generator()
        k = len(q)
        a = np.vstack([q.T, np.ones(k)])
        b = np.zeros(k + 1)
        b[-1] = 1.0
        return np.linalg.lstsq(a, b, rcond=None)[0]

    def path(self, duration_s: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The hidden state path: ``edges`` (sojourn boundaries, from 0 to ``duration_s``) and ``states``."""
        q = self.generator()
        k = len(q)
        leave = -np.diag(q)
        state = int(rng.choice(k, p=self.stationary())) if self.initial == "stationary" else int(self.initial)
        edges, states, t = [0.0], [], 0.0
        while t < duration_s:
            states.append(state)
            if k == 1 or leave[state] <= 0:
                t = duration_s
            else:
                t = min(t + rng.exponential(1.0 / leave[state]), duration_s)
                probs = np.where(np.arange(k) == state, 0.0, q[state]) / leave[state]
                state = int(rng.choice(k, p=probs))
            edges.append(t)
        return np.array(edges), np.array(states, dtype=np.int64)

    def times(self, duration_s, rng):
        edges, states = self.path(duration_s, rng)
        return piecewise_poisson_times(edges, np.asarray(self.rates)[states], rng)

    def expected_rate(self, duration_s):
        return float(np.dot(self.stationary(), self.rates))

    def scaled(self, factor):
        return replace(self, rates=tuple(r * factor for r in self.rates))


@register
@dataclass(frozen=True)
class Step(ArrivalProcess):
    """Poisson arrivals whose rate steps through ``rates``, each held for ``step_s`` (the last one holds to the end)."""

    name: ClassVar[str] = "step"
    kinds: ClassVar[Mapping[str, str]] = {"rates": "rates", "step_s": "duration"}
    required: ClassVar[tuple[str, ...]] = ("rates", "step_s")
    rates: tuple[float, ...] = (1.0,)
    step_s: float = 1.0

    def _pieces(self, duration_s):
        edges = np.minimum(np.arange(len(self.rates) + 1, dtype=np.float64) * self.step_s, duration_s)
        edges[-1] = duration_s
        return edges, np.asarray(self.rates, dtype=np.float64)

    def times(self, duration_s, rng):
        return piecewise_poisson_times(*self._pieces(duration_s), rng)

    def expected_rate(self, duration_s):
        edges, rates = self._pieces(duration_s)
        return float(np.dot(np.diff(edges), rates) / duration_s)

    def scaled(self, factor):
        return replace(self, rates=tuple(r * factor for r in self.rates))


@register
@dataclass(frozen=True)
class Ramp(ArrivalProcess):
    """Poisson arrivals whose rate goes linearly from ``start_rate`` to ``end_rate`` over ``ramp_s`` (default: the
    whole run), then holds."""

    name: ClassVar[str] = "ramp"
    kinds: ClassVar[Mapping[str, str]] = {"start_rate": "rate0", "end_rate": "rate0", "ramp_s": "duration"}
    required: ClassVar[tuple[str, ...]] = ("start_rate", "end_rate")
    start_rate: float = 0.0
    end_rate: float = 1.0
    ramp_s: float | None = None

    def rate_at(self, t: np.ndarray, duration_s: float) -> np.ndarray:
        length = self.ramp_s or duration_s
        return self.start_rate + (self.end_rate - self.start_rate) * np.clip(t / length, 0.0, 1.0)

    def times(self, duration_s, rng):
        peak = max(self.start_rate, self.end_rate)
        return thinned_times(lambda t: self.rate_at(t, duration_s), peak, duration_s, rng) if peak > 0 else np.empty(0)

    def expected_rate(self, duration_s):
        grid = np.linspace(0.0, duration_s, 10001)
        return float(np.trapz(self.rate_at(grid, duration_s), grid) / duration_s)

    def requests_bound(self, duration_s):
        return max(self.start_rate, self.end_rate) * duration_s  # thinning draws candidates at the peak

    def check(self, where):
        if self.start_rate == 0 and self.end_rate == 0:
            raise where.child("end_rate").error("expected start_rate or end_rate > 0")

    def scaled(self, factor):
        return replace(self, start_rate=self.start_rate * factor, end_rate=self.end_rate * factor)


@register
@dataclass(frozen=True)
class Diurnal(ArrivalProcess):
    """A daily pattern as a Poisson process with a time-varying rate. Either ``rates``: one rate per minute (piecewise
    constant, repeated when the run is longer), or a sinusoid ``mean_rate * (1 + amplitude * sin(2 pi (t + phase_s)
    / period_s))``. ``minute_s`` is how long one listed minute lasts in the run (60 = real time; 1 replays a day in
    24 minutes)."""

    name: ClassVar[str] = "diurnal"
    kinds: ClassVar[Mapping[str, str]] = {"rates": "rates", "minute_s": "duration", "mean_rate": "rate",
                                          "amplitude": "fraction", "period_s": "duration", "phase_s": "duration0"}
    rates: tuple[float, ...] | None = None
    minute_s: float = 60.0
    mean_rate: float | None = None
    amplitude: float = 0.5
    period_s: float = 86400.0
    phase_s: float = 0.0

    def check(self, where):
        if (self.rates is None) == (self.mean_rate is None):
            raise where.error("expected either rates (one per minute) or mean_rate (a sinusoid), not both or neither")

    def _pieces(self, duration_s):
        n = int(math.ceil(duration_s / self.minute_s))
        edges = np.minimum(np.arange(n + 1, dtype=np.float64) * self.minute_s, duration_s)
        rates = np.asarray(self.rates, dtype=np.float64)[np.arange(n) % len(self.rates)]
        return edges, rates

    def rate_at(self, t):
        return self.mean_rate * (1.0 + self.amplitude * np.sin(2 * np.pi * (t + self.phase_s) / self.period_s))

    def times(self, duration_s, rng):
        if self.rates is not None:
            return piecewise_poisson_times(*self._pieces(duration_s), rng)
        return thinned_times(self.rate_at, self.mean_rate * (1 + self.amplitude), duration_s, rng)

    def expected_rate(self, duration_s):
        if self.rates is not None:
            edges, rates = self._pieces(duration_s)
            return float(np.dot(np.diff(edges), rates) / duration_s)
        grid = np.linspace(0.0, duration_s, 10001)
        return float(np.trapz(self.rate_at(grid), grid) / duration_s)

    def scaled(self, factor):
        if self.rates is not None:
            return replace(self, rates=tuple(r * factor for r in self.rates))
        return replace(self, mean_rate=self.mean_rate * factor)

    def requests_bound(self, duration_s):
        if self.rates is None:
            return self.mean_rate * (1 + self.amplitude) * duration_s  # thinning draws candidates at the peak
        rates = np.asarray(self.rates, dtype=np.float64)  # the expected count, without laying out every minute
        cycles, rest = divmod(duration_s / self.minute_s, len(rates))
        whole = int(rest)
        tail = (rest - whole) * rates[whole] if whole < len(rates) else 0.0
        return float((cycles * rates.sum() + rates[:whole].sum() + tail) * self.minute_s)


# ``trace`` lives with the trace readers; importing it here registers it whenever the registry is used.
from serving_bench.load import traces as _traces  # noqa: E402,F401  (registers "trace")
