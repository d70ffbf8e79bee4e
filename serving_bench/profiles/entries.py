"""What a profile holds per served entry: its measurements on each device (:class:`ModelOnDevice`: the service time
per batch size, demands, co-location curves, the tables at other thread counts) and across devices
(:class:`ModelProfile`: overhead, dispatch, request demand, drift), with their parsing from a profile file. The file's
layout and the rules (batch sizes and thread counts between measured ones) are in :mod:`serving_bench.profiles.schema`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from serving_bench.errors import InputError
from serving_bench.profiles.distributions import (Curve, Dist, IdleEffect, interp, number, parse_curve, parse_dist,
                                                  parse_idle)

EXECUTION_MODES = ("eager", "cuda_graphs", "compiled", "tensorrt", "n/a")
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




ENERGY_UNITS = {"cpu_seconds_proxy": "CPU-s"}  # a measure's unit (every other measure, rapl or nvml: joules)


@dataclass(frozen=True)
class EnergyTable:
    """What a request of ``b`` rows cost, per measured batch size, one request at a time: ``per_request`` in the
    ``measure``'s unit (``rapl``, ``nvml``, ``rapl+nvml``: joules; ``cpu_seconds_proxy``: CPU-seconds, where the host
    exposes no energy counter) and ``cpu_s`` (CPU-seconds of the server and its instances, always)."""

    measure: str
    per_request: Mapping[int, float]
    cpu_s: Mapping[int, float] = field(default_factory=dict)

    @property
    def unit(self) -> str:
        return ENERGY_UNITS.get(self.measure, "J")

    def at(self, batch: int) -> float:
        """A request of ``batch`` rows (linear between measured sizes, the nearest outside)."""
        sizes = sorted(self.per_request)
        return interp(float(batch), tuple(float(b) for b in sizes), tuple(self.per_request[b] for b in sizes))

    def to_json(self) -> dict:
        return {"measure": self.measure, "unit": self.unit,
                "per_request": {str(b): self.per_request[b] for b in sorted(self.per_request)},
                "cpu_s": {str(b): self.cpu_s[b] for b in sorted(self.cpu_s)}}


def parse_energy(data: Any, source: str, where: str) -> EnergyTable:
    """An entry's ``energy`` (:class:`EnergyTable`)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("measure"), str) or not data["measure"]:
        raise InputError(source, f"{where}.measure", "expected the measure's name (rapl, nvml, cpu_seconds_proxy)")
    tables = {}
    for key in ("per_request", "cpu_s"):
        table = data.get(key) or {}
        if not isinstance(table, Mapping) or (key == "per_request" and not table):
            raise InputError(source, f"{where}.{key}", "expected an object batch size -> value per request")
        tables[key] = {_batch_key(b, source, f"{where}.{key}.{b}"): number(v, source, f"{where}.{key}.{b}")
                       for b, v in table.items()}
    return EnergyTable(data["measure"], tables["per_request"], tables["cpu_s"])


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
    memory_unique_bytes: int | None = None  # an instance's USS: what it alone holds (CPU; None: not read)
    memory_peak_bytes: int | None = None  # its resident high-water mark (VmHWM)
    energy: EnergyTable | None = None  # energy (or CPU-seconds, the proxy) per request, per batch size
    # batch size b -> (RSS or device bytes, USS or None) of an instance that has served requests of up to b rows
    memory_by_batch: Mapping[int, tuple[int, int | None]] = field(default_factory=dict)

    def memory_at(self, max_batch: int | None = None) -> tuple[int | None, int | None]:
        """(RSS, USS) of one instance serving batches of up to ``max_batch`` rows: the reading after the smallest
        measured size at or above it (an instance's arenas grow with the largest batch it ran; the largest measured
        when none is), else the largest-batch figures (``memory_bytes``, ``memory_unique_bytes``)."""
        if max_batch is not None and self.memory_by_batch:
            sizes = sorted(self.memory_by_batch)
            return self.memory_by_batch[next((b for b in sizes if b >= max_batch), sizes[-1])]
        return self.memory_bytes, self.memory_unique_bytes

    def memory_for(self, instances: int, max_batch: int | None = None) -> int | None:
        """Bytes ``instances`` instances serving batches of up to ``max_batch`` rows (None: the largest measured)
        hold together (None where the profile has no memory): each instance's own pages (USS) once per instance,
        the pages they share (libraries: RSS - USS) once, ``k * USS + (RSS - USS)``; without a USS (a GPU's
        memory), ``k * RSS``."""
        rss, uss = self.memory_at(max_batch)
        if rss is None:
            return None
        if uss is None:
            return instances * rss
        return instances * uss + max(rss - uss, 0)

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
        for key in ("memory_unique_bytes", "memory_peak_bytes"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.memory_by_batch:
            out["memory_by_batch"] = {str(b): list(self.memory_by_batch[b]) for b in sorted(self.memory_by_batch)}
        if self.energy is not None:
            out["energy"] = self.energy.to_json()
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
    model: str = ""  # the zoo model the entry is a variant of ("": not known)
    variant: str = ""  # the entry's variant id (export.variants.Variant.id; "": not a variant export)

    def to_json(self) -> dict:
        out = {"framework": self.framework, "precision": self.precision,
               "devices": {d: self.devices[d].to_json() for d in sorted(self.devices)}}
        if self.model:
            out["model"] = self.model
        if self.variant:
            out["variant"] = self.variant
        if self.overhead is not None:
            out["overhead"] = self.overhead.to_json()
        if self.dispatch is not None:
            out["dispatch"] = self.dispatch.to_json()
        if self.request_demand is not None:
            out["request_demand"] = self.request_demand
        if self.drift is not None:
            out["drift"] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in self.drift.items()}
        return out



