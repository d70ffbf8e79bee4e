"""Load profiles (``load_profiles/*.yaml``) and ``build_schedule(profile) -> Schedule``.

A profile says how long, with which seed, which models (or ensembles) get what share of the traffic, with which
request batch sizes, input samples and SLOs, and which arrival process drives it. The schema is documented with
examples in ``docs/load.md``; every problem is one line naming the file, the field and what was expected.

Traffic is either one shared stream (top-level ``arrival``) split over models by ``share`` (each arrival goes to
model ``m`` with probability ``share_m / sum(shares)``, so a bursty stream bursts for every model at once), or one
stream per model (its own ``arrival``, or ``rate: X`` as shorthand for a Poisson stream at X req/s), or both.
Randomness is split per purpose and per model name from the profile seed, so adding a model does not change the
arrivals of the others.

A schedule's size is known before it is built (:func:`schedule_size`, from each stream's rate and the duration, or a
trace's rows); above a bound (:data:`MAX_REQUESTS`, ``--max-requests`` raises it) it is refused with one line that
names the field, the number of requests and the memory they would take (:func:`check_schedule_size`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from serving_bench.errors import InputError
from serving_bench.files import read_yaml, size_text
from serving_bench.export.repository import check_entry_name
from serving_bench.load import fields as fv
from serving_bench.load.arrivals import ArrivalProcess, Poisson, arrival_from_mapping
from serving_bench.load.fields import Where
from serving_bench.load.traces import Trace
from serving_bench.run.schedule import Schedule

SLO_STATS = ("p50", "p90", "p95", "p99", "p99.9", "mean")
TOP_FIELDS = ("name", "duration", "seed", "warmup", "cooldown", "arrival", "samples", "models")
MODEL_FIELDS = ("share", "rate", "arrival", "batch", "samples", "inputs", "shapes", "slo")
DEFAULT_SAMPLES = 16
MAX_REQUESTS = 10_000_000  # a schedule's default bound; --max-requests raises it
# Memory per request: building a schedule peaked at 74 bytes per request and simulating it at ~360 more (1,000,000
# requests, 2-core VM, 2026-12-06; a replay keeps about as much per request).
MEMORY_BYTES_PER_REQUEST = 440


@dataclass(frozen=True)
class ModelLoad:
    """One model's part of a profile. ``batch``: (size, weight) pairs; ``slo``: stat -> bound in seconds;
    ``inputs``: input name -> .npy file (absolute); ``shapes``: input name -> dims without batch (fills -1 dims)."""

    name: str
    share: float | None = None
    arrival: ArrivalProcess | None = None
    batch: tuple[tuple[int, float], ...] = ((1, 1.0),)
    samples: int = DEFAULT_SAMPLES
    inputs: tuple[tuple[str, str], ...] = ()
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    slo: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class LoadProfile:
    """A validated load profile. Times in seconds."""

    name: str
    duration_s: float
    seed: int
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    arrival: ArrivalProcess | None = None
    models: tuple[ModelLoad, ...] = ()
    path: str | None = None

    @classmethod
    def load(cls, path: str | Path) -> "LoadProfile":
        """Read and validate a YAML profile."""
        path = Path(path)
        return cls.from_mapping(read_yaml(path, "profile"), path)

    @classmethod
    def from_mapping(cls, data: Any, source: str | Path | None = None) -> "LoadProfile":
        """Validate a parsed profile; ``source`` names the file in errors and anchors relative paths."""
        source = str(source) if source is not None else None
        root = Where(source)
        data = fv.mapping(data, Where(source, "(top level)"), what="a mapping of profile fields")
        fv.no_unknown(data, root, TOP_FIELDS)
        base = Path(source).parent if source else Path.cwd()

        arrival = arrival_from_mapping(data["arrival"], root.child("arrival")) if "arrival" in data else None
        if "duration" in data:
            duration_s = fv.seconds(data["duration"], root.child("duration"), allow_zero=False)
        elif isinstance(arrival, Trace):
            duration_s = arrival.span_s()
        else:
            raise root.child("duration").error("missing; expected the run length, e.g. 20s")
        seed = fv.integer(data.get("seed", 0), root.child("seed"), low=0)
        warmup_s = fv.seconds(data.get("warmup", 0), root.child("warmup"))
        cooldown_s = fv.seconds(data.get("cooldown", 0), root.child("cooldown"))
        if warmup_s + cooldown_s >= duration_s:
            raise root.child("warmup").error(f"expected warmup + cooldown ({warmup_s + cooldown_s:g} s) below the "
                                             f"duration ({duration_s:g} s)")
        default_samples = fv.integer(data.get("samples", DEFAULT_SAMPLES), root.child("samples"), low=1)

        raw_models = data.get("models", {})
        if raw_models is None:
            raw_models = {}
        raw_models = fv.mapping(raw_models, root.child("models"), what="a mapping model name -> settings")
        csv_trace = isinstance(arrival, Trace) and arrival.format == "csv"
        if not raw_models and not csv_trace:
            raise root.child("models").error("missing or empty; expected at least one model (a served entry name)")
        models = tuple(_model(name, spec, root.child("models").child(str(name)), base, default_samples,
                              shared=arrival is not None)
                       for name, spec in raw_models.items())
        if arrival is not None and not csv_trace and not any(m.share is not None for m in models):
            raise root.child("arrival").error("no model takes a share of this stream; give some model 'share: w'")
        if arrival is None and any(m.share is not None for m in models):
            name = next(m.name for m in models if m.share is not None)
            raise root.child("models").child(name).child("share").error(
                "a share needs a top-level 'arrival' stream to split; use 'rate' or 'arrival' for a stream of its own")
        name = data.get("name", Path(source).stem if source else "profile")
        if not isinstance(name, str) or not name:
            raise root.child("name").error(f"expected a non-empty string, got {name!r}")
        return cls(name, duration_s, seed, warmup_s, cooldown_s, arrival, models, source)

    def model(self, name: str) -> ModelLoad | None:
        return next((m for m in self.models if m.name == name), None)

    def scaled(self, factor: float) -> "LoadProfile":
        """The profile with every arrival process, shared and per model, sent ``factor`` (> 0) times as fast
        (:meth:`ArrivalProcess.scaled`); shares, batches, samples, SLOs and the run's length unchanged."""
        if not factor > 0:
            raise ValueError("a rate factor must be > 0")
        return replace(self, arrival=None if self.arrival is None else self.arrival.scaled(factor),
                       models=tuple(m if m.arrival is None else replace(m, arrival=m.arrival.scaled(factor))
                                    for m in self.models))


