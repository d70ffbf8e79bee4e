"""What the simulator runs: profile + serving config resolved into plain per-model tables (checked once, up front).

``build_spec(profile, config)`` validates the pair (a batch size the config needs that the profile lacks, a device or
model it lacks, more instances than a device allows -> :class:`InputError` naming the profile file and field) and
returns a :class:`SimSpec`: for every served model its Triton batching knobs in seconds, its instances (device per
instance), a service-time table per executed batch size (quantile grid, solo seconds), and per device the sharing
rule of :mod:`serving_bench.sim.device`: its law and the :class:`~serving_bench.sim.device.Kind` of every
execution (model, batch size) it can run. On a CPU device each model runs at the runtime threads the config gives
its instances (``ServingConfig.instance_threads``; the profile's table for that count:
:meth:`~serving_bench.profiles.schema.ModelOnDevice.for_threads`).

Where the profile names a ``request_device`` (the host's cores) and a model's ``request_demand``, that model's
requests' ways in (dispatch) and out (return) are work on those cores too (:mod:`serving_bench.sim.workload`), of
that demand.

The **demand** of a batch of ``b`` items of a model on a device, in this order:

1. measured (the profile's ``demand``, at the size the batch runs at, padded or not);
2. from the model's own measured co-location curve where it saturates: ``S(k) < k`` at its largest ``k`` means ``k``
   batches wanted more than the device has, and under processor sharing ``S(k) = C / d``, so ``d = C / S(k)``;
3. otherwise an estimate: on a CPU the instance's ``threads`` (each a busy core); on a GPU the fraction of the
   device the batch keeps busy judged from the profile's own batch scaling, ``f_b = min(1, (b / B) t(B) / t(b))``
   (``B`` the largest measured batch, assumed to fill the device; ``t`` the median service time): eager,
   launch-bound small batches leave most of a GPU idle, large ones fill it.

On a GPU a batch is stretched whole (its kind's ``phi`` is 1, not ``d``): stretching only its share of the device
would let batches together use more than the device (docs/sim.md#on-a-gpu-a-batch-stretches-whole).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import astuple, dataclass, field

import numpy as np

from serving_bench.errors import InputError
from serving_bench.profiles.distributions import Curve, EnsembleExtra, IdleEffect, interp
from serving_bench.profiles.entries import ModelOnDevice
from serving_bench.profiles.law import Law
from serving_bench.profiles.schema import DeviceInfo, Profile
from serving_bench.serving_config import ModelServing, ServingConfig
from serving_bench.sim.device import Kind
from serving_bench.sim.device import Law as DeviceLaw
from serving_bench.sim.drift import HostDrift, Loadings, fit_drift

GRID_POINTS = 257  # quantile grid per batch size: sampling = one uniform draw + one linear interpolation
DEFAULT_WAIT_S = 0.5  # Triton's batcher thread sleeps this long when its queue is empty and nothing wakes it


class QueuePolicyNotModelledWarning(UserWarning):
    """A simulated config uses a queue policy: the simulator's batcher prefetches as Triton does without one."""


@dataclass
class ModelSpec:
    """One served (non-ensemble) model, resolved. Times in seconds; ``max_batch`` in items (0 -> no batching)."""

    index: int
    name: str
    max_batch: int
    dynamic: bool
    delay_s: float
    preferred: tuple[int, ...]
    max_queue_size: int
    timeout_s: float
    instance_devices: tuple[str, ...]
    # per device name: table[b] = quantile grid of the solo service time of an executed batch of b items (row 0: NaN)
    tables: dict[str, np.ndarray] = field(default_factory=dict)
    instance_tables: np.ndarray | None = None  # per instance its device's table, stacked (the engine reads this)
    per_request_s: dict[str, float] = field(default_factory=dict)
    batch_gap_s: dict[str, float] = field(default_factory=dict)
    idle: dict[str, IdleEffect | None] = field(default_factory=dict)  # per device: cold-start extras
    overhead_grid: list[float] = field(default_factory=list)
    dispatch_grid: list[float] = field(default_factory=list)  # empty: no measured dispatch time
    max_preferred_size: int = 0  # the largest preferred batch size (0: none)
    request_kind: Kind | None = None  # a request's way in and out as work on the host's cores (None: pure delays)
    pickup_s: dict[str, float] = field(default_factory=dict)  # per device: an idle instance taking up a payload
    drift: Loadings | None = None  # how its phases follow the host's speed (SimSpec.drift; None: they do not)

    def __post_init__(self):
        self.max_preferred_size = max(self.preferred) if self.preferred else 0