def parse_model(name: str, data: Any, devices: Mapping, source: str) -> ModelProfile:
    """The profile's entry ``models.<name>``, measured on some of ``devices``."""
    where = f"models.{name}"
    if not isinstance(data, Mapping) or not isinstance(data.get("devices"), Mapping) or not data["devices"]:
        raise InputError(source, f"{where}.devices", "expected an object device -> measurements")
    per_device = {}
    for dev, md in data["devices"].items():
        if dev not in devices:
            raise InputError(source, f"{where}.devices.{dev}", f"device {dev!r} is not listed under devices")
        per_device[dev] = parse_model_on_device(md, source, f"{where}.devices.{dev}")
    optional = {key: parse_dist(data[key], source, f"{where}.{key}") if data.get(key) is not None else None
                for key in ("overhead", "dispatch")}
    request_demand = data.get("request_demand")
    if request_demand is not None:
        request_demand = number(request_demand, source, f"{where}.request_demand")
    drift = parse_drift(data["drift"], source, f"{where}.drift") if data.get("drift") is not None else None
    return ModelProfile(name, str(data.get("framework", "")), str(data.get("precision", "")),
                        per_device, optional["overhead"], optional["dispatch"], request_demand, drift,
                        str(data.get("model", "")), str(data.get("variant", "")))


def parse_model_on_device(md: Any, source: str, where: str) -> ModelOnDevice:
    """One entry's measurements on one device (``models.<name>.devices.<device>``)."""
    batches, demand = _batches_and_demand(md, source, where)
    mode = md.get("execution_mode", "n/a")
    if mode not in EXECUTION_MODES:
        raise InputError(source, f"{where}.execution_mode", f"expected one of {', '.join(EXECUTION_MODES)}")
    colocation = md.get("colocation") or []
    if not isinstance(colocation, list):
        raise InputError(source, f"{where}.colocation", "expected a list of curves")
    curves = tuple(sorted((parse_curve(c, source, f"{where}.colocation[{i}]") for i, c in enumerate(colocation)),
                          key=lambda c: c.batch))
    threads = md.get("threads", 1)
    if not isinstance(threads, int) or threads < 1:
        raise InputError(source, f"{where}.threads", "expected a thread count >= 1")
    memory = {key: md.get(key) for key in ("memory_bytes", "memory_unique_bytes", "memory_peak_bytes")}
    for key, value in memory.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise InputError(source, f"{where}.{key}", "expected bytes >= 0 or null")
    padded = md.get("padded_sizes") or []
    if not isinstance(padded, list) or any(not isinstance(b, int) or isinstance(b, bool) or b < 1
                                           for b in padded) or any(b <= a for a, b in zip(padded, padded[1:])):
        raise InputError(source, f"{where}.padded_sizes", "expected strictly increasing batch sizes >= 1")
    curve_threads = md.get("colocation_threads", 0)
    if isinstance(curve_threads, bool) or not isinstance(curve_threads, int) or curve_threads < 0:
        raise InputError(source, f"{where}.colocation_threads", "expected a thread count >= 1 (or 0: threads)")
    seconds = {key: number(md.get(key, 0.0), source, f"{where}.{key}")
               for key in ("per_request_s", "batch_gap_s", "hop_s", "handoff_cpu_s", "pickup_s")}
    idle = parse_idle(md["idle"], source, f"{where}.idle") if md.get("idle") is not None else None
    energy = parse_energy(md["energy"], source, f"{where}.energy") if md.get("energy") is not None else None
    return ModelOnDevice(mode, batches, curves, threads, seconds["per_request_s"], memory["memory_bytes"],
                         seconds["batch_gap_s"], idle, tuple(padded), demand, seconds["hop_s"],
                         seconds["handoff_cpu_s"], seconds["pickup_s"], _other_threads(md, threads, source, where),
                         curve_threads, memory["memory_unique_bytes"], memory["memory_peak_bytes"], energy,
                         _memory_by_batch(md.get("memory_by_batch"), source, f"{where}.memory_by_batch"))


def _memory_by_batch(data: Any, source: str, where: str) -> dict[int, tuple[int, int | None]]:
    """``memory_by_batch``: batch size -> [RSS bytes, USS bytes or null] (absent: none)."""
    if data is None:
        return {}
    expected = 'expected {"BATCH": [RSS bytes, USS bytes or null], ...} with batch sizes >= 1'
    if not isinstance(data, Mapping):
        raise InputError(source, where, expected)
    out = {}
    for key, pair in data.items():
        ok = str(key).isdigit() and int(key) >= 1 and isinstance(pair, list) and len(pair) == 2 and all(
            v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) for v in pair) and \
            pair[0] is not None
        if not ok:
            raise InputError(source, f"{where}.{key}", expected)
        out[int(key)] = (pair[0], pair[1])
    return out


def _other_threads(md: Mapping, threads: int, source: str, where: str) -> dict[int, ThreadTable]:
    """An entry's ``other_threads``: thread count -> its solo batches (counts other than ``threads``)."""
    other = md.get("other_threads") or {}
    if not isinstance(other, Mapping):
        raise InputError(source, f"{where}.other_threads", "expected an object thread count -> batches")
    tables = {}
    for key, table in other.items():
        twhere = f"{where}.other_threads.{key}"
        if not str(key).isdigit() or int(key) < 1 or int(key) == threads:
            raise InputError(source, twhere, f"expected a thread count >= 1 other than threads ({threads})")
        tables[int(key)] = ThreadTable(*_batches_and_demand(table, source, twhere))
    return tables
