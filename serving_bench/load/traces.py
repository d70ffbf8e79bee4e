"""Production traces turned into arrivals: the ``trace`` arrival process (:class:`Trace`) and ``convert``.

The files (a per-request CSV, the Azure Functions 2019 invocation counts) are read by
:mod:`serving_bench.load.trace_files`. A request CSV gives its requests as they are (``rate_scale`` < 1 thins them,
``time_scale`` stretches time). An Azure trace's functions are mapped onto the profile's models ``round_robin`` (in
file order) or by ``popularity`` (the busiest functions first, each to the model furthest below its traffic share).
Counts are scaled by ``rate_scale`` (stochastic rounding keeps the expected total), each minute lasts
``60 * time_scale`` seconds, and the arrivals of a minute are spread inside it by ``spread``: ``poisson`` (uniform
order statistics — a Poisson process conditioned on the count), ``even`` (evenly spaced) or ``gamma`` (bursty renewal
gaps with ``spread_cv``, rescaled to the minute).

**Scaled** (:meth:`Trace.scaled`, the ``scale`` growth rule: the same users sending more): the trace, after the
above, compressed in time by the factor and laid end to end (the same trace shifted, the last copy cut) until it
covers the run (or, without a run length, the trace's own span); ``speedup`` is that factor (not a profile field).

Errors name the file, the line and the field. ``convert`` writes any trace as a request CSV.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

import numpy as np

from serving_bench.errors import InputError
from serving_bench.load import fields as fv
from serving_bench.load.arrivals import ArrivalProcess, register
from serving_bench.load.fields import Where
from serving_bench.load.trace_files import open_trace, read_azure, read_request_csv, write_request_csv


def map_functions(counts: np.ndarray, shares: Sequence[float], how: str) -> np.ndarray:
    """Model index for each function. ``round_robin``: function ``f`` -> model ``f % M``. ``popularity``: functions
    from busiest to quietest, each to the model with the largest gap between its share of the total and what it
    already got (so the busiest functions spread over the models and the shares come out close)."""
    m = len(shares)
    f = counts.shape[0]
    if how == "round_robin":
        return np.arange(f) % m
    totals = counts.sum(axis=1).astype(np.float64)
    weights = np.asarray(shares, dtype=np.float64) / np.sum(shares)
    target = weights * totals.sum()
    got = np.zeros(m)
    out = np.zeros(f, dtype=np.int64)
    for fn in np.argsort(-totals, kind="stable"):
        k = int(np.argmax(target - got))
        out[fn] = k
        got[k] += totals[fn]
    return out


def scale_counts(counts: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    """``counts * factor`` rounded stochastically (keeps the expected total exactly)."""
    scaled = counts * factor
    whole = np.floor(scaled)
    return (whole + (rng.random(scaled.shape) < scaled - whole)).astype(np.int64)


def spread_in_slots(counts: np.ndarray, slot_s: float, how: str, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times for ``counts[k]`` requests inside slot ``[k*slot_s, (k+1)*slot_s)`` (unsorted)."""
    starts = np.repeat(np.arange(len(counts)) * slot_s, counts)
    if how == "even":
        offsets = np.concatenate([(np.arange(c) + 0.5) / c for c in counts if c]) if counts.sum() else np.empty(0)
    elif how == "poisson":
        offsets = rng.random(int(counts.sum()))
    else:  # gamma: bursty gaps, normalised so the c arrivals (and the gap after the last) fill the slot
        shape = 1.0 / cv ** 2
        parts = []
        for c in counts:
            if c:
                gaps = rng.gamma(shape, 1.0, c + 1)
                parts.append(np.cumsum(gaps)[:-1] / gaps.sum())
        offsets = np.concatenate(parts) if parts else np.empty(0)
    return starts + offsets * slot_s


