"""A device shared by all work placed on it (the cores of a CPU host, or one GPU): processor sharing driven by the
measured demand of each running job, with measured co-location curves as overrides.

**Jobs.** A job is work measured in solo seconds (how long it takes with the device to itself): an executed batch on
its instance's device, or — on a CPU host — a request's way in (*dispatch*: client, network, Triton's threads, the
hand-over to the stub) or way out (*return*). Every job has a :class:`Kind`: its **demand** ``d`` (cores — or the
fraction of a GPU — it keeps busy running alone: CPU seconds over wall seconds of the solo measurement), its
CPU-bound share ``phi = min(1, d / threads)``, and optionally its model's measured co-location curve.

**Rates.** With ``D`` the summed demand of the running jobs, the device's :class:`Law` gives a stretch ``s = law(D) >=
1`` (processor sharing over ``C`` cores: ``s = max(1, D / C)``); a job's CPU-bound part runs ``s`` times slower, the
rest of it (waits) does not, so it progresses at

    rate = 1 / (1 + phi (s - 1))          solo seconds of work per second.

Law ``serial`` (a GPU's default: kernels one at a time) has no single stretch: each running kind's rate comes from
the machine-repair network of the running jobs (:mod:`serving_bench.sim.serial`); so do the laws ``overlap``,
``overlap_sat`` and ``overlap_usl``, whose device serves several kernels at once (its speed a curve of the kernels in
flight).

*Overrides* (measurements beat the model): while all running executions on the device are of one model with a
measured curve ``S`` (at the nearest measured batch size), they run at ``S(k) / k`` (``k`` of them); while exactly two
models' executions run and their pair curve was measured at a batch size not below any running batch's, at
``S_pair(k) / k``. Request phases always follow the law.

**Engine.** Jobs of one kind share their rate, so each kind keeps a *virtual clock* (solo seconds any one of its
running jobs has received) and a heap of its jobs' finishing virtual times; a job finishes when its kind's clock
reaches it. Rates change only when jobs come or go — once per instant (:meth:`Device.flush`, called by the engines at
its end) — so an event costs O(kinds + log jobs). Both engines add and remove jobs in the same order and do the same
float operations, so they compute bit-identical times.
"""

from __future__ import annotations

import math

from serving_bench.profiles.law import NAMES, OVERLAP
from serving_bench.sim.heap import Entry, Heap
from serving_bench.sim.serial import Serial, serial_rates

LAWS = tuple(NAMES)  # the law names (their vocabulary: serving_bench.profiles.law); Law.form is the index
SOFT, NONE, SERIAL = LAWS.index("soft"), LAWS.index("none"), LAWS.index("serial")
CURVED = tuple(LAWS.index(name) for name in OVERLAP)  # machine repair with a device of several kernels' speed
INF = math.inf


