"""The profile: the simulator's only knowledge of hardware, as a small versioned JSON file.

A profile holds, per served entry and device, the measured solo service time of one executed batch per batch size
(samples or quantiles, seconds), how throughput scales when k batches share the device (the co-location curve S(k),
per model and optionally per model pair), the per-request client/network overhead, and facts about where it was
measured (host, device, framework, precision, execution mode eager / CUDA graphs).

Layout (``format: serving-bench-profile``, ``version: 1``; every time in seconds)::

    {"format": "serving-bench-profile", "version": 1, "source": "...", "created": "...",
     "host": {"hostname": ..., "cpu": ..., "cores": 2, "sender": "native"},  # sender: the load driver's that measured
     "devices": {"cpu": {"kind": "cpu", "name": "...", "cores": 2, "max_instances": null, "memory_bytes": null,
                         "law": {"name": "pool_eff", "eta": 0.9}}},   # optional: how the device is shared
     "request_device": "cpu",                           # optional: where requests are handled (the host's cores)
     "overhead": {"samples_s": [...]},                  # default per-request client/network overhead
     "ensemble_step_s": 0.0,                            # ensemble scheduler cost per step
     "models": {"sleep_python": {
         "framework": "python", "precision": "fp32", "overhead": {...}?, "dispatch": {...}?,
         "request_demand": 0.9,                     # optional: host cores a request keeps busy on its way in and out
         "drift": {"in_service": 0.48, "in_out": 0.5, "service_out": 0.42,   # optional, simulated if the law says:
                   "service_by_lag_ms": {"0.5": 0.57, "5": 0.24, "50": 0.02}},  # estimators.phase_drift
         "devices": {"cpu": {
             "execution_mode": "eager", "threads": 1, "memory_bytes": null, "per_request_s": 0.0,
             "batch_gap_s": 0.0,                    # instance busy after a batch, before it takes the next
             "padded_sizes": [1, 4, 8],             # optional: a batch runs padded to the next of these sizes
             "demand": {"1": 0.97, "8": 0.99},      # optional: cores (GPU fraction) the runtime keeps busy, solo
             "hop_s": 0.0002,                       # optional: Triton's compute time outside the runtime (mean)
             "handoff_cpu_s": 0.0005,               # optional: host CPU per batch outside the runtime
             "pickup_s": 0.00005,                   # optional: an idle instance taking up a payload
             "other_threads": {"2": {"batches": {...}, "demand": {...}}},  # optional: solo batches at 2 threads
             "colocation_threads": 2,               # optional: the curves' threads per instance (default threads)
             "idle": {"service": {"idle_s": [...], "extra_s": [...], "memory": 0.125},  # cold starts (IdleEffect)
                      "overhead": {"gap_s": [...], "extra_s": [...]}},
             "batches": {"1": {"samples_s": [...]}, "8": {"quantiles": {"q": [0, .5, .9, 1], "s": [...]}}},
             "colocation": [{"batch": 1, "k": [1, 2, 4], "speedup": [1.0, 1.9, 2.0]}]}}}},
     "pairs": [{"device": "cpu", "models": ["a", "b"], "batch": 1, "k": [2, 4], "speedup": [1.8, 2.0]}],
     "calibration": [{"device": "cpu", "clients": {...}, "measured_rps": {...}, "serving": {...}}],  # optional
     "ensembles": {"tiny_ensemble": {"gap_s": [...], "extra_s": [...], "extra_p90_s": [...]}},  # optional
     "notes": ["..."]}

Distributions, curves, the cold-start effect and an ensemble's own time beyond its members' (``ensembles``:
:class:`~serving_bench.profiles.distributions.EnsembleExtra`) are in :mod:`serving_bench.profiles.distributions`.

**Demand and sharing** (optional; see :mod:`serving_bench.sim.device` for the rule): ``demand`` per measured batch
size is the runtime's CPU seconds over its wall seconds in the solo batches (linear between measured sizes, the
nearest outside), ``hop_s`` the part of a batch's time on the instance spent outside the runtime (the hand-over to
the python-backend stub and back); ``request_demand`` is the same ratio for everything a request costs outside the
runtime — its way in and out and the hop (client, Triton's threads, the stubs) — on ``request_device``. Where the
profile split that cost (``handoff_cpu_s`` measured), ``request_demand`` is only the part each request costs and
``handoff_cpu_s`` the host CPU seconds each executed batch costs outside the runtime, however many requests it holds
(the hand-offs between Triton and the stub); ``pickup_s`` is how long an idle instance takes to take up a payload
(its thread waking up), while which the payload still grows. A device's
``law`` names the sharing law and its fitted parameters (default: processor sharing over its cores, or over one GPU;
``psi`` scales the hand-off demands; ``wait_p`` and ``wait_s``, on the request device, are the probability and mean
wait of a request's way in or out that has to wait for a core: :class:`serving_bench.sim.spec.CoreWait` (with
``wait_instances``, ``wait_p_fewer`` and ``wait_instances_fewer`` the probability at two counts of the host's model
instances in all: :func:`serving_bench.sim.spec.wait_chance`); ``drift``,
on the request device, in (0, 1], has the phases follow the host's speed with that share of the loadings the models'
``drift`` figures give: :mod:`serving_bench.sim.drift`; ``queue``, a run queue for the instances' take-ups:
:class:`serving_bench.sim.device.Law`).

**Padding** (``padded_sizes``, empty by default): runtimes that run fixed sizes only (CUDA graphs per captured batch
size, TVM's tuned static buckets) pad a batch of ``b`` rows to the smallest of these sizes ``>= b`` and take that
size's time; a batch larger than all of them runs unpadded (the CUDA-graph runner runs it eagerly). The profile
must hold the service time of every size a batch runs at.

**Threads per instance** (``threads``; ``other_threads``, optional): the runtime threads each instance had when its
batches were measured, and the solo batches (and demands) measured at other counts. An instance of another count
runs at that count's table; between two measured counts ``lo < t < hi`` each batch size's quantile function is
linear in ``1 / t`` (Amdahl's law: a serial part, and a part split over the threads),
``Q_t(u) = Q_lo(u) + w (Q_hi(u) - Q_lo(u))`` with ``w = (1/lo - 1/t) / (1/lo - 1/hi)``, and its demand linear in
``t``; outside the measured counts the nearest one's table (never extrapolated). The co-location curves apply only
at the count they were measured at (``colocation_threads``, default ``threads``; :meth:`ModelOnDevice.for_threads`).

**Batch sizes between measured ones** (the documented rule): the service time of batch ``b`` with measured neighbours
``lo < b < hi`` is the comonotone linear interpolation of their quantile functions,
``Q_b(u) = Q_lo(u) + (b - lo) / (hi - lo) * (Q_hi(u) - Q_lo(u))``. Batch sizes below the smallest or above the largest
measured one are not extrapolated: a config that needs them is an input error naming the profile and field.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from serving_bench.errors import InputError
from serving_bench.files import atomic_write_text, read_json
from serving_bench.profiles.distributions import (Curve, Dist, EnsembleExtra, IdleEffect, interp, number, parse_curve,
                                                  parse_dist, parse_ensemble_extra, parse_idle)

PROFILE_FORMAT = "serving-bench-profile"
PROFILE_VERSION = 1
DEVICE_KINDS = ("cpu", "gpu")
EXECUTION_MODES = ("eager", "cuda_graphs", "compiled", "tensorrt", "n/a")


LAW_PARAMETERS = {"pool": (), "pool_eff": ("eta",), "soft": ("eta", "power"), "none": (), "serial": ()}
# the hand-off share; waiting for a core (sim.spec.CoreWait); following the host's speed (sim/drift.py); a run queue
# for the instances' take-ups (sim.device.Law)
OPTIONAL_LAW_PARAMETERS = ("psi", "wait_p", "wait_s", "wait_quiet_s", "wait_quiet_memory", "wait_instances",
                           "wait_p_fewer", "wait_instances_fewer", "wait_s_quiet", "wait_gap_s", "wait_gap_quiet_s",
                           "drift", "queue")
WAIT_BY_INSTANCES = ("wait_instances", "wait_p_fewer", "wait_instances_fewer")  # the chance at two instance counts
WAIT_BY_QUIET = ("wait_gap_s", "wait_gap_quiet_s", "wait_s_quiet")  # the length at two quiet times


DRIFT_CORRELATIONS = ("in_service", "in_out", "service_out")


def parse_drift(data: Any, source: str, where: str) -> dict:
    """A model's ``drift`` (:func:`~serving_bench.calibrate.estimators.phase_drift`): correlations between -1 and 1
    named :data:`DRIFT_CORRELATIONS`, and ``service_by_lag_ms``, an object milliseconds -> correlation."""
    def correlation(value: Any, at: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -1.0 <= value <= 1.0:
            raise InputError(source, at, f"expected a correlation between -1 and 1, got {value!r}")
        return float(value)

    if not isinstance(data, dict):
        raise InputError(source, where, "expected an object of correlations")
    out: dict = {k: correlation(data[k], f"{where}.{k}") for k in DRIFT_CORRELATIONS if k in data}
    lags = data.get("service_by_lag_ms", {})
    if not isinstance(lags, dict):
        raise InputError(source, f"{where}.service_by_lag_ms", "expected an object milliseconds -> correlation")
    for k in lags:
        try:
            valid = float(k) >= 0.0
        except ValueError:
            valid = False
        if not valid:
            raise InputError(source, f"{where}.service_by_lag_ms", f"expected milliseconds >= 0 as keys, got {k!r}")
    out["service_by_lag_ms"] = {k: correlation(v, f"{where}.service_by_lag_ms.{k}") for k, v in lags.items()}
    return out


def parse_law(data: Any, source: str, where: str) -> dict | None:
    """A device's sharing law: ``{"name": "pool" | "pool_eff" | "soft" | "none" | "serial", "eta": ..., "power": ...,
    "psi": ..., "wait_p": ..., "wait_s": ...}`` (None: pool; ``psi``, optional with every law, scales the hand-off
    demands; ``wait_p`` (at most 1), ``wait_s``, ``wait_quiet_s`` and ``wait_quiet_memory`` (at most 1), optional,
    are the wait for a core — ``wait_p`` with ``wait_instances`` instances in all on the host and ``wait_p_fewer``
    with ``wait_instances_fewer`` (fewer; all three or none), its length ``wait_s`` up to a recent quiet of
    ``wait_gap_s`` and ``wait_s_quiet`` from ``wait_gap_quiet_s`` (more; all three or none); ``drift`` (at most 1),
    optional, the share of the measured drift the phases follow; ``queue``, optional, the run queue's gate as a share
    of the law's effective cores: :class:`serving_bench.sim.device.Law`)."""
    if data is None:
        return None
    if not isinstance(data, Mapping) or data.get("name") not in LAW_PARAMETERS:
        raise InputError(source, f"{where}.name", f"expected one of {', '.join(LAW_PARAMETERS)}")
    out: dict[str, Any] = {"name": data["name"]}
    for key in LAW_PARAMETERS[data["name"]] + tuple(k for k in OPTIONAL_LAW_PARAMETERS if k in data):
        if key not in data:
            raise InputError(source, f"{where}.{key}", f"missing; the {data['name']} law needs it")
        out[key] = number(data[key], source, f"{where}.{key}")
        if out[key] <= 0:
            raise InputError(source, f"{where}.{key}", "expected a number > 0")
        if key in ("wait_p", "wait_p_fewer", "wait_quiet_memory", "drift") and out[key] > 1:
            raise InputError(source, f"{where}.{key}", "expected a probability in (0, 1]"
                             if key.startswith("wait_p") else "expected a number in (0, 1]")
    for group, (low, high) in ((WAIT_BY_INSTANCES, ("wait_instances_fewer", "wait_instances")),
                               (WAIT_BY_QUIET, ("wait_gap_s", "wait_gap_quiet_s"))):
        given = [k for k in group if k in out]
        if given and len(given) < len(group):
            missing = next(k for k in group if k not in out)
            raise InputError(source, f"{where}.{missing}", f"missing; {given[0]} needs it")
        if given and out[low] >= out[high]:
            raise InputError(source, f"{where}.{low}", f"expected less than {high}")
    return out


def _batch_key(key: Any, source: str, where: str) -> int:
    if not str(key).isdigit() or int(key) < 1:
        raise InputError(source, where, "expected batch sizes >= 1 as keys")
    return int(key)


def _batches_and_demand(data: Any, source: str, where: str) -> tuple[dict[int, Dist], dict[int, float]]:
    """``batches`` (batch size -> distribution, at least one) and ``demand`` (batch size -> cores, optional) of a
    model's measurements on a device (or of one of its ``other_threads``)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("batches"), Mapping) or not data["batches"]:
        raise InputError(source, f"{where}.batches", "expected an object batch size -> distribution")
    batches = {_batch_key(k, source, f"{where}.batches.{k}"): parse_dist(dist, source, f"{where}.batches.{k}")
               for k, dist in data["batches"].items()}
    demand = data.get("demand") or {}
    if not isinstance(demand, Mapping):
        raise InputError(source, f"{where}.demand", "expected an object batch size -> cores")
    return batches, {_batch_key(k, source, f"{where}.demand.{k}"): number(v, source, f"{where}.demand.{k}")
                     for k, v in demand.items()}



@dataclass(frozen=True)
class DeviceInfo:
    """A device of the profiled machine: ``kind`` cpu or gpu, ``cores`` for CPUs, optional capacity limits."""

    name: str
    kind: str
    model: str = ""
    cores: int | None = None
    max_instances: int | None = None
    memory_bytes: int | None = None
    law: Mapping[str, Any] | None = None  # {"name": ..., params}: see serving_bench.sim.device.Law

    @property
    def capacity(self) -> float:
        """What a law shares: the cores of a CPU, one GPU."""
        return float(self.cores or 1) if self.kind == "cpu" else 1.0

    def to_json(self) -> dict:
        out = {"kind": self.kind, "name": self.model, "cores": self.cores, "max_instances": self.max_instances,
               "memory_bytes": self.memory_bytes}
        if self.law is not None:
            out["law"] = dict(self.law)
        return out



@dataclass(frozen=True)
class ThreadTable:
    """An entry's solo batches at another count of runtime threads per instance than its ``threads``: the service
    time and (optional) demand per measured batch size, as :class:`ModelOnDevice` holds them."""

    batches: Mapping[int, Dist]
    demand: Mapping[int, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        out: dict = {"batches": {str(b): self.batches[b].to_json() for b in sorted(self.batches)}}
        if self.demand:
            out["demand"] = {str(b): self.demand[b] for b in sorted(self.demand)}
        return out


def _mix(a: Dist, b: Dist, w: float) -> Dist:
    """The comonotone mix of two distributions: ``Q(u) = Q_a(u) + w (Q_b(u) - Q_a(u))`` (``w`` in [0, 1])."""
    qs = sorted(set(a.q) | set(b.q))
    return Dist(tuple(qs), tuple(a.quantile(u) + w * (b.quantile(u) - a.quantile(u)) for u in qs))


@dataclass(frozen=True)
class ModelOnDevice:
    """One entry measured on one device: service-time distribution per measured batch size and sharing curves, at
    ``threads`` runtime threads per instance (``other_threads``: the solo batches at other counts)."""

    execution_mode: str
    batches: Mapping[int, Dist]
    colocation: tuple[Curve, ...] = ()
    threads: int = 1
    per_request_s: float = 0.0
    memory_bytes: int | None = None
    batch_gap_s: float = 0.0
    idle: IdleEffect | None = None
    padded_sizes: tuple[int, ...] = ()
    demand: Mapping[int, float] = field(default_factory=dict)
    hop_s: float = 0.0
    handoff_cpu_s: float = 0.0  # host CPU per batch outside the runtime (0: not measured, the hop's demand rule)
    pickup_s: float = 0.0  # an idle instance taking up a payload (0: at once)
    other_threads: Mapping[int, ThreadTable] = field(default_factory=dict)
    colocation_threads: int = 0  # the threads per instance the curves were measured at (0: ``threads``)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.batches))

    def demand_at(self, batch: int) -> float | None:
        """Measured demand of a batch of ``batch`` items (linear between measured sizes, the nearest outside); None
        when none was measured."""
        if not self.demand:
            return None
        sizes = sorted(self.demand)
        return interp(float(batch), tuple(float(b) for b in sizes), tuple(self.demand[b] for b in sizes))

    def executed_size(self, batch: int) -> int:
        """The size a batch of ``batch`` rows runs at: the smallest padded size that holds it, else its own."""
        i = bisect.bisect_left(self.padded_sizes, batch)
        return self.padded_sizes[i] if i < len(self.padded_sizes) else batch

    def service(self, batch: int) -> Dist:
        """Service-time distribution of an executed batch of ``batch`` items (the interpolation rule above)."""
        sizes = self.batch_sizes
        if batch in self.batches:
            return self.batches[batch]
        if batch < sizes[0] or batch > sizes[-1]:
            raise KeyError(batch)
        interpolated = self.__dict__.setdefault("_interpolated", {})  # derived once per size, not a field
        if batch not in interpolated:
            hi = sizes[bisect.bisect_left(sizes, batch)]
            lo = sizes[bisect.bisect_left(sizes, batch) - 1]
            interpolated[batch] = _mix(self.batches[lo], self.batches[hi], (batch - lo) / (hi - lo))
        return interpolated[batch]

    def for_threads(self, threads: int) -> "ModelOnDevice":
        """The entry as an instance of ``threads`` runtime threads runs it (the thread-count rule in the module
        docstring); itself where that is its own count and its curves' too. Derived once per count (the tuner asks
        for every configuration it simulates)."""
        derived = self.__dict__.setdefault("_for_threads", {})  # derived data of a frozen value, not a field
        if threads not in derived:
            derived[threads] = self._at_threads(threads)
        return derived[threads]

    def _at_threads(self, threads: int) -> "ModelOnDevice":
        tables = {self.threads: ThreadTable(self.batches, self.demand), **self.other_threads}
        counts = sorted(tables)
        if threads in tables or not counts[0] < threads < counts[-1]:
            threads = min(counts, key=lambda c: (abs(c - threads), c))
            batches, demand = tables[threads].batches, tables[threads].demand
        else:
            hi = counts[bisect.bisect_left(counts, threads)]
            lo = counts[bisect.bisect_left(counts, threads) - 1]
            a, b = tables[lo], tables[hi]
            w = (1 / lo - 1 / threads) / (1 / lo - 1 / hi)  # linear in 1 / threads: Amdahl's law
            batches = {n: _mix(a.batches[n], b.batches[n], w) for n in sorted(set(a.batches) & set(b.batches))}
            v = (threads - lo) / (hi - lo)
            demand = {n: a.demand[n] + v * (b.demand[n] - a.demand[n]) for n in sorted(set(a.demand) & set(b.demand))}
        colocation = self.colocation if threads == (self.colocation_threads or self.threads) else ()
        if threads == self.threads and colocation == self.colocation:
            return self
        return replace(self, batches=batches, demand=demand, threads=threads, colocation=colocation,
                       colocation_threads=0, other_threads={})

    def to_json(self) -> dict:
        out = {"execution_mode": self.execution_mode, "threads": self.threads, "memory_bytes": self.memory_bytes,
               "per_request_s": self.per_request_s, "batch_gap_s": self.batch_gap_s,
               **ThreadTable(self.batches, self.demand).to_json(),
               "colocation": [c.to_json() for c in self.colocation]}
        if self.idle is not None:
            out["idle"] = self.idle.to_json()
        if self.padded_sizes:
            out["padded_sizes"] = list(self.padded_sizes)
        if self.hop_s:
            out["hop_s"] = self.hop_s
        if self.handoff_cpu_s:
            out["handoff_cpu_s"] = self.handoff_cpu_s
        if self.pickup_s:
            out["pickup_s"] = self.pickup_s
        if self.colocation_threads and self.colocation_threads != self.threads:
            out["colocation_threads"] = self.colocation_threads
        if self.other_threads:
            out["other_threads"] = {str(t): self.other_threads[t].to_json() for t in sorted(self.other_threads)}
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
    request_demand: float | None = None  # host cores a request keeps busy on its way in and out
    drift: Mapping | None = None  # how the host's speed moves its phases together (estimators.phase_drift)

    def to_json(self) -> dict:
        out = {"framework": self.framework, "precision": self.precision,
               "devices": {d: self.devices[d].to_json() for d in sorted(self.devices)}}
        if self.overhead is not None:
            out["overhead"] = self.overhead.to_json()
        if self.dispatch is not None:
            out["dispatch"] = self.dispatch.to_json()
        if self.request_demand is not None:
            out["request_demand"] = self.request_demand
        if self.drift is not None:
            out["drift"] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in self.drift.items()}
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
    request_device: str | None = None  # the CPU device requests are handled on (None: not modelled)
    calibration: tuple[Mapping[str, Any], ...] = ()  # the co-located runs the devices' laws were fitted to
    ensembles: Mapping[str, EnsembleExtra] = field(default_factory=dict)  # per ensemble: its time beyond its members'
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
        out = {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "source": self.source, "created": self.created,
               "host": dict(self.host), "notes": list(self.notes), "ensemble_step_s": self.ensemble_step_s,
               "devices": {n: self.devices[n].to_json() for n in sorted(self.devices)},
               "overhead": self.overhead.to_json(),
               "models": {n: self.models[n].to_json() for n in sorted(self.models)},
               "pairs": [p.to_json() for p in self.pairs]}
        if self.request_device is not None:
            out["request_device"] = self.request_device
        if self.calibration:
            out["calibration"] = [dict(c) for c in self.calibration]
        if self.ensembles:
            out["ensembles"] = {n: self.ensembles[n].to_json() for n in sorted(self.ensembles)}
        return out

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
            law = parse_law(d.get("law"), source, f"{where}.law")
            if law and law["name"] == "serial" and d["kind"] != "gpu":
                raise InputError(source, f"{where}.law.name", "the serial law is for a gpu device")
            devices[name] = DeviceInfo(name, d["kind"], str(d.get("name", "")), **ints, law=law)

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
                batches, demand = _batches_and_demand(md, source, dwhere)
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
                padded = md.get("padded_sizes") or []
                if not isinstance(padded, list) or any(not isinstance(b, int) or isinstance(b, bool) or b < 1
                                                       for b in padded) or any(b <= a for a, b in zip(padded, padded[1:])):
                    raise InputError(source, f"{dwhere}.padded_sizes", "expected strictly increasing batch sizes >= 1")
                other = md.get("other_threads") or {}
                if not isinstance(other, Mapping):
                    raise InputError(source, f"{dwhere}.other_threads", "expected an object thread count -> batches")
                other_threads = {}
                for key, table in other.items():
                    twhere = f"{dwhere}.other_threads.{key}"
                    if not str(key).isdigit() or int(key) < 1 or int(key) == threads:
                        raise InputError(source, twhere, f"expected a thread count >= 1 other than threads ({threads})")
                    other_threads[int(key)] = ThreadTable(*_batches_and_demand(table, source, twhere))
                curve_threads = md.get("colocation_threads", 0)
                if isinstance(curve_threads, bool) or not isinstance(curve_threads, int) or curve_threads < 0:
                    raise InputError(source, f"{dwhere}.colocation_threads",
                                     "expected a thread count >= 1 (or 0: threads)")
                per_device[dev] = ModelOnDevice(mode, batches, curves, threads,
                                                number(md.get("per_request_s", 0.0), source, f"{dwhere}.per_request_s"),
                                                memory,
                                                number(md.get("batch_gap_s", 0.0), source, f"{dwhere}.batch_gap_s"),
                                                parse_idle(md["idle"], source, f"{dwhere}.idle")
                                                if md.get("idle") is not None else None, tuple(padded), demand,
                                                number(md.get("hop_s", 0.0), source, f"{dwhere}.hop_s"),
                                                number(md.get("handoff_cpu_s", 0.0), source,
                                                       f"{dwhere}.handoff_cpu_s"),
                                                number(md.get("pickup_s", 0.0), source, f"{dwhere}.pickup_s"),
                                                other_threads, curve_threads)
            overhead = parse_dist(m["overhead"], source, f"{where}.overhead") if m.get("overhead") is not None else None
            dispatch = parse_dist(m["dispatch"], source, f"{where}.dispatch") if m.get("dispatch") is not None else None
            request_demand = m.get("request_demand")
            if request_demand is not None:
                request_demand = number(request_demand, source, f"{where}.request_demand")
            drift = parse_drift(m["drift"], source, f"{where}.drift") if m.get("drift") is not None else None
            models[name] = ModelProfile(name, str(m.get("framework", "")), str(m.get("precision", "")), per_device,
                                        overhead, dispatch, request_demand, drift)

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
        request_device = data.get("request_device")
        if request_device is not None and (request_device not in devices or devices[request_device].kind != "cpu"):
            raise InputError(source, "request_device", "expected a cpu device listed under devices")
        calibration = data.get("calibration") or []
        if not isinstance(calibration, list) or not all(isinstance(c, Mapping) for c in calibration):
            raise InputError(source, "calibration", "expected a list of co-located runs")
        ensembles = data.get("ensembles") or {}
        if not isinstance(ensembles, Mapping):
            raise InputError(source, "ensembles", "expected an object: ensemble name -> its time beyond its members'")
        ensembles = {str(n): parse_ensemble_extra(e, source, f"ensembles.{n}") for n, e in ensembles.items()}
        return cls(devices, models, overhead, tuple(pairs), dict(host), str(data.get("source", "")),
                   str(data.get("created", "")), number(data.get("ensemble_step_s", 0.0), source, "ensemble_step_s"),
                   tuple(str(n) for n in notes), request_device, tuple(calibration), ensembles, source)