def _model(name: Any, spec: Any, where: Where, base: Path, default_samples: int, shared: bool) -> ModelLoad:
    check_entry_name(name, where.source, where.field)
    spec = {} if spec is None else fv.mapping(spec, where, what="a mapping of model settings")
    fv.no_unknown(spec, where, MODEL_FIELDS)
    own = [k for k in ("share", "rate", "arrival") if k in spec]
    if len(own) > 1:
        raise where.child(own[1]).error(f"give one of share, rate, arrival (got {' and '.join(own)})")
    share = arrival = None
    if "share" in spec:
        share = fv.number(spec["share"], where.child("share"), low=0, low_open=True, what="a traffic weight")
    elif "rate" in spec:
        arrival = Poisson(rate=fv.rate(spec["rate"], where.child("rate")))
    elif "arrival" in spec:
        arrival = arrival_from_mapping(spec["arrival"], where.child("arrival"))
        if isinstance(arrival, Trace) and arrival.format == "csv":
            raise where.child("arrival").error("a request-CSV trace names its own models; put it at the top level")
    elif shared:
        share = 1.0
    else:
        raise where.error("expected share, rate or arrival for this model (there is no top-level arrival stream)")

    batch_raw = spec.get("batch", 1)
    if isinstance(batch_raw, Mapping):
        batch = tuple((fv.integer(k, where.child("batch").child(str(k)), low=1, what="a batch size"),
                       fv.number(v, where.child("batch").child(str(k)), low=0, low_open=True, what="a weight"))
                      for k, v in batch_raw.items())
        if not batch:
            raise where.child("batch").error("expected a batch size or a mapping size -> weight")
    else:
        batch = ((fv.integer(batch_raw, where.child("batch"), low=1, what="a batch size"), 1.0),)

    inputs = ()
    if "inputs" in spec:
        raw = fv.mapping(spec["inputs"], where.child("inputs"), what="a mapping input name -> .npy file")
        items = []
        for key, value in raw.items():
            if not isinstance(value, str) or not value.endswith(".npy"):
                raise where.child("inputs").child(str(key)).error(f"expected a path to a .npy file, got {value!r}")
            path = (base / value).resolve()
            if not path.is_file():
                raise where.child("inputs").child(str(key)).error(f"no such file: {path}")
            items.append((str(key), str(path)))
        inputs = tuple(items)
    samples = fv.integer(spec.get("samples", default_samples), where.child("samples"), low=1)

    shapes = ()
    if "shapes" in spec:
        raw = fv.mapping(spec["shapes"], where.child("shapes"), what="a mapping input name -> dims without batch")
        shapes = tuple((str(k), tuple(fv.integer(d, where.child("shapes").child(str(k)).child(i), low=1,
                                                 what="a dimension")
                                      for i, d in enumerate(fv.sequence(v, where.child("shapes").child(str(k)),
                                                                        what="a list of dimensions"))))
                       for k, v in raw.items())

    slo = ()
    if "slo" in spec:
        raw = fv.mapping(spec["slo"], where.child("slo"), what="a mapping like {p99: 20ms}")
        slo = tuple((fv.choice(str(k), where.child("slo").child(str(k)), SLO_STATS),
                     fv.seconds(v, where.child("slo").child(str(k)), allow_zero=False)) for k, v in raw.items())
    return ModelLoad(name, share, arrival, batch, samples, inputs, shapes, slo)