@register
@dataclass(frozen=True)
class Trace(ArrivalProcess):
    """Arrivals (and models) read from a trace file; ``path`` is relative to the profile. See the module doc."""

    name: ClassVar[str] = "trace"
    kinds: ClassVar[Mapping[str, str]] = {"path": "text", "format": "text", "time_scale": "positive",
                                          "rate_scale": "positive", "mapping": "text", "spread": "text",
                                          "spread_cv": "positive", "start_minute": "number", "minutes": "number",
                                          "strict": "bool", "model_map": "map"}
    required: ClassVar[tuple[str, ...]] = ("path",)
    path: str = ""
    format: str = "csv"
    time_scale: float = 1.0
    rate_scale: float = 1.0
    mapping: str = "round_robin"
    spread: str = "poisson"
    spread_cv: float = 2.0
    start_minute: int = 1
    minutes: int | None = None
    strict: bool = False
    model_map: tuple[tuple[str, str], ...] = ()
    speedup: float = 1.0  # scaled(): compressed in time by this and tiled (not read from a profile)

    @classmethod
    def from_mapping(cls, data, where):
        data = dict(data)
        fv.no_unknown(data, where, ["process", *cls.kinds])
        if "path" not in data:
            raise where.child("path").error("missing; expected the trace file (relative to the profile)")
        kw = {}
        for key in ("path", "format", "mapping", "spread"):
            if key in data:
                kw[key] = _text(data[key], where.child(key))
        base = Path(where.source).parent if where.source else Path.cwd()
        kw["path"] = str((base / kw["path"]).resolve()) if not Path(kw["path"]).is_absolute() else kw["path"]
        for key in ("time_scale", "rate_scale", "spread_cv"):
            if key in data:
                kw[key] = fv.number(data[key], where.child(key), low=0, low_open=True, what="a number")
        if "start_minute" in data:
            kw["start_minute"] = fv.integer(data["start_minute"], where.child("start_minute"), low=1)
        if "minutes" in data:
            kw["minutes"] = fv.integer(data["minutes"], where.child("minutes"), low=1)
        if "strict" in data:
            if not isinstance(data["strict"], bool):
                raise where.child("strict").error(f"expected true or false, got {data['strict']!r}")
            kw["strict"] = data["strict"]
        if "model_map" in data:
            mm = fv.mapping(data["model_map"], where.child("model_map"), what="a mapping trace name -> model")
            kw["model_map"] = tuple((str(k), _text(v, where.child("model_map").child(str(k)))) for k, v in mm.items())
        config = cls(**kw)
        fv.choice(config.format, where.child("format"), ["csv", "azure"])
        fv.choice(config.mapping, where.child("mapping"), ["round_robin", "popularity"])
        fv.choice(config.spread, where.child("spread"), ["poisson", "even", "gamma"])
        if config.format == "csv" and config.rate_scale > 1:
            raise where.child("rate_scale").error("expected <= 1 for a request CSV (thinning); use time_scale < 1 "
                                                  "to replay it faster")
        if not Path(config.path).is_file():
            raise where.child("path").error(f"no such trace file: {config.path}")
        return config

    # -- reading --------------------------------------------------------------------------------------------------
    def requests(self, models: Sequence[str], shares: Sequence[float], rng: np.random.Generator,
                 duration_s: float | None = None) -> tuple[np.ndarray, np.ndarray, tuple[str, ...], np.ndarray | None]:
        """``(times_s, model index, model names, batch or None)`` of the trace after scaling, cut at ``duration_s``.

        For a request CSV the models come from the trace; for Azure the functions are mapped onto ``models`` with
        ``shares``."""
        if self.format == "csv":
            trace = read_request_csv(self.path, strict=self.strict, model_map=dict(self.model_map))
            keep = rng.random(len(trace.times_s)) < self.rate_scale if self.rate_scale < 1 else \
                np.ones(len(trace.times_s), dtype=bool)
            times, model, batch = trace.times_s[keep] * self.time_scale, trace.model[keep], trace.batch[keep]
            names = trace.models
            span_s = float(trace.times_s[-1] * self.time_scale) + 1e-9
        else:
            if not models:
                raise InputError(self.path, "models", "an Azure trace needs the profile's models to map functions on")
            trace = read_azure(self.path)
            first = self.start_minute - 1
            last = trace.counts.shape[1] if self.minutes is None else min(first + self.minutes, trace.counts.shape[1])
            if first >= trace.counts.shape[1]:
                raise InputError(self.path, "start_minute", f"expected <= {trace.counts.shape[1]}, got {self.start_minute}")
            counts = scale_counts(trace.counts[:, first:last], self.rate_scale, rng)
            owner = map_functions(counts, shares, self.mapping)
            slot_s = 60.0 * self.time_scale
            parts_t, parts_m = [], []
            per_model = np.zeros((len(models), counts.shape[1]), dtype=np.int64)
            np.add.at(per_model, owner, counts)
            for k in range(len(models)):
                t = spread_in_slots(per_model[k], slot_s, self.spread, self.spread_cv, rng)
                parts_t.append(t)
                parts_m.append(np.full(len(t), k, dtype=np.int32))
            times = np.concatenate(parts_t)
            model = np.concatenate(parts_m)
            order = np.argsort(times, kind="stable")
            times, model, batch, names = times[order], model[order], None, tuple(models)
            span_s = counts.shape[1] * slot_s
        if self.speedup != 1.0:
            times, model, batch = self._tiled(times, model, batch, span_s, duration_s or span_s)
        if duration_s is not None:
            keep = times < duration_s
            times, model = times[keep], model[keep]
            batch = batch[keep] if batch is not None else None
        return times, model, names, batch

    def _tiled(self, times: np.ndarray, model: np.ndarray, batch: np.ndarray | None, span_s: float,
               until_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The arrivals over ``[0, span_s)`` compressed by ``speedup`` and laid end to end up to ``until_s``."""
        length = span_s / self.speedup
        copies = max(int(math.ceil(until_s / length - 1e-9)), 1)
        tiled = np.tile(times / self.speedup, copies) + np.repeat(np.arange(copies) * length, len(times))
        return tiled, np.tile(model, copies), None if batch is None else np.tile(batch, copies)

    def scaled(self, factor):
        """The trace sent ``factor`` times as fast (module doc: compressed and tiled)."""
        return replace(self, speedup=self.speedup * factor)

    def span_s(self) -> float:
        """Length of the scaled trace in seconds (the profile's default duration)."""
        if self.format == "csv":
            t = read_request_csv(self.path, strict=self.strict).times_s
            return float(t[-1] * self.time_scale) + 1e-9
        n = read_azure(self.path).counts.shape[1] - (self.start_minute - 1)
        n = n if self.minutes is None else min(n, self.minutes)
        return n * 60.0 * self.time_scale

    def times(self, duration_s, rng):
        return self.requests((), (), rng, duration_s)[0] if self.format == "csv" else \
            self.requests(("all",), (1.0,), rng, duration_s)[0]

    def expected_rate(self, duration_s):
        return len(self.times(duration_s, np.random.default_rng(0))) / duration_s

    def requests_bound(self, duration_s):
        """The trace's requests after ``rate_scale`` (a request CSV: its rows; Azure: the counts of the chosen
        minutes; times the copies a scaled trace tiles), whatever ``duration_s`` cuts off: known from the file without spreading any arrival."""
        if self.format == "csv":
            with open_trace(Path(self.path)) as handle:
                rows = sum(1 for line in handle if line.strip()) - 1
            return max(rows, 0) * min(self.rate_scale, 1.0) * self._copies_bound()
        counts = read_azure(self.path).counts
        first = self.start_minute - 1
        last = counts.shape[1] if self.minutes is None else first + self.minutes
        return float(counts[:, first:last].sum()) * self.rate_scale * self._copies_bound()

    def _copies_bound(self) -> int:
        """At most how many copies :meth:`_tiled` lays end to end over the trace's own span (1 unless scaled)."""
        return 1 if self.speedup == 1.0 else int(math.ceil(self.speedup))


def _text(value, where: Where) -> str:
    if not isinstance(value, str) or not value:
        raise where.error(f"expected a non-empty string, got {value!r}")
    return value


# -- conversion ----------------------------------------------------------------------------------------------------

def convert(src: str | Path, dst: str | Path, *, models: Sequence[str], shares: Sequence[float] | None = None,
            seed: int = 0, **options) -> Path:
    """Convert a trace (``format`` = ``azure`` or ``csv`` in ``options``, plus the :class:`Trace` options) to a
    request CSV ``dst`` with arrivals mapped onto ``models``."""
    trace = Trace(path=str(src), **options)
    shares = list(shares) if shares is not None else [1.0] * len(models)
    times, model, names, batch = trace.requests(models, shares, np.random.default_rng(seed))
    return write_request_csv(dst, times, [names[k] for k in model], batch)


def main(argv: list[str] | None = None) -> int:
    """``python -m serving_bench.load.traces convert SRC DST --models a,b [--format azure] [--time-scale X] ...``"""
    parser = argparse.ArgumentParser(prog="python -m serving_bench.load.traces",
                                     description="convert an Azure Functions trace to a request CSV")
    sub = parser.add_subparsers(dest="cmd", required=True)
    conv = sub.add_parser("convert")
    conv.add_argument("src")
    conv.add_argument("dst")
    conv.add_argument("--models", required=True, help="comma-separated served model names")
    conv.add_argument("--shares", help="comma-separated traffic shares (default equal)")
    conv.add_argument("--format", default="azure", choices=["azure", "csv"])
    conv.add_argument("--mapping", default="round_robin", choices=["round_robin", "popularity"])
    conv.add_argument("--spread", default="poisson", choices=["poisson", "even", "gamma"])
    conv.add_argument("--time-scale", type=float, default=1.0)
    conv.add_argument("--rate-scale", type=float, default=1.0)
    conv.add_argument("--start-minute", type=int, default=1)
    conv.add_argument("--minutes", type=int)
    conv.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    shares = [float(s) for s in args.shares.split(",")] if args.shares else None
    try:
        out = convert(args.src, args.dst, models=models, shares=shares, seed=args.seed, format=args.format,
                      mapping=args.mapping, spread=args.spread, time_scale=args.time_scale,
                      rate_scale=args.rate_scale, start_minute=args.start_minute, minutes=args.minutes)
    except InputError as err:
        print(f"error: {err.line()}")
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
