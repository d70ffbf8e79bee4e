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
     "host_spread": {"sigma": 0.03, "df": 12, "runs": 6},  # optional: the host's run-to-run spread (HostSpread)
     "notes": ["..."]}

The entries' measurements (``models``) are :mod:`serving_bench.profiles.entries`; distributions, curves, the
cold-start effect and an ensemble's own time beyond its members' (``ensembles``:
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
the names, the parameters and where each is valid: :mod:`serving_bench.profiles.law`).

**The host's run-to-run spread** (``host_spread``, optional; :class:`HostSpread`): how much the same run's
throughput differs when it is run again a little later on the same host, as the standard deviation ``sigma`` of its
logarithm, with its degrees of freedom ``df`` (``calibrate.estimators.host_spread``). The simulator's intervals draw
a host speed per replication from it (:mod:`serving_bench.sim.intervals`); without it they are the finite sample's
only.

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

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from serving_bench.errors import InputError
from serving_bench.files import atomic_write_text, read_json
from serving_bench.profiles.distributions import Curve, Dist, EnsembleExtra, number, parse_curve, parse_dist, \
    parse_ensemble_extra
from serving_bench.profiles.entries import ModelOnDevice, ModelProfile, parse_model
from serving_bench.profiles.law import Law, default_law, require_kind

PROFILE_FORMAT = "serving-bench-profile"
PROFILE_VERSION = 1
DEVICE_KINDS = ("cpu", "gpu")


@dataclass(frozen=True)
class DeviceInfo:
    """A device of the profiled machine: ``kind`` cpu or gpu, ``cores`` for CPUs, optional capacity limits, and the
    sharing ``law`` the profile names for it (None: none named, :attr:`sharing` is the default of its kind)."""

    name: str
    kind: str
    model: str = ""
    cores: int | None = None
    max_instances: int | None = None
    memory_bytes: int | None = None
    law: Law | None = None

    @property
    def capacity(self) -> float:
        """What a law shares: the cores of a CPU, one GPU."""
        return float(self.cores or 1) if self.kind == "cpu" else 1.0

    @property
    def sharing(self) -> Law:
        """The law the device is shared by: the one the profile names, or the default of its kind."""
        return self.law if self.law is not None else default_law(self.kind)

    def to_json(self) -> dict:
        out = {"kind": self.kind, "name": self.model, "cores": self.cores, "max_instances": self.max_instances,
               "memory_bytes": self.memory_bytes}
        if self.law is not None:
            out["law"] = self.law.to_json()
        return out

    @classmethod
    def from_json(cls, name: str, data: Any, source: str) -> "DeviceInfo":
        """The profile's ``devices.<name>``."""
        where = f"devices.{name}"
        if not isinstance(data, Mapping) or data.get("kind") not in DEVICE_KINDS:
            raise InputError(source, f"{where}.kind", f"expected one of {', '.join(DEVICE_KINDS)}")
        ints = {}
        for key in ("cores", "max_instances", "memory_bytes"):
            value = data.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise InputError(source, f"{where}.{key}", f"expected a positive integer or null, got {value!r}")
            ints[key] = value
        if data["kind"] == "cpu" and ints["cores"] is None:
            raise InputError(source, f"{where}.cores", "a cpu device needs its core count")
        law = Law.from_json(data["law"], source, f"{where}.law") if data.get("law") is not None else None
        if law is not None:
            require_kind(law.name, data["kind"], source, f"{where}.law.name")
        return cls(name, data["kind"], str(data.get("name", "")), **ints, law=law)

@dataclass(frozen=True)
class HostSpread:
    """The host's run-to-run spread: ``sigma``, the standard deviation of the log of a run's throughput between
    repeats of the same run, with ``df`` degrees of freedom, pooled over ``runs`` repeated runs."""

    sigma: float
    df: int
    runs: int

    def to_json(self) -> dict:
        return {"sigma": self.sigma, "df": self.df, "runs": self.runs}

    @classmethod
    def from_json(cls, data: Any, source: str) -> "HostSpread":
        """The profile's ``host_spread``."""
        if not isinstance(data, Mapping):
            raise InputError(source, "host_spread", 'expected {"sigma": number >= 0, "df": integer >= 1, "runs": '
                                                    'integer >= 1}')
        counts = {}
        for key in ("df", "runs"):
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(source, f"host_spread.{key}", f"expected an integer >= 1, got {value!r}")
            counts[key] = value
        return cls(number(data.get("sigma"), source, "host_spread.sigma"), **counts)


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
    host_spread: HostSpread | None = None  # the host's run-to-run spread (None: not measured)

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

    def request_ceiling_rps(self) -> float | None:
        """The highest rate (requests a second, every model's summed) any of the profile's calibration runs was
        answered at: how far the profile saw the server's per-request work go (None: no calibration run)."""
        rates = []
        for run in self.calibration:
            measured = run.get("measured_rps")
            if isinstance(measured, Mapping):
                rates.append(sum(float(v) for v in measured.values() if isinstance(v, (int, float))))
        return max(rates, default=0.0) or None

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
        if self.host_spread is not None:
            out["host_spread"] = self.host_spread.to_json()
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
        devices = {name: DeviceInfo.from_json(name, d, source) for name, d in devices_data.items()}
        models_data = data.get("models")
        if not isinstance(models_data, Mapping) or not models_data:
            raise InputError(source, "models", "expected a non-empty object of models")
        models = {name: parse_model(name, m, devices, source) for name, m in models_data.items()}
        pairs = _parse_pairs(data.get("pairs") or [], devices, models, source)
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
        spread = HostSpread.from_json(data["host_spread"], source) if data.get("host_spread") is not None else None
        return cls(devices, models, overhead, tuple(pairs), dict(host), str(data.get("source", "")),
                   str(data.get("created", "")), number(data.get("ensemble_step_s", 0.0), source, "ensemble_step_s"),
                   tuple(str(n) for n in notes), request_device, tuple(calibration), ensembles, source,
                   host_spread=spread)


def _parse_pairs(data: Any, devices: Mapping, models: Mapping, source: str) -> list[PairCurve]:
    """A profile's ``pairs``: curves of two of ``models`` sharing one of ``devices``."""
    pairs = []
    for i, p in enumerate(data):
        where = f"pairs[{i}]"
        if not isinstance(p, Mapping) or p.get("device") not in devices:
            raise InputError(source, f"{where}.device", "expected a device listed under devices")
        names = p.get("models")
        if not isinstance(names, list) or len(names) != 2 or any(n not in models for n in names):
            raise InputError(source, f"{where}.models", "expected two model names listed under models")
        pairs.append(PairCurve(p["device"], (names[0], names[1]), parse_curve(p, source, where)))
    return pairs