def _rng(seed: int, *purpose: str) -> np.random.Generator:
    """A generator for one purpose (e.g. ``"arrival", model``), stable under adding or reordering models."""
    return np.random.default_rng(np.random.SeedSequence([seed, *(zlib.crc32(p.encode()) for p in purpose)]))


def sample_seed(seed: int, model: str) -> int:
    """The seed of a model's input samples (sample ``k`` is drawn from ``SeedSequence([sample_seed, k])``)."""
    return int(np.random.SeedSequence([seed, zlib.crc32(b"inputs"), zlib.crc32(model.encode())]).generate_state(1)[0])


@dataclass(frozen=True)
class ScheduleSize:
    """A profile's schedule before it is built: ``requests`` (expected), and per stream its field in the profile
    (``arrival`` or ``models.NAME``) with the requests it gives."""

    requests: int
    streams: tuple[tuple[str, float], ...]


def schedule_size(profile: LoadProfile) -> ScheduleSize:
    """How many requests ``profile``'s schedule will hold, from each stream's ``requests_bound`` (no arrival drawn)."""
    streams = []
    if profile.arrival is not None:
        streams.append(("arrival", float(profile.arrival.requests_bound(profile.duration_s))))
    for m in profile.models:
        if m.arrival is not None:
            streams.append((f"models.{m.name}", float(m.arrival.requests_bound(profile.duration_s))))
    return ScheduleSize(int(round(sum(n for _, n in streams))), tuple(streams))


def check_schedule_size(profile: LoadProfile, max_requests: int = MAX_REQUESTS, *,
                        duration_option: str | None = None) -> int:
    """The expected number of requests of ``profile``'s schedule; above ``max_requests`` an :class:`InputError`
    naming the field at fault — the busiest stream's, or the duration where a minute of that stream would fit
    (``duration_option``: the command-line option that set it, e.g. ``--duration``) — the requests and the memory
    (:data:`MEMORY_BYTES_PER_REQUEST`)."""
    size = schedule_size(profile)
    if size.requests <= max_requests:
        return size.requests
    field, count = max(size.streams, key=lambda stream: stream[1])
    duration = profile.duration_s
    rate = count / duration
    what = (f"{size.requests:,} requests (~{size_text(size.requests * MEMORY_BYTES_PER_REQUEST)} of memory); "
            f"expected at most {max_requests:,} (--max-requests raises the bound)")
    if rate * min(duration, 60.0) <= max_requests:  # a minute of the stream fits: the duration is at fault
        source, at = (duration_option, None) if duration_option else (profile.path, "duration")
        raise InputError(source, at, f"{duration:g} s at {rate:,.6g} req/s ({field}) would be {what}")
    raise InputError(profile.path, field, f"{rate:,.6g} req/s over {duration:g} s would be {what}")