class Law:
    """How a device's speed is shared: ``stretch(D)`` for a total demand ``D``.

    * ``pool``: processor sharing over ``capacity`` C (cores; 1 for a GPU): ``s = max(1, D / C)``;
    * ``pool_eff``: the same over an effective capacity ``eta * C`` (memory bandwidth, caches, SMT and the
      scheduler's own costs make fewer than C cores' worth): ``s = max(1, D / (eta C))``;
    * ``soft``: contention that starts before the pool is full: ``s = (1 + (D / (eta C)) ** p) ** (1 / p)``
      (``p`` large: ``pool_eff``; small: a smooth onset);
    * ``none``: no interference at all (``s = 1``): every job runs at its solo speed whatever else runs — the
      baseline a co-location model has to beat;
    * ``serial``: a device that runs its jobs' kernels one at a time (a GPU, capacity 1): no single stretch, each
      running kind gets its own rate from :mod:`serving_bench.sim.serial`; parameter-free;
    * ``overlap`` (``alpha``), ``overlap_sat`` (``sigma``), ``overlap_usl`` (``sigma``, ``kappa``): the same network
      with a device whose kernels overlap, ``n`` in flight served at :func:`serving_bench.sim.serial.capacity`
      kernels' worth (``n ** alpha``; ``n / (1 + sigma (n - 1))``; ``n / (1 + sigma (n - 1) + kappa n (n - 1))``).

    ``queue`` > 0 adds a *run queue* for the instances' threads: an instance taking up its payload while the demand
    running beside the long executions is at least ``queue * eta * C`` waits, first come first served, until that
    demand falls below it, and then runs on the core it got, at full speed (its kind's ``phi`` is 0:
    :func:`~serving_bench.sim.spec.build_spec`; see :class:`Device`).

    A profile names the law (:class:`serving_bench.profiles.law.Law`: the names, parameters, their defaults and the
    devices each is valid on); :func:`serving_bench.sim.spec.device_law` builds this from it. Parameters are fitted
    from co-located runs (:mod:`serving_bench.sim.interference`)."""

    __slots__ = ("name", "form", "capacity", "eta", "power", "scale", "queue", "alpha", "sigma", "kappa")

    def __init__(self, name: str = "pool", capacity: float = 1.0, eta: float = 1.0, power: float = 8.0,
                 queue: float = 0.0, alpha: float = 1.0, sigma: float = 0.0, kappa: float = 0.0):
        if name not in LAWS:
            raise ValueError(f"unknown law {name!r}; expected one of {', '.join(LAWS)}")
        self.name = name
        self.form = LAWS.index(name)
        self.capacity = float(capacity)
        self.eta = float(eta) if name != "pool" else 1.0
        self.power = float(power)
        self.scale = self.eta * self.capacity
        self.queue = float(queue)
        self.alpha = float(alpha)
        self.sigma = float(sigma)
        self.kappa = float(kappa)

    def solver(self) -> Serial | None:
        """The machine-repair solver of law ``serial`` or an ``overlap`` law (None for the others)."""
        if self.form == SERIAL:
            return Serial()
        if self.form in CURVED:
            solver = Serial()
            solver.set_curve(self.alpha, self.sigma, self.kappa)
            return solver
        return None

    def stretch(self, demand: float) -> float:
        if self.form == NONE:
            return 1.0
        x = demand / self.scale
        if self.form == SOFT:
            return (1.0 + x ** self.power) ** (1.0 / self.power)
        return x if x > 1.0 else 1.0

    def speedup(self, k: float, demand: float) -> float:
        """S(k) of k identical CPU-bound jobs of demand ``demand`` each (what a measured curve would show)."""
        if self.form == SERIAL:
            return k * serial_rates([int(k)], [demand])[0]
        if self.form in CURVED:
            return k * serial_rates([int(k)], [demand], (self.alpha, self.sigma, self.kappa))[0]
        return k / self.stretch(k * demand) if demand > 0 else k

    def __repr__(self) -> str:
        curve = f", alpha={self.alpha:g}, sigma={self.sigma:g}, kappa={self.kappa:g}" if self.form in CURVED else ""
        return (f"Law({self.name!r}, capacity={self.capacity:g}, eta={self.eta:g}, power={self.power:g}, "
                f"queue={self.queue:g}{curve})")


class Kind:
    """What a job is, for sharing: ``model`` index (-1: none), ``batch`` (executions; 0 for request phases, -1 for an
    instance taking up its payload), ``demand`` d, ``phi`` (its CPU-bound share: ``min(1, d / threads)`` unless
    given) and the model's co-location ``curve`` (None: none measured)."""

    __slots__ = ("key", "model", "batch", "demand", "phi", "curve")

    def __init__(self, key, model: int, batch: int, demand: float, threads: int = 1, curve=None, phi=None):
        self.key = key
        self.model = model
        self.batch = batch
        self.demand = float(demand)
        self.phi = min(1.0, self.demand / max(threads, 1)) if phi is None else float(phi)
        self.curve = curve

    def __repr__(self) -> str:
        return f"Kind({self.key!r}, demand={self.demand:.3g}, phi={self.phi:.3g})"


class Job(Entry):
    """One piece of work (made by :meth:`Device.add`): ``work`` solo seconds of kind ``kind`` that came to the device
    at ``start``; ``payload``, ``model`` and ``instance`` are the engine's (-1: a request's way in or out, not a
    batch). Its ``key`` is the virtual time at which it finishes, ``seq`` its start order; ``long``: an execution
    longer than the device's ``long_s`` (it holds a core for a whole scheduler slice)."""

    __slots__ = ("work", "kind", "payload", "model", "instance", "start", "long")


class _Running:
    """A kind's running jobs on one device: virtual clock, rate, heap of jobs by finishing virtual time."""

    __slots__ = ("kind", "virtual", "rate", "heap")

    def __init__(self, kind: Kind):
        self.kind = kind
        self.virtual = 0.0
        self.rate = 1.0
        self.heap = Heap()


