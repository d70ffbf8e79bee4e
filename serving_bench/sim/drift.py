"""The host's speed drifts: one latent speed ``Z(t)`` that every phase running at time ``t`` shares (docs/sim.md#the-hosts-speed-drifts).

``Z`` is a stationary Gaussian process of unit variance whose correlation at lag ``L`` is

    r(L) = w exp(-L / fast_s) + (1 - w) exp(-L / slow_s)

(two Ornstein-Uhlenbeck processes added), sampled on a seeded grid of :data:`GRID_STEP_S` that wraps after
:data:`GRID_POINTS` steps. A draw at probability ``u`` of a phase with loading ``rho`` taken at time ``t`` becomes

    u' = Phi(rho Z(t) + sqrt(1 - rho^2) Phi^-1(u))

— still uniform, so every measured distribution keeps its marginal; what changes is that phases close in time are
slow or fast together. The loadings and ``r`` come from the profile's ``drift`` (``estimators.phase_drift``, the solo
batch-1 run): :func:`fit_drift`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import numpy as np
from scipy.special import ndtr, ndtri

try:
    from scipy.signal import lfilter
except (ImportError, AttributeError):  # a scipy built for numpy 2 beside numpy 1 (scripts/gpu_check.sh on the GPU host)
    lfilter = None

GRID_STEP_S = 0.5e-3  # the latent's time step (the shortest correlation time measured is a few milliseconds)
GRID_POINTS = 1 << 17  # grid length before it wraps: 65.5 s
MAX_LOADING = 0.95  # a phase keeps at least sqrt(1 - 0.95^2) = 31 % of its own randomness
FAST_S = tuple(x * 1e-3 for x in (0.5, 1, 2, 3, 5, 8, 12))  # the time constants fit_drift chooses from
SLOW_S = tuple(x * 1e-3 for x in (15, 25, 40, 60, 100, 200))


@dataclass(frozen=True)
class Loadings:
    """How strongly a model's phases follow the host's speed (0: not at all, 1: wholly)."""

    way_in: float
    service: float
    way_out: float


@dataclass(frozen=True)
class HostDrift:
    """The latent's correlation in time (see the module docstring), seconds."""

    weight: float
    fast_s: float
    slow_s: float

    def correlation(self, lag_s):
        return self.weight * np.exp(-np.asarray(lag_s) / self.fast_s) + \
            (1.0 - self.weight) * np.exp(-np.asarray(lag_s) / self.slow_s)

    def latent(self, seed: int) -> np.ndarray:
        """``Z`` on the grid, read-only; the same for the same seed (cached: both engines and every model of a run
        read one array)."""
        return _latent(self, seed)


def _ar1(b: float, a: float, x: np.ndarray) -> np.ndarray:
    """``y[n] = b x[n] + a y[n - 1]`` (``y[-1] = 0``): scipy's ``lfilter([b], [1, -a], x)``, or the same float
    operations in Python where scipy.signal cannot be imported."""
    if lfilter is not None:
        return lfilter([b], [1.0, -a], x)
    y, previous = np.empty_like(x), 0.0
    for n, value in enumerate(x.tolist()):
        previous = b * value + a * previous
        y[n] = previous
    return y


@lru_cache(maxsize=8)
def _latent(drift: HostDrift, seed: int) -> np.ndarray:
    rng = np.random.default_rng((seed, 6))
    z = np.zeros(GRID_POINTS)
    for share, tau in ((drift.weight, drift.fast_s), (1.0 - drift.weight, drift.slow_s)):
        a = math.exp(-GRID_STEP_S / tau)
        noise = rng.standard_normal(GRID_POINTS)
        noise[0] /= math.sqrt(1.0 - a * a)  # the first point drawn from the stationary law
        z += math.sqrt(share) * _ar1(math.sqrt(1.0 - a * a), a, noise)
    z.setflags(write=False)
    return z


def at(z: np.ndarray, t_s) -> np.ndarray:
    """``Z`` at times ``t_s`` (seconds, array or scalar): the grid point at or before each, wrapped."""
    return z[(np.asarray(t_s) / GRID_STEP_S).astype(np.int64) % GRID_POINTS]


def follow(u, z, rho: float):
    """Draws ``u`` (uniform) of a phase of loading ``rho`` where the latent is ``z``: ``Phi(rho z + sqrt(1 - rho^2)
    Phi^-1(u))``."""
    if rho <= 0.0:
        return u
    return ndtr(rho * np.asarray(z) + math.sqrt(1.0 - rho * rho) * ndtri(u))


def fit_drift(drifts: Mapping[str, Mapping]) -> tuple[HostDrift | None, dict[str, Loadings]]:
    """The host's latent and each model's loadings from the profile's per-model ``drift`` figures.

    * The service's loading ``rho_s`` is the square root of its correlation with the service at the shortest lag
      measured (two services half a millisecond apart share the host's speed, and the runtime's own warm or cold
      state: both are what a queue feels); the ways' loadings match their correlations with the service,
      ``rho_in = corr(in, service) / rho_s`` and ``rho_out = corr(service, out) / rho_s`` (each at most
      :data:`MAX_LOADING`). ``corr(in, out)`` then follows (``rho_in rho_out``), not fitted.
    * ``r(L)``: per model its services' correlations over ``rho_s^2``, pooled over the models (the median at each
      lag); ``w``, ``fast_s`` and ``slow_s`` by least squares over a grid, with ``r(0) = 1``.

    None and no loadings where no model measured a drift (or none correlates)."""
    loadings: dict[str, Loadings] = {}
    points: dict[float, list[float]] = {}
    for name, d in drifts.items():
        lags = {float(k) * 1e-3: float(v) for k, v in (d.get("service_by_lag_ms") or {}).items()}
        if not lags:
            continue
        shortest = lags[min(lags)]
        if shortest <= 0.0:
            continue
        rho_s = min(math.sqrt(shortest), MAX_LOADING)

        def loading(c: float) -> float:
            return float(min(max(c / rho_s, 0.0), MAX_LOADING))

        loadings[name] = Loadings(loading(float(d.get("in_service", 0.0))), rho_s,
                                  loading(float(d.get("service_out", 0.0))))
        for lag, c in lags.items():
            points.setdefault(lag, []).append(min(max(c / rho_s ** 2, 0.0), 1.0))
    if not loadings:
        return None, {}
    lags = np.array([0.0] + sorted(points))
    target = np.array([1.0] + [float(np.median(points[lag])) for lag in sorted(points)])
    best = None
    for fast in FAST_S:
        for slow in SLOW_S:
            for w in np.linspace(0.0, 1.0, 21):
                drift = HostDrift(float(w), fast, slow)
                err = float(np.sum((drift.correlation(lags) - target) ** 2))
                if best is None or err < best[0] - 1e-12:
                    best = (err, drift)
    return best[1], loadings