def build_schedule(profile: LoadProfile, max_requests: int = MAX_REQUESTS) -> Schedule:
    """Every request of the run, from the profile and its seed. Same profile and seed -> same schedule, bit for bit.
    Refused before anything is drawn when it would hold more than ``max_requests`` (:func:`check_schedule_size`).

    ``meta``: ``profile`` (path), ``name``, ``seed``, ``duration_s``, ``warmup_s``, ``cooldown_s``, ``slos``
    (``{model: {"p99": 0.02}}``, seconds), ``inputs`` (per model: samples, seed, .npy files, shapes) and
    ``arrivals`` (the processes, described)."""
    check_schedule_size(profile, max_requests)
    seed, duration = profile.seed, profile.duration_s
    parts_t: list[np.ndarray] = []
    parts_m: list[list[str] | np.ndarray] = []
    parts_b: list[np.ndarray | None] = []
    names: list[str] = [m.name for m in profile.models]
    arrivals_meta: dict[str, Any] = {}

    shared = [m for m in profile.models if m.share is not None]
    if profile.arrival is not None:
        arrivals_meta["shared"] = profile.arrival.describe()
        if isinstance(profile.arrival, Trace):
            times, idx, trace_names, batch = profile.arrival.requests(
                [m.name for m in shared], [m.share for m in shared], _rng(seed, "trace"), duration)
            for n in trace_names:
                if n not in names:
                    names.append(n)
            parts_t.append(times)
            parts_m.append(np.asarray(trace_names, dtype=object)[idx] if len(idx) else np.empty(0, dtype=object))
            parts_b.append(batch)
        else:
            times = profile.arrival.times(duration, _rng(seed, "arrival"))
            weights = np.array([m.share for m in shared])
            pick = _rng(seed, "share").choice(len(shared), size=len(times), p=weights / weights.sum())
            parts_t.append(times)
            parts_m.append(np.asarray([m.name for m in shared], dtype=object)[pick])
            parts_b.append(None)
    for m in profile.models:
        if m.arrival is not None:
            arrivals_meta[m.name] = m.arrival.describe()
            times = m.arrival.times(duration, _rng(seed, "arrival", m.name))
            parts_t.append(times)
            parts_m.append(np.full(len(times), m.name, dtype=object))
            parts_b.append(None)

    times = np.concatenate(parts_t) if parts_t else np.empty(0)
    model_names = np.concatenate(parts_m) if parts_m else np.empty(0, dtype=object)
    trace_batch = np.concatenate([b if b is not None else np.zeros(len(t), dtype=np.int32)
                                  for b, t in zip(parts_b, parts_t)]) if parts_t else np.empty(0, dtype=np.int32)
    order = np.argsort(times, kind="stable")
    times, model_names, trace_batch = times[order], model_names[order], trace_batch[order]
    index = {n: k for k, n in enumerate(names)}
    model = np.array([index[n] for n in model_names], dtype=np.int32)

    sample = np.zeros(len(times), dtype=np.int32)
    batch = np.ones(len(times), dtype=np.int32)
    inputs_meta: dict[str, Any] = {}
    for name in names:
        load = profile.model(name) or ModelLoad(name)
        rows = np.flatnonzero(model == index[name])
        rng = _rng(seed, "requests", name)
        sample[rows] = rng.integers(0, load.samples, len(rows))
        sizes = np.array([b for b, _ in load.batch])
        weights = np.array([w for _, w in load.batch])
        batch[rows] = sizes[rng.choice(len(sizes), size=len(rows), p=weights / weights.sum())] \
            if len(sizes) > 1 else sizes[0]
        inputs_meta[name] = {"samples": load.samples, "seed": sample_seed(seed, name),
                             "files": dict(load.inputs), "shapes": {k: list(v) for k, v in load.shapes}}
    from_trace = trace_batch > 0
    batch[from_trace] = trace_batch[from_trace]

    meta = {
        "profile": profile.path, "name": profile.name, "seed": seed, "duration_s": duration,
        "warmup_s": profile.warmup_s, "cooldown_s": profile.cooldown_s,
        "slos": {m.name: dict(m.slo) for m in profile.models if m.slo},
        "inputs": inputs_meta, "arrivals": arrivals_meta,
    }
    return Schedule(times, model, tuple(names), sample, batch, meta)
