"""When does a load generator *sustain* an open-loop rate, and what is the highest one: one criterion for
serving-bench and perf_analyzer alike (``benchmarks/lateness.py``).

A side sustains ``rate`` over a measured span of ``span_s`` seconds when, counting the requests that *ended* inside
the span (perf_analyzer's own rule for a window):

* none failed;
* at most 1 % of them left more than 1 ms after their scheduled time — perf_analyzer's "delayed" warning, the same
  as a send-lateness p99 <= 1 ms;
* it delivered at least ``rate*T - z*sqrt(rate*T)`` of them (T = ``span_s``). Arrivals are Poisson, so the count a
  perfect client delivers is itself a Poisson count with mean ``rate*T``: the allowance ``z`` standard deviations
  below it (z = 3: a perfect client misses by noise in ~0.13 % of steps) keeps a few per cent of count noise over a
  3-second span from reading as a failure.

The highest sustained rate is searched by :func:`max_sustained`: from a start it steps up (or down) by a growing
factor until it holds a sustained rate below a failed one — bracketed from both sides — then bisects
(geometrically) until they are within a tolerance. A failed step is measured once more before it counts, so one
noisy miss does not walk the search down; a clear miss (more than 5 % of requests late, or the count short by twice
the allowance) is not noise and is not repeated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from serving_bench.peers.perf_analyzer import DELAY_PCT_THRESHOLD

Z = 3.0  # standard deviations of Poisson count noise allowed below rate * span
CLEAR_DELAYED_PCT = 5.0  # a miss this late (five times the bar) is not noise: not repeated


@dataclass(frozen=True)
class Delivery:
    """What one side delivered at one offered rate (requests/s) over a measured span (seconds)."""

    rate: float
    span_s: float
    delivered: int  # requests answered ok that ended inside the span
    delayed_pct: float | None  # percent of those sent > 1 ms late; None: at most 1 % (perf_analyzer prints no more)
    failed: int = 0  # requests that failed anywhere in the run


def allowance(rate: float, span_s: float, z: float = Z) -> float:
    """Count noise allowed below ``rate * span_s``: ``z`` standard deviations of a Poisson count (requests)."""
    return z * math.sqrt(rate * span_s)


def judge(d: Delivery, z: float = Z) -> dict:
    """``{"sustained", "clear_miss", "why"}`` for one delivery under the shared criterion (module docstring)."""
    expected = d.rate * d.span_s
    short = expected - d.delivered
    slack = allowance(d.rate, d.span_s, z)
    late = d.delayed_pct if d.delayed_pct is not None else 0.0
    why = []
    if d.failed:
        why.append(f"{d.failed} failed")
    if late > DELAY_PCT_THRESHOLD:
        why.append(f"{late:.1f} % sent > 1 ms late")
    if short > slack:
        why.append(f"delivered {d.delivered} of {expected:.0f} (allowance {slack:.0f})")
    clear = late > CLEAR_DELAYED_PCT or short > 2 * slack
    return {"sustained": not why, "clear_miss": bool(why) and clear, "why": "; ".join(why) or "sustained"}


@dataclass(frozen=True)
class Search:
    """Outcome of :func:`max_sustained`: the highest sustained rate (None: not even the floor), the lowest failed
    one above it (None: never failed up to the limit), whether the two ended within the tolerance (or at the floor
    or limit) before the step budget ran out, and every step in order."""

    rate: float | None
    failed_at: float | None
    converged: bool
    steps: list


class _OutOfSteps(Exception):
    pass


def max_sustained(probe: Callable[[float], dict], start: float, *, step: float, tolerance: float,
                  floor: float = 50.0, limit: float = 32000.0, max_steps: int = 1000) -> Search:
    """Bracket the highest rate ``probe`` sustains, then bisect to ``tolerance`` (relative width of the bracket).

    ``probe(rate)`` measures once and returns a dict with ``sustained`` and ``clear_miss`` (see :func:`judge`).
    From ``start`` the search moves up while steps hold (down while they fail, not below ``floor``) by ``step``,
    the factor squared after each move (capped at 2: a gallop, so a far-off start costs a few steps), until it holds
    a sustained rate and a failed one; it then tries their geometric mean until they are within ``tolerance``. A
    failed step that is not a clear miss is measured once more (row marked ``repeat``) and fails only if that fails
    too. At most ``max_steps`` measurements; rates are whole requests per second.
    """
    steps: list[dict] = []

    def holds(rate: float) -> bool:
        for repeat in (False, True):
            if len(steps) >= max_steps:
                raise _OutOfSteps
            row = probe(rate)
            steps.append({**row, "repeat": True} if repeat else row)
            if row["sustained"] or row.get("clear_miss"):
                break
        return bool(row["sustained"])

    lo = hi = None
    rate, factor = float(round(start)), step
    try:
        if holds(rate):
            lo = rate
            while hi is None and rate * factor <= limit:
                rate, factor = float(round(rate * factor)), min(factor * factor, 2.0)
                lo, hi = (rate, hi) if holds(rate) else (lo, rate)
        else:
            hi = rate
            while lo is None and rate / factor >= floor:
                rate, factor = float(round(rate / factor)), min(factor * factor, 2.0)
                lo, hi = (rate, hi) if holds(rate) else (lo, rate)
        while lo is not None and hi is not None and hi / lo - 1 > tolerance:
            mid = float(round(math.sqrt(lo * hi)))
            if mid in (lo, hi):
                break
            lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    except _OutOfSteps:
        return Search(lo, hi, False, steps)
    return Search(lo, hi, True, steps)