# A job whose planned end is this close to now counts as finished (absorbs rounding of virtual clocks).
DONE_TOLERANCE_S = 1e-12


class Device:
    """Processor sharing per the module docstring. ``law``: the :class:`Law`; ``pairs`` maps a frozenset of two model
    indices to their measured pair curves, by increasing batch size (each with ``batch`` and ``__call__(k)``);
    ``curves``: whether any kind that runs here has a measured co-location curve (without one, and without pairs, no
    override ever applies and the device does not count executions per model); ``index``: its place among the run's
    devices (the engines' handle on it); ``long_s``: executions of more solo seconds than this are *long*, and
    ``long_demand`` is the summed demand of those running (what a way in or out may wait behind:
    :class:`~serving_bench.sim.spec.CoreWait`). With the law's run queue, take-ups (``kind.batch < 0``) that come
    while the running demand less ``long_demand`` is at least ``gate`` (``queue * eta * C``) wait in ``waiting`` and
    start in their order, at the instant a job ends, while it is below: an instance's thread woken while the cores
    are taken by short work runs when one is given up, rather than at once and slowly, and its payload grows
    meanwhile. A long execution is not waited for (the scheduler favours a thread that slept over one that keeps
    computing: the wait behind it is :class:`~serving_bench.sim.spec.CoreWait`'s)."""

    __slots__ = ("name", "index", "law", "pairs", "overrides", "running", "active", "last", "busy_s", "version", "next",
                 "demand", "executions", "dirty", "jobs", "long_s", "long_demand", "gate", "waiting", "waiting_head",
                 "serial")

    def __init__(self, name: str, law: Law | None = None, pairs: dict | None = None, curves: bool = True,
                 index: int = 0, long_s: float = INF):
        self.name = name
        self.index = index
        self.law = law or Law()
        self.pairs = pairs or {}
        self.overrides = curves or bool(self.pairs)
        self.running: dict = {}  # Kind -> _Running
        self.active: list[_Running] = []  # kinds with running jobs, in the order they became active
        self.last = 0.0  # virtual clocks are current at this time
        self.busy_s = 0.0  # time with at least one job running
        self.version = 0
        self.next = INF  # the earliest planned end
        self.demand = 0.0  # summed demand of the running jobs
        self.executions: dict[int, int] = {}  # model -> running executions (batch jobs)
        self.dirty = False  # jobs came or went since the rates were last set (see flush)
        self.jobs = 0
        self.long_s = long_s
        self.long_demand = 0.0
        self.gate = self.law.queue * self.law.scale if self.law.queue > 0.0 else INF  # in the law's units
        self.waiting: list[Job] = []  # take-ups waiting for the demand to fall below the gate, from waiting_head
        self.waiting_head = 0
        self.serial = self.law.solver()  # law serial's (or overlap's) solver and its scratch space

    # -- time --------------------------------------------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        """Bring every running kind's virtual clock to ``now``."""
        dt = now - self.last
        if dt > 0.0:
            if self.jobs:
                self.busy_s += dt
                for r in self.active:
                    r.virtual += r.rate * dt
            self.last = now

    def _rerate(self, now: float) -> None:
        """Set each running kind's rate for the current set of jobs and plan the next completion."""
        override = self._override() if self.overrides else None
        serial = self.serial
        stretch = 1.0
        if serial is not None:  # law serial or overlap: a rate per kind instead of one stretch
            serial.reserve(len(self.active))
            for i, r in enumerate(self.active):
                serial.counts[i] = r.heap.n
                serial.demands[i] = r.kind.demand
            serial.solve(len(self.active))
        elif self.demand > 0.0:
            stretch = self.law.stretch(self.demand)
        nxt = INF
        for i, r in enumerate(self.active):
            kind = r.kind
            if override is not None and kind.key in override:
                rate = override[kind.key]
            elif serial is not None:
                rate = serial.rates[i]
            elif stretch > 1.0:
                rate = 1.0 / (1.0 + kind.phi * (stretch - 1.0))
            else:
                rate = 1.0
            r.rate = rate
            t = now + (r.heap.first_key - r.virtual) / rate
            if t < nxt:
                nxt = t
        self.next = nxt

    def _override(self) -> dict | None:
        """Rates of the running executions set by a measured curve, when one applies (see the module docstring)."""
        models = self.executions
        if len(models) == 1:
            (m, k), = models.items()
            rates = {}
            for r in self.active:
                curve = r.kind.curve
                if r.kind.model != m or r.kind.batch <= 0:
                    continue
                if curve is None:
                    return None
                s = curve(float(k))
                rates[r.kind.key] = s / k if s < k else 1.0
            return rates
        if len(models) == 2 and self.pairs:
            curves = self.pairs.get(frozenset(models))
            if curves is not None:
                biggest = max(r.kind.batch for r in self.active if r.kind.batch > 0)
                k = float(sum(models.values()))
                for curve in curves:
                    if curve.batch >= biggest:
                        s = curve(k)
                        rate = s / k if s < k else 1.0
                        return {r.kind.key: rate for r in self.active if r.kind.batch > 0}
        return None

    # -- the engines' interface --------------------------------------------------------------------------------------
    def add(self, now: float, work: float, kind: Kind, seq: int, payload, model: int, instance: int) -> None:
        """A :class:`Job` of ``work`` solo seconds of ``kind`` comes at ``now`` and starts (or waits in the run
        queue); ``seq``: its start order."""
        self._advance(now)
        job = Job.__new__(Job)
        job.work = work
        job.kind = kind
        job.seq = seq
        job.pos = -1
        job.payload = payload
        job.model = model
        job.instance = instance
        job.start = now
        job.long = kind.batch > 0 and work > self.long_s
        if kind.batch < 0 and self.jobs and self.demand - self.long_demand >= self.gate:  # a take-up, queued
            self.waiting.append(job)
            return
        self._run(job)

    def _run(self, job: Job) -> None:
        """Start ``job`` now (the virtual clocks are current)."""
        kind = job.kind
        if job.long:
            self.long_demand += kind.demand
        r = self.running.get(kind)
        if r is None:
            r = self.running[kind] = _Running(kind)
        if not r.heap.n:
            self.active.append(r)
        job.key = r.virtual + job.work
        r.heap.push(job)
        self.jobs += 1
        self.demand += kind.demand
        if kind.batch > 0 and self.overrides:
            self.executions[kind.model] = self.executions.get(kind.model, 0) + 1
        self.dirty = True
        self.version += 1

    def flush(self, now: float) -> None:
        """Set the rates for the jobs running now (once per instant, however many came and went in it: the engines
        call it at the end of the instant)."""
        if self.dirty:
            self._advance(now)
            self._rerate(now)
            self.dirty = False

    def next_completion(self, now: float) -> float:
        """Absolute time of the next completion if nothing changes (inf when idle)."""
        self.flush(now)
        nxt = self.next
        return nxt if nxt > now else (now if self.jobs else INF)

    def pop_finished(self, now: float) -> list[Job]:
        """Remove the jobs whose planned end has come (in start order); the others are re-planned at the flush."""
        self.flush(now)
        self._advance(now)
        if self.next > now + DONE_TOLERANCE_S:
            return []
        done = []
        active = self.active  # the kinds that still run are kept, in order
        kept = 0
        for r in active:
            limit = r.virtual + DONE_TOLERANCE_S * r.rate
            heap = r.heap
            while heap.first_key <= limit:
                done.append(heap.pop())
            if heap.n:
                active[kept] = r
                kept += 1
        if not done:
            return done
        for job in done:
            kind = job.kind
            self.jobs -= 1
            self.demand -= kind.demand
            if job.long:
                self.long_demand -= kind.demand
            if kind.batch > 0 and self.overrides:
                c = self.executions[kind.model] - 1
                if c:
                    self.executions[kind.model] = c
                else:
                    del self.executions[kind.model]
        if self.jobs == 0:
            self.demand = self.long_demand = 0.0  # no rounding left behind
        if kept < len(active):
            del active[kept:]
        waiting = self.waiting
        while self.waiting_head < len(waiting) and (self.jobs == 0 or self.demand - self.long_demand < self.gate):
            job = waiting[self.waiting_head]
            waiting[self.waiting_head] = None
            self.waiting_head += 1
            self._run(job)
        if self.waiting_head > 64 and self.waiting_head * 2 > len(waiting):
            del waiting[:self.waiting_head]
            self.waiting_head = 0
        self.dirty = True
        self.version += 1
        if len(done) > 1:
            done.sort(key=_start_order)
        return done


def _start_order(job: Job) -> int:
    return job.seq