@dataclass
class EnsembleSpec:
    """An ensemble: ``steps`` are member model indices; ``deps[i]`` the steps whose outputs step i needs. A request
    to it travels to the server as one to its ``entry`` member would (its first step's model: the same input, the
    same way in) and back as one from its ``exit`` member (its last step's model: the same output, the same way
    out), plus ``extra``, its time beyond that path where the profile measured it (None: none)."""

    index: int
    name: str
    steps: tuple[int, ...]
    deps: tuple[tuple[int, ...], ...]
    extra: EnsembleExtra | None = None

    @property
    def entry(self) -> int:
        """The model of the first step that needs nothing but the request."""
        return next(self.steps[i] for i, d in enumerate(self.deps) if not d)

    @property
    def exit(self) -> int:
        """The model of the last step no other step needs (the one that answers)."""
        needed = {j for d in self.deps for j in d}
        return next(self.steps[i] for i in reversed(range(len(self.steps))) if i not in needed)


@dataclass(frozen=True)
class CoreWait:
    """Waiting for a core on a CPU host (the law's ``wait_p`` and ``wait_s``): the operating system's scheduler lets
    a thread that keeps computing finish its time slice, so a request's way in or out (short bursts of several
    threads: client, Triton, the stub) that starts while the cores are all taken, one of them by a *long* execution
    (more than ``slice_s`` solo seconds: resnet50 beside tiny models), may wait for the rest of that slice.

    With ``D`` the summed demand running on the host's ``C`` cores and ``D_long`` that of its long executions, the
    phase waits with probability ``q = p D_long / max(C, D)`` (the chance the cores are taken, ``min(1, D / C)``,
    times the chance the one it waits behind is long, ``D_long / D``) a time uniform on (0, ``slice_s``).

    With ``quiet_s`` (the law's ``wait_quiet_s``, measured: ``calibrate.waits.quiet_wait``) the chance is rather
    how long the host was quiet before, whatever else runs: ``q = p (1 - exp(-g / quiet_s))`` while a long
    execution runs, ``g`` the host's recent quiet time — the weighted mean of the times between sends (any model),
    the newest weighing ``memory`` (the law's ``wait_quiet_memory``) — for a way in (an ensemble's too) and an
    ensemble step's hand-off (with the request's ``g``: it wakes the member's thread); 0 for what follows the
    server's own work (a way out). On the 2-core VM a tiny model's way in beside an occasional resnet50 batch
    waited > 1 ms in 1-5 % of the requests sent within 5 ms of another, 21 % after 15-50 ms and 59 % after longer,
    with the other core free (docs/sim.md#waiting-for-a-core-wait, "Waiting behind an occasional long execution"): a thread woken on a host
    that sat quiet queues behind the long one."""

    p: float
    slice_s: float
    quiet_s: float = 0.0
    memory: float = 1.0  # the newest gap's weight in the host's recent quiet time ``g`` (1: the last gap alone)
    # the length by the host's quiet (the law's wait_gap_s, wait_gap_quiet_s, wait_s_quiet): slice_s up to g = gap_s,
    # quiet_slice_s from g = quiet_gap_s, linear between (0: slice_s at every g)
    gap_s: float = 0.0
    quiet_gap_s: float = 0.0
    quiet_slice_s: float = 0.0

    def wait_s(self, demand: float, long_demand: float, capacity: float, u: float, quiet: float = math.inf) -> float:
        """The wait (s) of a phase that starts beside ``demand`` (of which ``long_demand`` long) on ``capacity``
        cores after ``quiet`` seconds of quiet, for its uniform draw ``u`` in [0, 1): ``(u / q) slice_s`` if
        ``u < q``, else 0 (``u / q`` is uniform on [0, 1) given ``u < q``, so one draw decides both whether and how
        long; its length ``slice_s`` or, where measured, by ``quiet``)."""
        if long_demand <= 0.0:
            return 0.0
        if self.quiet_s > 0.0:
            q = -self.p * math.expm1(-quiet / self.quiet_s)
        else:
            q = self.p * long_demand / max(capacity, demand)
        if u >= q:
            return 0.0
        if self.quiet_slice_s > 0.0:
            return u / q * interp(quiet, (self.gap_s, self.quiet_gap_s), (self.slice_s, self.quiet_slice_s))
        return u / q * self.slice_s


