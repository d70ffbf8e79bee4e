"""Predicted figures with intervals: ``R`` seeded replications of a simulation, each on its own simulator seed and
its own draw of the host's speed.

A predicted figure (a percentile, a throughput, a capacity) is uncertain for two reasons, and each replication
draws both:

1. **The finite sample** of a run of that length: each replication runs with another simulator seed (service times,
   ways in and out). For a forecast of future traffic (``simulate``, ``tune``'s capacity) each replication also runs
   another realisation of the load (the load profile built with the replication's seed): future traffic is a new
   realisation. A replay of one given schedule (``validate``) keeps the schedule.
2. **The host's run-to-run variation**: the same run repeated on the same host a little later runs faster or
   slower as a whole. The profile measures it (``host_spread.sigma``, the standard deviation of the log of a run's
   throughput between repeats: ``calibrate.estimators.host_spread``). Replication ``r`` runs on a host whose work
   takes ``f_r = exp(sigma z_r)`` times as long (:func:`serving_bench.sim.host_speed.at_host_speed`), so slow-host
   and fast-host runs are simulated, not noise laid around one speed. The ``z_r`` are stratified: one in each of
   ``R`` equal-probability slices of the standard normal, in a seeded random order (a plain sample of 40 normals
   would itself put the ends of the interval a few percent off). A profile without ``host_spread`` gives intervals
   of the finite sample only, and says so (:func:`host_sigma`); ``--host-spread`` states a figure instead.

The interval at confidence ``c`` (default :data:`DEFAULT_CONFIDENCE`) is the ``(1 - c) / 2`` and ``(1 + c) / 2``
quantiles over the ``R`` replications, the ``p``-quantile taken at rank ``p (R + 1)`` of the sorted values (linear
between ranks; numpy's ``weibull``): a new run falls between the ranks ``a`` and ``b`` with probability
``(b - a) / (R + 1)``, so these ranks make it ``c`` — what a prediction of the next run needs. (numpy's default ranks,
``1 + p (R - 1)``, would cover a new run with probability ``c (R - 1) / (R + 1)``: 86 % for a 90 % interval over 40.)
:data:`DEFAULT_REPLICATIONS` = 40 puts two replications beyond each end of a 90 % interval; every replication is one
more simulation of the run. All of it is deterministic for a seed: replication ``r``'s simulator seed is drawn from
``(seed, r)``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterable, Mapping

import numpy as np
from scipy.special import ndtri

from serving_bench.errors import InputError
from serving_bench.profiles.schema import Profile
from serving_bench.run.metrics import summarize
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop, OpenLoop
from serving_bench.serving_config import ServingConfig
from serving_bench.sim.target import SimTarget

DEFAULT_REPLICATIONS = 40
DEFAULT_CONFIDENCE = 0.9
INTERVAL_STATS = ("p50_s", "p90_s", "p99_s", "throughput_rps")  # a summary's figures that carry an interval


@dataclass(frozen=True)
class Draw:
    """One replication: its index, its simulator seed (and its load realisation's, for a forecast) and the factor
    its host's work takes (> 1: a slower host)."""

    index: int
    seed: int
    host_speed: float


@dataclass(frozen=True)
class Replications:
    """``count`` replications (>= 1), their interval's ``confidence`` (0 < c < 1), the host's spread ``host_sigma``
    (the standard deviation of the log of its speed; 0: one speed) and the ``seed`` everything is drawn from."""

    count: int = DEFAULT_REPLICATIONS
    confidence: float = DEFAULT_CONFIDENCE
    host_sigma: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.count < 1 or not 0 < self.confidence < 1 or not (math.isfinite(self.host_sigma) and
                                                                 self.host_sigma >= 0) or self.seed < 0:
            raise ValueError("replications need count >= 1, 0 < confidence < 1, host_sigma >= 0 and seed >= 0")

    @property
    def ends(self) -> tuple[float, float]:
        """The quantiles of the interval's ends: ``((1 - c) / 2, (1 + c) / 2)``."""
        return (1.0 - self.confidence) / 2.0, (1.0 + self.confidence) / 2.0

    @cached_property
    def draws(self) -> tuple[Draw, ...]:
        """Every replication's draw (module doc), the same for the same fields."""
        rng = np.random.default_rng([self.seed, 0x5EED])
        slices = (rng.permutation(self.count) + rng.random(self.count)) / self.count
        speeds = np.exp(self.host_sigma * ndtri(slices))
        seeds = [int(np.random.SeedSequence([self.seed, r]).generate_state(1)[0]) for r in range(self.count)]
        return tuple(Draw(r, seeds[r], float(speeds[r])) for r in range(self.count))

    def interval(self, values: Iterable[float | None]) -> tuple[float | None, float | None]:
        """The interval of ``values`` (one per replication; None where a replication had none, e.g. no answered
        request); (None, None) when fewer than half the replications have one."""
        values = list(values)
        known = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
        if len(known) == 0 or 2 * len(known) < len(values):
            return None, None
        low, high = np.quantile(known, self.ends, method="weibull")
        return float(low), float(high)

    def upper(self, values: Iterable[float | None]) -> float:
        """The interval's upper end over every replication, a missing value (None: no answered request) counting as
        infinitely bad, as an SLO judges it: infinite where the end reaches one."""
        ordered = np.sort(np.array([math.inf if v is None else v for v in values], dtype=float))
        if len(ordered) == 0:
            return math.inf
        position = min(max(self.ends[1] * (len(ordered) + 1), 1.0), len(ordered)) - 1.0  # as :meth:`interval`
        below, above = math.floor(position), math.ceil(position)
        if math.isinf(ordered[above]):
            return math.inf
        return float(ordered[below] + (position - below) * (ordered[above] - ordered[below]))


def checked_spread(given: float) -> float:
    """``--host-spread``, or an :class:`InputError` unless a finite standard deviation >= 0."""
    if not (math.isfinite(given) and given >= 0):
        raise InputError("--host-spread", None, f"expected a standard deviation >= 0, got {given!r}")
    return float(given)


def host_sigma(profile: Profile, given: float | None = None) -> tuple[float, str]:
    """The host spread replications draw from, and where it comes from in words: ``given`` (``--host-spread``),
    else the profile's measured one, else 0 (a profile that predates it, or was not calibrated: the finite
    sample's only)."""
    if given is not None:
        return checked_spread(given), "given (--host-spread)"
    spread = profile.host_spread
    if spread is not None:
        return spread.sigma, f"the profile's, over {spread.runs} repeated runs ({spread.df} degrees of freedom)"
    return 0.0, "not measured by this profile: the intervals are the finite sample's only (--host-spread to state one)"


@dataclass(frozen=True)
class IntervalOptions:
    """What a command asks of its intervals: ``--replications`` (0: none), ``--confidence`` and ``--host-spread``
    (None: the profile's)."""

    replications: int = DEFAULT_REPLICATIONS
    confidence: float = DEFAULT_CONFIDENCE
    host_spread: float | None = None

    @classmethod
    def from_args(cls, args) -> "IntervalOptions":
        return cls(args.replications, args.confidence, args.host_spread)

    def check(self) -> "IntervalOptions":
        """Itself, or an :class:`InputError` naming the option out of range (before anything runs)."""
        replications_from(self.replications, self.confidence, 0.0, 0)
        if self.host_spread is not None:
            checked_spread(self.host_spread)
        return self

    def resolve(self, profile: Profile, seed: int) -> tuple[Replications | None, str]:
        """The replications for ``profile`` and ``seed`` (None: none asked) and where their host spread comes from
        (:func:`host_sigma`); an :class:`InputError` naming the option for a value out of range."""
        sigma, source = host_sigma(profile, self.host_spread)
        return replications_from(self.replications, self.confidence, sigma, seed), source


def replications_from(count: int, confidence: float, sigma: float, seed: int) -> Replications | None:
    """The replications the options ask for (``--replications``, ``--confidence``, the host spread, ``--seed``):
    None for 0 replications; an :class:`InputError` naming the option for a value out of range."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InputError("--replications", None, f"expected a count >= 0, got {count!r}")
    if not 0 < confidence < 1:
        raise InputError("--confidence", None, f"expected a share between 0 and 1 (0.9: 90 %), got {confidence!r}")
    if seed < 0:
        raise InputError("--seed", None, f"expected a seed >= 0 for the replications, got {seed}")
    return Replications(count, confidence, sigma, seed) if count else None


def replicate(profile: Profile, config: ServingConfig, schedule_of: Callable[[Draw], Schedule],
              replications: Replications, mode: OpenLoop | ClosedLoop | None = None) -> list[dict]:
    """The summary (:func:`serving_bench.run.metrics.summarize`) of each replication: ``schedule_of(draw)``
    simulated with the draw's seed on a host of its speed."""
    out = []
    for draw in replications.draws:
        target = SimTarget(profile, config, seed=draw.seed, host_speed=draw.host_speed)
        out.append(summarize(target.run(schedule_of(draw), mode)))
    return out


def summary_intervals(summaries: list[dict], replications: Replications,
                      stats: tuple[str, ...] = INTERVAL_STATS) -> dict[str, dict[str, list]]:
    """Per model of the replications' summaries, each of ``stats``' interval ``[low, high]``."""
    models = dict.fromkeys(m for s in summaries for m in s["models"])
    return {m: {stat: list(replications.interval(s["models"].get(m, {}).get(stat) for s in summaries))
                for stat in stats} for m in models}


def described(replications: Replications, sigma_source: str, schedules: str) -> dict:
    """What a result says of its intervals: the replications, their confidence, the host spread and where it came
    from, the seed, and what each replication ran (``schedules``, in words)."""
    return {"count": replications.count, "confidence": replications.confidence,
            "host_spread": replications.host_sigma, "host_spread_source": sigma_source, "seed": replications.seed,
            "schedules": schedules}


def with_intervals(summary: dict, intervals: Mapping[str, Mapping[str, list]], about: dict) -> None:
    """``summary`` (a results folder's) with each model's ``intervals`` and the ``replications`` they came from."""
    for model, found in intervals.items():
        if model in summary["models"]:
            summary["models"][model]["intervals"] = dict(found)
    summary["replications"] = dict(about)


def add_interval_options(parser: argparse.ArgumentParser, judged: str | None = None) -> None:
    """``--replications``, ``--confidence`` and ``--host-spread``: the intervals of ``simulate``, ``validate`` and
    ``tune``. ``judged``: what ``--confidence`` does beyond the intervals (``tune``: it then has no default, and
    judges the SLOs)."""
    parser.add_argument("--replications", type=int, default=DEFAULT_REPLICATIONS,
                        help=f"seeded replications behind each interval (default {DEFAULT_REPLICATIONS}; 0: no "
                             "intervals)")
    parser.add_argument("--confidence", type=float, default=None if judged else DEFAULT_CONFIDENCE,
                        help=f"the intervals' confidence (default {DEFAULT_CONFIDENCE:g})" + (f"; given, {judged}"
                                                                                            if judged else ""))
    parser.add_argument("--host-spread", type=float,
                        help="the host's run-to-run spread, the standard deviation of the log of a run's speed "
                             "(default: the profile's host_spread; none measured: 0, the finite sample's only)")


def interval_text(ends, unit: float = 1.0, width: int = 19) -> str:
    """``[low, high]`` (times ``unit``) as ``low – high`` right-aligned in ``width``; ``-`` where unknown."""
    if not ends or ends[0] is None or ends[1] is None:
        return f"{'-':>{width}}"
    low, high = ends[0] * unit, ends[1] * unit
    digits = 2 if high < 100 else 1 if high < 1000 else 0
    return f"{f'{low:.{digits}f} – {high:.{digits}f}':>{width}}"
