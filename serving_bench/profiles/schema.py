"""The profile: the simulator's only knowledge of hardware, as a small versioned JSON file.

A profile holds, per served entry and device, the measured solo service time of one executed batch per batch size
(samples or quantiles, seconds), how throughput scales when k batches share the device (the co-location curve S(k),
per model and optionally per model pair), the per-request client/network overhead, and facts about where it was
measured (host, device, framework, precision, execution mode eager / CUDA graphs).

Layout (``format: serving-bench-profile``, ``version: 1``; every time in seconds)::

    {"format": "serving-bench-profile", "version": 1, "source": "...", "created": "...",
     "host": {"hostname": ..., "cpu": ..., "cores": 2},
     "devices": {"cpu": {"kind": "cpu", "name": "...", "cores": 2, "max_instances": null, "memory_bytes": null}},
     "overhead": {"samples_s": [...]},                  # default per-request client/network overhead
     "ensemble_step_s": 0.0,                            # ensemble scheduler cost per step
     "models": {"sleep_python": {
         "framework": "python", "precision": "fp32", "overhead": {...}?, "dispatch": {...}?,
         "devices": {"cpu": {
             "execution_mode": "eager", "threads": 1, "memory_bytes": null, "per_request_s": 0.0,
             "batch_gap_s": 0.0,                    # instance busy after a batch, before it takes the next
             "idle": {"service": {"idle_s": [...], "extra_s": [...]},        # cold starts (IdleEffect)
                      "overhead": {"gap_s": [...], "extra_s": [...]}},
             "batches": {"1": {"samples_s": [...]}, "8": {"quantiles": {"q": [0, .5, .9, 1], "s": [...]}}},
             "colocation": [{"batch": 1, "k": [1, 2, 4], "speedup": [1.0, 1.9, 2.0]}]}}}},
     "pairs": [{"device": "cpu", "models": ["a", "b"], "batch": 1, "k": [2, 4], "speedup": [1.8, 2.0]}],
     "notes": ["..."]}

A distribution is ``{"samples_s": [...]}``, ``{"quantiles": {"q": [...], "s": [...]}}`` (q from 0 to 1) or
``{"constant_s": x}``; all become one quantile function (linear between points).

**Batch sizes between measured ones** (the documented rule): the service time of batch ``b`` with measured neighbours
``lo < b < hi`` is the comonotone linear interpolation of their quantile functions,
``Q_b(u) = Q_lo(u) + (b - lo) / (hi - lo) * (Q_hi(u) - Q_lo(u))``. Batch sizes below the smallest or above the largest
measured one are not extrapolated: a config that needs them is an input error naming the profile and field.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from serving_bench.errors import InputError
from serving_bench.files import atomic_write_text, read_json

PROFILE_FORMAT = "serving-bench-profile"
PROFILE_VERSION = 1
DEVICE_KINDS = ("cpu", "gpu")
EXECUTION_MODES = ("eager", "cuda_graphs", "compiled", "tensorrt", "n/a")


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
        """Q at ``points`` evenly spaced probabilities 0..1 (what the simulator samples from)."""
        return [self.quantile(i / (points - 1)) for i in range(points)]

    @property
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
        value = _number(data["constant_s"], source, f"{where}.constant_s")
        return Dist.constant(value)
    if "samples_s" in data:
        samples = data["samples_s"]
        if not isinstance(samples, list) or not samples:
            raise InputError(source, f"{where}.samples_s", "expected a non-empty list of seconds")
        return Dist.from_samples(_number(x, source, f"{where}.samples_s") for x in samples)
    if "quantiles" in data:
        qd = data["quantiles"]
        if not isinstance(qd, Mapping) or not isinstance(qd.get("q"), list) or not isinstance(qd.get("s"), list):
            raise InputError(source, f"{where}.quantiles", "expected {\"q\": [...], \"s\": [...]}")
        q = [_number(x, source, f"{where}.quantiles.q") for x in qd["q"]]
        s = [_number(x, source, f"{where}.quantiles.s") for x in qd["s"]]
        if len(q) != len(s) or len(q) < 2 or q[0] != 0.0 or q[-1] != 1.0 or any(b <= a for a, b in zip(q, q[1:])):
            raise InputError(source, f"{where}.quantiles.q", "expected strictly increasing probabilities from 0 to 1, "
                             "as many as values in s")
        if any(b < a for a, b in zip(s, s[1:])):
            raise InputError(source, f"{where}.quantiles.s", "expected non-decreasing seconds")
        return Dist(tuple(q), tuple(s))
    raise InputError(source, where, "expected one of samples_s, quantiles, constant_s")


def _number(value: Any, source: str, where: str, *, minimum: float = 0.0) -> float:
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
    k = [_number(x, source, f"{where}.k", minimum=1.0) for x in ks]
    s = [_number(x, source, f"{where}.speedup") for x in ss]
    if any(b <= a for a, b in zip(k, k[1:])):
        raise InputError(source, f"{where}.k", "expected strictly increasing instance counts")
    if any(v <= 0 for v in s):
        raise InputError(source, f"{where}.speedup", "expected positive speed-ups")
    if k[0] != 1.0:
        k, s = [1.0] + k, [1.0] + s
    return Curve(batch, tuple(k), tuple(s))


@dataclass(frozen=True)
class DeviceInfo:
    """A device of the profiled machine: ``kind`` cpu or gpu, ``cores`` for CPUs, optional capacity limits."""

    name: str
    kind: str
    model: str = ""
    cores: int | None = None
    max_instances: int | None = None
    memory_bytes: int | None = None

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.model, "cores": self.cores, "max_instances": self.max_instances,
                "memory_bytes": self.memory_bytes}


@dataclass(frozen=True)
class IdleEffect:
    """How much slower work is after idle time (a *cold* start: runtime threads parked, caches and clocks cold).

    An executed batch that starts after its instance sat idle ``service_idle_s[i]`` seconds takes
    ``service_extra_s[i]`` longer than back-to-back ("hot"); a request that reaches the server
    ``overhead_gap_s[i]`` seconds after the previous request (any model) has an overhead ``overhead_extra_s[i]``
    longer than the hot one, and its dispatch inside the server ``dispatch_extra_s[i]`` longer (empty: 0). All linear
    between points; the first and last values hold outside."""

    service_idle_s: tuple[float, ...]
    service_extra_s: tuple[float, ...]
    overhead_gap_s: tuple[float, ...]
    overhead_extra_s: tuple[float, ...]
    dispatch_extra_s: tuple[float, ...] = ()

    def service_extra(self, idle: float) -> float:
        return _interp(idle, self.service_idle_s, self.service_extra_s)

    def overhead_extra(self, gap: float) -> float:
        return _interp(gap, self.overhead_gap_s, self.overhead_extra_s)

    def to_json(self) -> dict:
        out = {"service": {"idle_s": list(self.service_idle_s), "extra_s": list(self.service_extra_s)},
               "overhead": {"gap_s": list(self.overhead_gap_s), "extra_s": list(self.overhead_extra_s)}}
        if self.dispatch_extra_s:
            out["overhead"]["dispatch_extra_s"] = list(self.dispatch_extra_s)
        return out


def _interp(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
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
        xs = tuple(_number(v, source, f"{where}.{part}.{axis}") for v in xs)
        ys = tuple(_number(v, source, f"{where}.{part}.extra_s") for v in ys)
        if any(b <= a for a, b in zip(xs, xs[1:])):
            raise InputError(source, f"{where}.{part}.{axis}", "expected strictly increasing seconds")
        parts += [xs, ys]
    dispatch = (data.get("overhead") or {}).get("dispatch_extra_s")
    if dispatch is not None:
        if not isinstance(dispatch, list) or len(dispatch) != len(parts[2]):
            raise InputError(source, f"{where}.overhead.dispatch_extra_s", "expected a list as long as gap_s")
        parts.append(tuple(_number(v, source, f"{where}.overhead.dispatch_extra_s") for v in dispatch))
    return IdleEffect(*parts)


@dataclass(frozen=True)
class ModelOnDevice:
    """One entry measured on one device: service-time distribution per measured batch size and sharing curves."""

    execution_mode: str
    batches: Mapping[int, Dist]
    colocation: tuple[Curve, ...] = ()
    threads: int = 1
    per_request_s: float = 0.0
    memory_bytes: int | None = None
    batch_gap_s: float = 0.0
    idle: IdleEffect | None = None

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.batches))

    def service(self, batch: int) -> Dist:
        """Service-time distribution of an executed batch of ``batch`` items (the interpolation rule above)."""
        sizes = self.batch_sizes
        if batch in self.batches:
            return self.batches[batch]
        if batch < sizes[0] or batch > sizes[-1]:
            raise KeyError(batch)
        hi = sizes[bisect.bisect_left(sizes, batch)]
        lo = sizes[bisect.bisect_left(sizes, batch) - 1]
        a, b = self.batches[lo], self.batches[hi]
        qs = sorted(set(a.q) | set(b.q))
        w = (batch - lo) / (hi - lo)
        return Dist(tuple(qs), tuple(a.quantile(u) + w * (b.quantile(u) - a.quantile(u)) for u in qs))

    def to_json(self) -> dict:
        out = {"execution_mode": self.execution_mode, "threads": self.threads, "memory_bytes": self.memory_bytes,
               "per_request_s": self.per_request_s, "batch_gap_s": self.batch_gap_s,
               "batches": {str(b): self.batches[b].to_json() for b in self.batch_sizes},
               "colocation": [c.to_json() for c in self.colocation]}
        if self.idle is not None:
            out["idle"] = self.idle.to_json()
        return out


@dataclass(frozen=True)
class ModelProfile:
    """One served entry (``<model>_<framework>`` or ``sleep_python``) across the devices it was measured on."""

    name: str
    framework: str
    precision: str
    devices: Mapping[str, ModelOnDevice]
    overhead: Dist | None = None
    dispatch: Dist | None = None  # time inside the server before the batcher has the request (thread hand-offs)

    def to_json(self) -> dict:
        out = {"framework": self.framework, "precision": self.precision,
               "devices": {d: self.devices[d].to_json() for d in sorted(self.devices)}}
        if self.overhead is not None:
            out["overhead"] = self.overhead.to_json()
        if self.dispatch is not None:
            out["dispatch"] = self.dispatch.to_json()
        return out


@dataclass(frozen=True)
class PairCurve:
    """Co-location curve measured with two models sharing ``device`` (k batches in all, half of each)."""

    device: str
    models: tuple[str, str]
    curve: Curve

    def to_json(self) -> dict:
        out = self.curve.to_json()
        out.update(device=self.device, models=list(self.models))
        return out


@dataclass(frozen=True)
class Profile:
    """A whole profile; see the module docstring for the file layout and the batch-size rule."""

    devices: Mapping[str, DeviceInfo]
    models: Mapping[str, ModelProfile]
    overhead: Dist = field(default_factory=lambda: Dist.constant(0.0))
    pairs: tuple[PairCurve, ...] = ()
    host: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    created: str = ""
    ensemble_step_s: float = 0.0
    notes: tuple[str, ...] = ()
    path: str | None = None  # where it was loaded from (for error messages); not saved

    # -- queries -----------------------------------------------------------------------------------------------------
    def model(self, name: str, device: str | None = None) -> ModelProfile:
        if name not in self.models:
            raise InputError(self.path or "profile", f"models.{name}",
                             f"the profile has no model {name!r}; it has: {', '.join(sorted(self.models)) or 'none'}")
        return self.models[name]

    def on_device(self, name: str, device: str) -> ModelOnDevice:
        """The measurements of ``name`` on ``device``; an :class:`InputError` naming the field if missing."""
        model = self.model(name)
        if device not in self.devices:
            raise InputError(self.path or "profile", "devices",
                             f"the profile has no device {device!r}; it has: {', '.join(sorted(self.devices))}")
        if device not in model.devices:
            raise InputError(self.path or "profile", f"models.{name}.devices",
                             f"no measurements of {name!r} on device {device!r}; measured on: "
                             f"{', '.join(sorted(model.devices)) or 'none'}")
        return model.devices[device]

    def overhead_for(self, name: str) -> Dist:
        model = self.models.get(name)
        return model.overhead if model is not None and model.overhead is not None else self.overhead

    def pair(self, device: str, a: str, b: str) -> PairCurve | None:
        for pair in self.pairs:
            if pair.device == device and set(pair.models) == {a, b}:
                return pair
        return None

    # -- I/O ---------------------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "source": self.source, "created": self.created,
                "host": dict(self.host), "notes": list(self.notes), "ensemble_step_s": self.ensemble_step_s,
                "devices": {n: self.devices[n].to_json() for n in sorted(self.devices)},
                "overhead": self.overhead.to_json(),
                "models": {n: self.models[n].to_json() for n in sorted(self.models)},
                "pairs": [p.to_json() for p in self.pairs]}

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON atomically (temporary name, then rename)."""
        return atomic_write_text(path, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        """Read and validate a profile; any problem is an :class:`InputError` naming the file and field."""
        path = Path(path)
        return cls.from_json(read_json(path, "profile"), str(path))

    @classmethod
    def from_json(cls, data: Any, source: str = "profile") -> "Profile":
        if not isinstance(data, Mapping) or data.get("format") != PROFILE_FORMAT:
            raise InputError(source, "format", f"expected \"{PROFILE_FORMAT}\" (a serving-bench profile)")
        if data.get("version") != PROFILE_VERSION:
            raise InputError(source, "version", f"expected {PROFILE_VERSION}, got {data.get('version')!r}")
        devices_data = data.get("devices")
        if not isinstance(devices_data, Mapping) or not devices_data:
            raise InputError(source, "devices", "expected a non-empty object of devices (e.g. \"cpu\", \"gpu0\")")
        devices = {}
        for name, d in devices_data.items():
            where = f"devices.{name}"
            if not isinstance(d, Mapping) or d.get("kind") not in DEVICE_KINDS:
                raise InputError(source, f"{where}.kind", f"expected one of {', '.join(DEVICE_KINDS)}")
            ints = {}
            for key in ("cores", "max_instances", "memory_bytes"):
                value = d.get(key)
                if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                    raise InputError(source, f"{where}.{key}", f"expected a positive integer or null, got {value!r}")
                ints[key] = value
            if d["kind"] == "cpu" and ints["cores"] is None:
                raise InputError(source, f"{where}.cores", "a cpu device needs its core count")
            devices[name] = DeviceInfo(name, d["kind"], str(d.get("name", "")), **ints)

        models_data = data.get("models")
        if not isinstance(models_data, Mapping) or not models_data:
            raise InputError(source, "models", "expected a non-empty object of models")
        models = {}
        for name, m in models_data.items():
            where = f"models.{name}"
            if not isinstance(m, Mapping) or not isinstance(m.get("devices"), Mapping) or not m["devices"]:
                raise InputError(source, f"{where}.devices", "expected an object device -> measurements")
            per_device = {}
            for dev, md in m["devices"].items():
                dwhere = f"{where}.devices.{dev}"
                if dev not in devices:
                    raise InputError(source, dwhere, f"device {dev!r} is not listed under devices")
                if not isinstance(md, Mapping) or not isinstance(md.get("batches"), Mapping) or not md["batches"]:
                    raise InputError(source, f"{dwhere}.batches", "expected an object batch size -> distribution")
                batches = {}
                for key, dist in md["batches"].items():
                    if not str(key).isdigit() or int(key) < 1:
                        raise InputError(source, f"{dwhere}.batches.{key}", "expected batch sizes >= 1 as keys")
                    batches[int(key)] = parse_dist(dist, source, f"{dwhere}.batches.{key}")
                mode = md.get("execution_mode", "n/a")
                if mode not in EXECUTION_MODES:
                    raise InputError(source, f"{dwhere}.execution_mode", f"expected one of {', '.join(EXECUTION_MODES)}")
                colocation = md.get("colocation") or []
                if not isinstance(colocation, list):
                    raise InputError(source, f"{dwhere}.colocation", "expected a list of curves")
                curves = tuple(sorted((parse_curve(c, source, f"{dwhere}.colocation[{i}]")
                                       for i, c in enumerate(colocation)), key=lambda c: c.batch))
                threads = md.get("threads", 1)
                if not isinstance(threads, int) or threads < 1:
                    raise InputError(source, f"{dwhere}.threads", "expected a thread count >= 1")
                memory = md.get("memory_bytes")
                if memory is not None and (not isinstance(memory, int) or memory < 0):
                    raise InputError(source, f"{dwhere}.memory_bytes", "expected bytes >= 0 or null")
                per_device[dev] = ModelOnDevice(mode, batches, curves, threads,
                                                _number(md.get("per_request_s", 0.0), source, f"{dwhere}.per_request_s"),
                                                memory,
                                                _number(md.get("batch_gap_s", 0.0), source, f"{dwhere}.batch_gap_s"),
                                                parse_idle(md["idle"], source, f"{dwhere}.idle")
                                                if md.get("idle") is not None else None)
            overhead = parse_dist(m["overhead"], source, f"{where}.overhead") if m.get("overhead") is not None else None
            dispatch = parse_dist(m["dispatch"], source, f"{where}.dispatch") if m.get("dispatch") is not None else None
            models[name] = ModelProfile(name, str(m.get("framework", "")), str(m.get("precision", "")), per_device,
                                        overhead, dispatch)

        pairs = []
        for i, p in enumerate(data.get("pairs") or []):
            where = f"pairs[{i}]"
            if not isinstance(p, Mapping) or p.get("device") not in devices:
                raise InputError(source, f"{where}.device", "expected a device listed under devices")
            names = p.get("models")
            if not isinstance(names, list) or len(names) != 2 or any(n not in models for n in names):
                raise InputError(source, f"{where}.models", "expected two model names listed under models")
            pairs.append(PairCurve(p["device"], (names[0], names[1]), parse_curve(p, source, where)))
        overhead = parse_dist(data["overhead"], source, "overhead") if data.get("overhead") is not None \
            else Dist.constant(0.0)
        host = data.get("host") or {}
        if not isinstance(host, Mapping):
            raise InputError(source, "host", "expected an object")
        notes = data.get("notes") or []
        return cls(devices, models, overhead, tuple(pairs), dict(host), str(data.get("source", "")),
                   str(data.get("created", "")), _number(data.get("ensemble_step_s", 0.0), source, "ensemble_step_s"),
                   tuple(str(n) for n in notes), source)