@dataclass
class SimSpec:
    models: list[ModelSpec]
    ensembles: list[EnsembleSpec]
    devices: dict[str, "DeviceRule"]
    step_s: float  # ensemble scheduler cost per step
    source: str
    request_device: str | None = None  # where requests' ways in and out run (see ModelSpec.request_kind)
    core_wait: CoreWait | None = None  # requests' ways in and out wait for a core on the request device
    drift: HostDrift | None = None  # the host's speed in time, which the models' phases follow (sim/drift.py)

    def served_index(self, name: str) -> tuple[str, int] | None:
        for m in self.models:
            if m.name == name:
                return ("model", m.index)
        for e in self.ensembles:
            if e.name == name:
                return ("ensemble", e.index)
        return None


@dataclass
class DeviceRule:
    """The sharing rule of one device (see :mod:`serving_bench.sim.device`): its law, the :class:`Kind` of every job
    it can run (key ``(model index, executed batch size)``), and the measured pair curves (frozenset of two model
    indices -> curves by increasing measured batch size)."""

    name: str
    law: DeviceLaw
    kinds: dict[tuple[int, int], Kind] = field(default_factory=dict)
    pairs: dict[frozenset, list[Curve]] = field(default_factory=dict)


def device_law(info: DeviceInfo) -> DeviceLaw:
    """The engine's law of the device (:attr:`DeviceInfo.sharing`): its name and throughput parameters."""
    law = info.sharing
    return DeviceLaw(law.name, info.capacity, law.value("eta"), law.value("power"), law.value("queue"),
                     law.value("alpha"), law.value("sigma"), law.value("kappa"))


def core_wait(info: DeviceInfo, instances: int | None = None) -> CoreWait | None:
    """The law's wait for a core (``wait_p``, ``wait_s``, ``wait_quiet_s``, ...) of requests on this host with
    ``instances`` model instances in all (:func:`wait_chance`); None without one."""
    law = info.sharing
    if law.wait_p is None or law.wait_s is None:
        return None
    return CoreWait(wait_chance(law, instances), law.wait_s, law.value("wait_quiet_s"), law.value("wait_quiet_memory"),
                    law.value("wait_gap_s"), law.value("wait_gap_quiet_s"), law.value("wait_s_quiet"))


def wait_chance(law: Law, instances: int | None) -> float:
    """The wait's ``p`` on a host with ``instances`` model instances in all: where the law measured it at two counts
    (``wait_p`` at ``wait_instances``, ``wait_p_fewer`` at ``wait_instances_fewer``), linear between them and flat
    outside (the last measured value: never extrapolated); else ``wait_p``. More instances are more threads for the
    scheduler to place: on the 2-core VM one instance per model waited half as often as two
    (docs/notes/sim-history.md, "The wait's chance follows the host's instances in all")."""
    p = law.value("wait_p")
    if instances is None or law.wait_p_fewer is None:
        return p
    counts, chances = (law.wait_instances_fewer, law.wait_instances), (law.wait_p_fewer, p)
    return float(np.interp(instances, counts, chances))


def handoff_share(info: DeviceInfo) -> float:
    """The law's ``psi``: the share of the measured hand-off demand that competes for the cores (default 1)."""
    return info.sharing.value("psi")


def batch_demand(info: DeviceInfo, md: ModelOnDevice, batch: int, curve: Curve | None, handoff: float | None = None,
                 psi: float = 1.0) -> float:
    """The demand of a batch of ``batch`` items (the order of the module docstring). Where the profile measured the
    host CPU each batch costs outside the runtime (``handoff_cpu_s``), the batch's time on the instance carries the
    runtime's CPU and that CPU (scaled by ``psi``); else, with the model's ``handoff`` demand (already scaled by psi)
    and a measured hop, the runtime's part runs at its own demand and the hop at the hand-off demand."""
    runs_at = md.executed_size(batch)
    measured = md.demand_at(runs_at)
    if measured is not None:
        if md.handoff_cpu_s <= 0 and (handoff is None or md.hop_s <= 0):
            return measured
        whole = md.service(runs_at).mean
        runtime = max(whole - md.hop_s, 0.0)
        if whole <= 0:
            return measured
        hop_cpu = psi * md.handoff_cpu_s if md.handoff_cpu_s > 0 else handoff * md.hop_s
        return (measured * runtime + hop_cpu) / whole
    if curve is not None and curve.speedup[-1] < curve.k[-1] - 1e-9:
        return info.capacity / curve.speedup[-1]
    if info.kind == "cpu":
        return float(md.threads)
    sizes = md.batch_sizes
    big = sizes[-1]
    t_big = md.batches[big].median
    t_b = md.service(min(max(runs_at, sizes[0]), big)).median
    return 1.0 if t_b <= 0 or t_big <= 0 else min(1.0, (runs_at / big) * t_big / t_b)


def _curve_for(curves: tuple[Curve, ...], batch: int) -> Curve | None:
    """The co-location curve at ``batch`` from the measured ones (sorted by batch size): the nearest one outside the
    measured range; between two measured batch sizes, linear interpolation of S(k) at every k either was measured at
    (the rule the service times follow)."""
    if not curves:
        return None
    if batch <= curves[0].batch:
        return curves[0]
    if batch >= curves[-1].batch:
        return curves[-1]
    hi = next(c for c in curves if c.batch >= batch)
    if hi.batch == batch:
        return hi
    lo = [c for c in curves if c.batch < batch][-1]
    w = (batch - lo.batch) / (hi.batch - lo.batch)
    ks = sorted(set(lo.k) | set(hi.k))
    return Curve(batch, tuple(ks), tuple(lo(k) + w * (hi(k) - lo(k)) for k in ks))


def _grid(dist, points: int = GRID_POINTS) -> list[float]:
    return dist.grid(points)


def needed_batch_sizes(model: ModelServing) -> range:
    """Executed batch sizes a config can produce: 1..max_batch_size (just 1 without batching)."""
    return range(1, max(model.max_batch_size, 1) + 1)


def build_spec(profile: Profile, config: ServingConfig, ensemble_deps: dict[str, tuple] | None = None) -> SimSpec:
    """Resolve and check ``profile`` against ``config`` (see the module docstring)."""
    src = profile.path or "profile"
    served = Served(profile, config)
    models = []
    for index, ms in enumerate(config.models):
        models.append(model_spec(served, index, ms, src))
    placed = check_placement(served, src)
    rules = {device: device_rule(served, models, device) for device in placed}
    names = {m.name: m.index for m in models}
    ensembles: list[EnsembleSpec] = []
    for e_index, (name, members) in enumerate(config.ensembles):
        missing = [m for m in members if m not in names]
        if missing:
            raise InputError("serving config", f"ensembles.{name}", f"member {missing[0]!r} is not a served model")
        deps = (ensemble_deps or {}).get(name) or config.steps_needed(name)
        ensembles.append(EnsembleSpec(e_index, name, tuple(names[m] for m in members), tuple(deps),
                                      profile.ensembles.get(name)))
    host = request_host(profile, models, rules)
    instances = sum(len(m.instance_devices) for m in models)  # the host's threads follow them (wait_chance)
    wait = core_wait(profile.devices[host], instances) if host is not None else None
    host_law = profile.devices[profile.request_device].sharing if profile.request_device is not None else None
    share = host_law.value("drift") if host_law is not None else 0.0  # how much of the drift the phases follow
    drift, loadings = fit_drift({m.name: profile.models[m.name].drift for m in models
                                 if profile.models[m.name].drift is not None}) if share > 0.0 else (None, {})
    for m in models:  # the law's share of each measured loading
        m.drift = Loadings(*(share * x for x in astuple(loadings[m.name]))) if m.name in loadings else None
    return SimSpec(models, ensembles, rules, profile.ensemble_step_s, src, host, wait, drift)


class Served:
    """A profile as a serving config runs it: ``served(name, device)`` is ``name``'s measurements on ``device`` at
    the runtime threads the config gives its instances there; ``counts`` and ``memory`` the instances and bytes
    placed on each device so far (in the order the config first places one)."""

    def __init__(self, profile: Profile, config: ServingConfig):
        self.profile, self.config = profile, config
        self.counts: dict[str, int] = {}
        self.memory: dict[str, int] = {}

    def __call__(self, name: str, device: str) -> ModelOnDevice:
        md, info = self.profile.on_device(name, device), self.profile.devices[device]
        return md.for_threads(self.config.instance_threads(info.cores or 1)) if info.kind == "cpu" else md


def model_spec(served: Served, index: int, ms: ModelServing, src: str) -> ModelSpec:
    """One served model resolved: its batching knobs, instances (placed in ``served``) and per device its tables."""
    devices: list[str] = []
    for device, count in ms.instances:
        if count < 1:
            raise InputError(src, f"{ms.name}.instances", f"instance count must be >= 1, got {count}")
        md = served(ms.name, device)
        devices += [device] * count
        served.counts[device] = served.counts.get(device, 0) + count
        if md.memory_bytes:
            served.memory[device] = served.memory.get(device, 0) + count * md.memory_bytes
    dynamic = ms.dynamic_batching and ms.max_batch_size > 0
    if ms.queue_policy:
        warnings.warn(f"{ms.name}: queue policy ({', '.join(ms.queue_policy)}) simulated as Triton batches "
                      "without one; the bundled Triton 2.51 then stalls up to 0.5 s per batch, which is not "
                      "modelled (docs/sim.md#tritons-dynamic-batcher)", QueuePolicyNotModelledWarning, stacklevel=3)
    preferred = tuple(sorted(set(ms.preferred_batch_sizes))) if dynamic else ()
    if dynamic and not preferred:
        preferred = (ms.max_batch_size,)  # Triton's normalisation: preferred defaults to max_batch_size
    if any(p < 1 or p > ms.max_batch_size for p in preferred):
        raise InputError(src, f"{ms.name}.preferred_batch_sizes",
                         f"expected sizes between 1 and max_batch_size {ms.max_batch_size}, got {list(preferred)}")
    spec = ModelSpec(index, ms.name, ms.max_batch_size, dynamic, ms.max_queue_delay_us * 1e-6 if dynamic else 0.0,
                     preferred, ms.max_queue_size if dynamic else 0, ms.queue_timeout_us * 1e-6 if dynamic else 0.0,
                     tuple(devices))
    for device in sorted(set(devices)):
        md = served(ms.name, device)
        spec.tables[device] = service_table(md, ms, device, src)
        spec.per_request_s[device] = md.per_request_s
        spec.batch_gap_s[device] = md.batch_gap_s
        spec.idle[device] = md.idle
        spec.pickup_s[device] = md.pickup_s if dynamic else 0.0
    spec.instance_tables = np.stack([spec.tables[device] for device in devices]) if devices else None
    spec.overhead_grid = _grid(served.profile.overhead_for(ms.name))
    if served.profile.models[ms.name].dispatch is not None:
        spec.dispatch_grid = _grid(served.profile.models[ms.name].dispatch)
    return spec


def service_table(md: ModelOnDevice, ms: ModelServing, device: str, src: str) -> np.ndarray:
    """table[b]: the quantile grid of the solo service time of an executed batch of b items (row 0: NaN)."""
    table = np.full((max(ms.max_batch_size, 1) + 1, GRID_POINTS), np.nan)
    for b in needed_batch_sizes(ms):
        runs_at = md.executed_size(b)  # padded to a captured size, where the runtime has them
        try:
            table[b] = _grid(md.service(runs_at))
        except KeyError:
            padded = f" (padded to {runs_at})" if runs_at != b else ""
            raise InputError(src, f"models.{ms.name}.devices.{device}.batches",
                             f"the config needs batch size {b}{padded} (max_batch_size {ms.max_batch_size}) "
                             f"but the profile measured {list(md.batch_sizes)}; sizes outside the measured "
                             "range are not extrapolated") from None
    return table


def check_placement(served: Served, src: str) -> list[str]:
    """The devices instances were placed on, each checked against its instance and memory limits."""
    for device, count in served.counts.items():
        info = served.profile.devices[device]
        if info.max_instances is not None and count > info.max_instances:
            raise InputError(src, f"devices.{device}.max_instances",
                             f"the config places {count} instances on {device} but at most {info.max_instances} fit")
        if info.memory_bytes is not None and served.memory.get(device, 0) > info.memory_bytes:
            raise InputError(src, f"devices.{device}.memory_bytes",
                             f"the config's instances need {served.memory[device]} bytes on {device}, "
                             f"which has {info.memory_bytes}")
    return list(served.counts)


def device_rule(served: Served, models: list[ModelSpec], device: str) -> DeviceRule:
    """The sharing rule of ``device``: its law, its pair curves and the kind of every batch it can run."""
    profile = served.profile
    names = {m.name: m.index for m in models}
    info = profile.devices[device]
    rule = DeviceRule(device, device_law(info))
    for p in profile.pairs:
        if p.device == device and all(n in names for n in p.models):
            rule.pairs.setdefault(frozenset(names[n] for n in p.models), []).append(p.curve)
    for curves in rule.pairs.values():
        curves.sort(key=lambda c: c.batch)
    host = profile.request_device
    psi = handoff_share(profile.devices[host]) if host is not None else 1.0
    for m in models:
        if device not in m.tables:
            continue
        md = served(m.name, device)
        handoff = profile.models[m.name].request_demand
        if handoff is not None and host is not None:
            handoff *= psi
        for b in range(1, max(m.max_batch, 1) + 1):
            curve = _curve_for(md.colocation, b)
            rule.kinds[(m.index, b)] = Kind((m.index, b), m.index, b,
                                            batch_demand(info, md, b, curve, handoff, psi), md.threads, curve,
                                            phi=1.0 if info.kind == "gpu" else None)
        if m.pickup_s.get(device, 0.0) > 0.0:  # a thread waking up: it waits for a core, its CPU is the batch's
            # (stretched by the others, or, with a run queue, queued for a core and then run at full speed)
            rule.kinds[(m.index, -1)] = Kind((m.index, -1), m.index, -1, 0.0,
                                             phi=0.0 if rule.law.queue > 0.0 else 1.0)
    return rule


def request_host(profile: Profile, models: list[ModelSpec], rules: dict[str, DeviceRule]) -> str | None:
    """The request device where some model's requests' ways in and out are work on its cores (their kinds added
    to its rule, made if none), else None."""
    host = profile.request_device
    if host is None or all(profile.models[m.name].request_demand is None for m in models):
        return None
    if host not in rules:
        rules[host] = DeviceRule(host, device_law(profile.devices[host]))
    psi = handoff_share(profile.devices[host])
    for m in models:
        demand = profile.models[m.name].request_demand
        if demand is not None:
            m.request_kind = rules[host].kinds[(m.index, 0)] = Kind((m.index, 0), m.index, 0, psi * demand)
    return host
