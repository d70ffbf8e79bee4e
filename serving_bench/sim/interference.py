"""Fitting and choosing a device's sharing law (:class:`serving_bench.profiles.law.Law`, which the simulator runs as
:class:`serving_bench.sim.device.Law`) from co-located runs.

A profile's solo runs give each batch's and each request's demand; how the device shares itself when the demand
exceeds it is the law, with at most two parameters. They are fitted from a few co-located closed-loop runs
(*observations*: which models, how many instances and clients each, the measured throughput of each) by running the
same configurations through the simulator and minimising the mean absolute log error of the throughputs. The wait
for a core (``+wait``) is measured where a profile could (``calibrate.waits.quiet_wait``), else fitted on p99s:
of the light closed loops and of open-loop runs (Poisson arrivals at given rates, replayed in the simulator from the
same seed), whose throughput is their offered load and says nothing. Which law to use is chosen by held-out error
(:func:`leave_one_out`), never by goodness of fit: a law with more parameters always fits its own data at least as
well. An ensemble's own time beyond its members' is measured against the simulator the same way
(:func:`alone_latency`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from serving_bench.profiles.law import Law
from serving_bench.profiles.schema import Profile
from serving_bench.run.metrics import summarize
from serving_bench.run.records import Records
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop
from serving_bench.serving_config import ModelServing, ServingConfig
from serving_bench.sim.target import SimTarget

ETA_RANGE = (0.25, 1.5)  # effective capacity as a share of the device's
CURVE_RANGES = {"alpha": (0.01, 1.0), "sigma": (0.01, 2.0), "kappa": (0.0005, 0.2)}  # the overlap laws' (a GPU's)
CURVE_PARAMETERS = {"overlap": ("alpha",), "overlap_sat": ("sigma",), "overlap_usl": ("sigma", "kappa")}
CURVE_START = {"alpha": 1.0, "sigma": 1.0, "kappa": 0.0005}  # where their search starts: no overlap, no coherence
BOUNDED = {"eta": ETA_RANGE}  # the law's throughput parameters whose fit says nothing at a bound of its range
PINNED_SHARE = 0.01  # ... within this share of the range's width of a bound
POWERS = (1.0, 2.0, 4.0)  # the soft law's onset sharpness, searched on this grid
SIM_SECONDS = 0.5  # simulated closed-loop seconds per observation, at least
TAIL_SECONDS = 1.0  # ... where its p99 is compared
ANSWERS = 20  # ... or long enough for its slowest model to answer this many times at its measured rate
TAIL_ANSWERS = 100  # ... this many where its p99 is compared
LONGEST_SECONDS = 5.0  # ... at most
MAX_RATE_RPS = 10_000  # per stream: the schedule a simulated closed loop draws its requests from holds this many/s


@dataclass(frozen=True)
class Observation:
    """One co-located run on ``device``: per model how it was served (a :class:`ModelServing`, its instances
    included), its closed-loop clients (requests of ``rows`` rows) and the measured answered requests per second;
    the ensembles its clients call (members in step order, and each step's needs as ``ServingConfig.ensemble_deps``
    gives them; without those, a chain). An *open-loop* run has ``rates`` instead of clients: one-row requests at
    Poisson times of those rates (req/s) for ``seconds``, drawn by :func:`open_schedule` from ``seed``; only its p99s
    (from the intended times) are compared. ``threads``: the runtime threads each instance had (0: the server's
    default, ``ServingConfig.instance_threads``)."""

    device: str
    serving: Mapping[str, ModelServing]
    clients: Mapping[str, int]
    measured_rps: Mapping[str, float]
    rows: int = 1
    ensembles: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # clients may call them
    measured_p99: Mapping[str, float] = dataclasses.field(default_factory=dict)  # s, where measured (the wait's fit)
    ensemble_deps: Mapping[str, tuple[tuple[int, ...], ...]] = dataclasses.field(default_factory=dict)  # step graphs
    rates: Mapping[str, float] = dataclasses.field(default_factory=dict)  # an open-loop run's req/s per model
    seconds: float = 0.0  # an open-loop run's length
    seed: int = 0  # an open-loop run's arrivals
    threads: int = 0  # runtime threads per instance (0: the server's default)

    @property
    def instances(self) -> dict[str, int]:
        return {m: s.instance_count for m, s in self.serving.items()}

    @property
    def streams(self) -> tuple[str, ...]:
        """The models (and ensembles) it sent requests to."""
        return tuple(sorted(self.rates or self.clients))

    def to_json(self) -> dict:
        out = {"device": self.device, "clients": dict(self.clients), "measured_rps": dict(self.measured_rps),
               "rows": self.rows, "serving": {m: dataclasses.asdict(s) for m, s in self.serving.items()}}
        if self.ensembles:
            out["ensembles"] = {e: list(members) for e, members in self.ensembles.items()}
        if self.measured_p99:
            out["measured_p99"] = dict(self.measured_p99)
        if self.ensemble_deps:
            out["ensemble_deps"] = {e: [list(d) for d in deps] for e, deps in self.ensemble_deps.items()}
        if self.rates:
            out.update(rates=dict(self.rates), seconds=self.seconds, seed=self.seed)
        if self.threads:
            out["threads"] = self.threads
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> "Observation":
        serving = {m: serving_from_json(s) for m, s in data["serving"].items()}
        return cls(data["device"], serving, dict(data["clients"]), dict(data["measured_rps"]),
                   int(data.get("rows", 1)), {e: tuple(m) for e, m in (data.get("ensembles") or {}).items()},
                   dict(data.get("measured_p99") or {}),
                   {e: tuple(tuple(d) for d in deps) for e, deps in (data.get("ensemble_deps") or {}).items()},
                   dict(data.get("rates") or {}), float(data.get("seconds", 0.0)), int(data.get("seed", 0)),
                   int(data.get("threads", 0)))

    def label(self) -> str:
        if self.rates:
            return " + ".join(f"{m} x{self.instances[m]} ({self.rates[m]:.1f} req/s)" for m in self.streams)
        return " + ".join(f"{m} x{self.instances[m]} ({self.clients[m]} clients)" for m in sorted(self.clients))


def open_schedule(rates: Mapping[str, float], seconds: float, seed: int) -> Schedule:
    """One-row requests of each model at Poisson times of its rate (req/s) for ``seconds``, merged in time order
    (each model's arrivals drawn from ``seed`` and its place in sorted order): an open-loop observation's schedule,
    the same for the measurement and the simulation."""
    names = tuple(sorted(rates))
    times = []
    for i, m in enumerate(names):  # a Poisson process: a Poisson count of uniform times
        rng = np.random.default_rng([seed, i])
        times.append(np.sort(rng.uniform(0.0, seconds, rng.poisson(rates[m] * seconds))))
    t = np.concatenate(times)
    model = np.concatenate([np.full(len(x), i, dtype=np.int32) for i, x in enumerate(times)])
    order = np.argsort(t, kind="stable")
    n = len(t)
    return Schedule(t[order], model[order], names, np.zeros(n, dtype=np.int32), np.ones(n, dtype=np.int32),
                    {"duration_s": seconds, "seed": seed})


def serving_from_json(data: Mapping) -> ModelServing:
    """A :class:`ModelServing` from ``dataclasses.asdict`` of one (lists back to tuples)."""
    return ModelServing(**{**data, "preferred_batch_sizes": tuple(data.get("preferred_batch_sizes", ())),
                           "instances": tuple(tuple(i) for i in data["instances"])})


def with_law(profile: Profile, device: str, law: Law) -> Profile:
    """The profile with ``device`` shared by ``law``."""
    devices = dict(profile.devices)
    devices[device] = dataclasses.replace(devices[device], law=law)
    return dataclasses.replace(profile, devices=devices)


def sim_seconds(obs: Observation, tail: bool = False) -> float:
    """Simulated seconds for ``obs``: :data:`SIM_SECONDS` (:data:`TAIL_SECONDS` for a p99), or long enough for its
    slowest model to answer :data:`ANSWERS` (:data:`TAIL_ANSWERS`) times at its measured rate, at most
    :data:`LONGEST_SECONDS`. (A resnet50 beside five tiny models answers ~6 times a second: half a second held
    three answers, so a start-up transient alone could make it 0.)"""
    if obs.rates:
        return obs.seconds
    least, answers = (TAIL_SECONDS, TAIL_ANSWERS) if tail else (SIM_SECONDS, ANSWERS)
    slowest = min((r for r in obs.measured_rps.values() if r > 0), default=math.inf)
    return min(max(least, answers / slowest), max(least, LONGEST_SECONDS))


def simulate(profile: Profile, obs: Observation, seconds: float = SIM_SECONDS, seed: int = 0) -> Records:
    """The simulator's records of the observation's configuration: its closed loops for ``seconds`` (an open-loop
    run: its own schedule, ``seconds`` unused)."""
    config = ServingConfig(tuple(obs.serving.values()), tuple(obs.ensembles.items()),
                           tuple(obs.ensemble_deps.items()), obs.threads)
    if obs.rates:
        return SimTarget(profile, config, seed=seed).run(open_schedule(obs.rates, obs.seconds, obs.seed))
    schedule = Schedule.closed_loop({m: obs.rows for m in sorted(obs.clients)}, int(MAX_RATE_RPS * seconds) + 1,
                                    {"duration_s": seconds})
    return SimTarget(profile, config, seed=seed).run(schedule, ClosedLoop(dict(obs.clients), seconds))


def alone_latency(profile: Profile, config: ServingConfig, name: str, send_s: np.ndarray, seeds: int = 3) -> np.ndarray:
    """The simulated latency (s) of each one-row request to ``name`` (a model or an ensemble of ``config``) alone at
    ``send_s`` (s from the run's start, increasing): one row per seed 0, 1, ...; NaN where a request was not answered.
    What a profile's ensemble is measured against (``calibrate.cold.ensemble_extra``)."""
    schedule = Schedule.at_times(send_s, name)
    out = np.full((seeds, len(schedule)), np.nan)
    for seed in range(seeds):
        table = SimTarget(profile, config, seed=seed).run(schedule).table
        ok = table[table["status"].astype(str) == "ok"]
        out[seed, ok["request_id"].to_numpy()] = (ok["done_s"] - ok["intended_s"]).to_numpy()
    return out


def answered(records: Records, seconds: float):
    """The rows of the requests answered within ``seconds`` (a closed loop's last answers trail its end: those after
    it do not count, as in the measurement)."""
    table = records.table
    return table[(table["status"].astype(str) == "ok") & (table["done_s"] <= seconds)]


def throughput(records: Records, seconds: float) -> dict[str, float]:
    """Answered requests per second per model over ``seconds`` (:func:`answered`)."""
    table = records.table
    counts = answered(records, seconds).groupby("model", observed=True).size()
    return {str(m): float(counts.get(m, 0)) / seconds for m in table["model"].cat.categories}


def predict(profile: Profile, obs: Observation, seconds: float | None = None, seed: int = 0) -> dict[str, float]:
    """Simulated answered requests per second of each model (or ensemble) in the observation's configuration, over
    ``seconds`` (default :func:`sim_seconds`)."""
    seconds = sim_seconds(obs) if seconds is None else seconds
    return throughput(simulate(profile, obs, seconds, seed), seconds)


def _log_error(pairs: Iterable[tuple[Mapping[str, float], Mapping[str, float]]]) -> float:
    """Mean absolute log error of simulated against measured figures over ``(measured, simulated)`` pairs of
    per-model figures (the measured ones that are 0 are left out)."""
    errs = [abs(math.log(max(simulated.get(m, 0.0), 1e-9) / value))
            for measured, simulated in pairs for m, value in measured.items() if value > 0]
    return float(np.mean(errs)) if errs else 0.0


def error(profile: Profile, observations: Sequence[Observation]) -> float:
    """Mean absolute log error of simulated against measured throughput over every model of every closed-loop
    observation."""
    return _log_error((obs.measured_rps, predict(profile, obs)) for obs in closed(observations))


def closed(observations: Sequence[Observation]) -> list[Observation]:
    """The closed-loop observations: those whose throughput says something of the law."""
    return [obs for obs in observations if not obs.rates]


def percentiles(records: Records, seconds: float, qs: Sequence[float] = (99,)) -> dict[str, dict[float, float]]:
    """Per model that answered, the percentiles ``qs`` of the answered requests' latency (send to answer, s) within
    ``seconds``."""
    ok = answered(records, seconds)
    latency = (ok["done_s"] - ok["sent_s"]).to_numpy()
    models = ok["model"].astype(str).to_numpy()
    return {m: {q: float(np.percentile(latency[models == m], q)) for q in qs} for m in np.unique(models)}


def p99(records: Records, seconds: float) -> dict[str, float]:
    """Per model the 99th percentile of the answered requests' latency (send to answer, s) within ``seconds``."""
    return {m: values[99] for m, values in percentiles(records, seconds).items()}


def simulated_p99(profile: Profile, obs: Observation) -> dict[str, float]:
    """Per model the simulated p99 (s) of the observation's configuration, over :func:`sim_seconds` of a tail (an
    open-loop run: every answer)."""
    seconds = sim_seconds(obs, tail=True)
    return p99(simulate(profile, obs, seconds), math.inf if obs.rates else seconds)


def simulated_figures(profile: Profile, obs: Observation, tail: bool = True) -> dict[str, dict[str, float | None]]:
    """Per entry the simulated ``throughput_rps`` (req/s), ``p50_ms`` and ``p99_ms`` (ms) of the observation's
    configuration, as it was measured: an open loop (``obs.rates``) from the intended time over its schedule, a
    closed loop from the send over :func:`sim_seconds` (``tail``: long enough for a p99)."""
    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1e3

    if obs.rates:
        models = summarize(simulate(profile, obs))["models"]
        return {m: {"throughput_rps": v["throughput_rps"], "p50_ms": ms(v["p50_s"]), "p99_ms": ms(v["p99_s"])}
                for m, v in models.items() if m in obs.rates}
    seconds = sim_seconds(obs, tail=tail)
    records = simulate(profile, obs, seconds)
    rps, latency = throughput(records, seconds), percentiles(records, seconds, (50, 99))
    return {m: {"throughput_rps": rps.get(m, 0.0), "p50_ms": ms(latency.get(m, {}).get(50)),
                "p99_ms": ms(latency.get(m, {}).get(99))} for m in obs.clients}


def tail_error(profile: Profile, observations: Sequence[Observation]) -> float:
    """Mean absolute log error of the simulated against the measured p99 over every model of every observation
    that measured one (each simulated for :func:`sim_seconds` of a tail: a p99 needs more answers than a throughput)."""
    return _log_error((obs.measured_p99, simulated_p99(profile, obs)) for obs in observations if obs.measured_p99)


_HELD: tuple[Profile, str] | None = None  # a worker process's profile and device (Simulations)


def _hold(profile: Profile, device: str) -> None:
    global _HELD
    _HELD = (profile, device)


def _held_figures(law: Law, tail: bool, obs: Observation) -> dict[str, float]:
    """In a worker: the observation simulated with the held device shared by ``law``, its throughputs (p99s for
    ``tail``)."""
    profile, device = _HELD
    return (simulated_p99 if tail else predict)(with_law(profile, device, law), obs)


class Simulations:
    """One profile's observations simulated with trial laws of one device: :meth:`error` is :func:`error` (or
    :func:`tail_error`) of the profile under a law. With ``workers`` > 1 the observations of a call are spread over as
    many processes, which receive the profile once (a copy sent with each simulation would rebuild its cached service
    tables every time: twice the work); the figures are the same (every simulation is seeded)."""

    def __init__(self, profile: Profile, device: str, workers: int = 1):
        self.profile, self.device = profile, device
        self._pool = (ProcessPoolExecutor(workers, initializer=_hold, initargs=(profile, device))
                      if workers > 1 else None)

    def __enter__(self) -> "Simulations":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def error(self, law: Law, observations: Sequence[Observation], tail: bool = False) -> float:
        """Mean absolute log error of the simulated throughputs (p99s for ``tail``) under ``law``."""
        if self._pool is None:
            return (tail_error if tail else error)(with_law(self.profile, self.device, law), observations)
        runs = [obs for obs in observations if obs.measured_p99] if tail else closed(observations)
        figures = self._pool.map(partial(_held_figures, law, tail), runs)
        return _log_error(((obs.measured_p99 if tail else obs.measured_rps), f) for obs, f in zip(runs, figures))


def pinned(law: Law) -> dict[str, tuple[float, float]]:
    """The law's throughput parameters the fit left on a bound of their search range (name -> the range): the
    calibration runs are slower (or faster) than any value the law allows explains them — a disturbed machine, or a
    mechanism the law lacks — so the value is a censored guess, not a measurement."""
    out = {}
    for key, (lo, hi) in BOUNDED.items():
        value = getattr(law, key)
        if value is not None and min(value - lo, hi - value) <= PINNED_SHARE * (hi - lo):
            out[key] = (lo, hi)
    return out


def tail_runs(profile: Profile, device: str, observations: Sequence[Observation]) -> list[Observation]:
    """The runs a wait for a core is fitted on: the open-loop ones and the closed loops whose clients do not
    outnumber the device's cores (all, if none). With more clients than cores every thread queues for one, a tail
    that sharing the cores already gives on average and that the wait behind a long execution must not be stretched
    to explain (fitted on those too, it over-predicted an open loop's p99 at light load by up to 77 %,
    docs/notes/sim-history.md, "Waiting for a core")."""
    cores = profile.devices[device].capacity
    light = [obs for obs in observations if obs.rates or sum(obs.clients.values()) <= cores]
    return light or list(observations)


def _golden(f: Callable[[float], float], lo: float, hi: float, steps: int = 14) -> tuple[float, float]:
    """Minimise ``f`` on [lo, hi] by golden-section search (``steps`` evaluations after two); (argmin, min)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (c, fc) if fc <= fd else (d, fd)


FORMS = ("pool", "pool_eff", "soft", "pool+psi", "pool_eff+psi", "soft+psi",  # what the fit can choose among
         "pool_eff+wait", "pool_eff+wait+drift", "pool_eff+wait+queue")
PSI_RANGE = (0.1, 1.0)  # the share of the measured hand-off demand that competes for the cores
WAIT_P_RANGE = (0.001, 1.0)  # the probability that a way in or out waits for a core taken by a long execution
WAIT_S_RANGE = (2e-4, 1e-2)  # the scheduler's slice, s


def fit(profile: Profile, device: str, observations: Sequence[Observation], form: str,
        workers: int = 1, measured: Mapping[str, float] | None = None) -> tuple[Law, float]:
    """The parameters of ``form`` (a law's name, with ``+psi`` to fit the hand-off share too, ``+wait`` the
    wait for a core, ``+drift`` the host's speed followed as measured and ``+queue`` a run queue for the instances'
    take-ups with its gate at the law's effective cores, neither fitted: :data:`FORMS`) that fit ``observations``
    best, by golden-section search one parameter at a time (two rounds when there are two or more): the law's own and
    ``psi`` on the throughputs (:func:`error`), the wait's on the p99s (:func:`tail_error`) unless ``measured`` gives
    them (``wait_p``, ``wait_s``, ... as ``calibrate.waits.quiet_wait`` measures them: taken as they are); (law,
    mean absolute log error of the throughputs). The simulations of each step are spread over ``workers`` processes
    (:class:`Simulations`; no more than there are observations, the most a step runs at once)."""
    name, *extras = form.split("+")
    tails = tail_runs(profile, device, observations)
    fit_wait = "wait" in extras and not measured
    searched = ([("eta", ETA_RANGE, False, closed(observations))] if name in ("pool_eff", "soft") else []) + \
        [(key, CURVE_RANGES[key], False, closed(observations)) for key in CURVE_PARAMETERS.get(name, ())] + \
        ([("psi", PSI_RANGE, False, closed(observations))] if "psi" in extras else []) + \
        ([("wait_p", WAIT_P_RANGE, True, tails), ("wait_s", WAIT_S_RANGE, True, tails)]
         if fit_wait else [])  # (parameter, its range, fitted on the p99s, on these runs)
    law = Law(name, **_start(name, extras, searched, measured))
    with Simulations(profile, device, min(workers, len(closed(observations)) or 1)) as sims:
        for _ in range(2 if len(searched) > 1 else 1):
            for key, bounds, on_tails, runs in searched:
                value, _ = _golden(lambda v: sims.error(law.replace(**{key: v}), runs, on_tails),
                                   *bounds, steps=7 if on_tails else 10)
                law = law.replace(**{key: value})
        err = sims.error(law, observations)
        if name == "soft":  # the onset's sharpness: the best of a few
            best = (law, err)
            for power in POWERS[:-1]:
                candidate = law.replace(power=power)
                e = sims.error(candidate, observations)
                if e < best[1]:
                    best = (candidate, e)
            law, err = best
    return law, err


def _start(name: str, extras: Sequence[str], searched: Sequence[tuple], measured: Mapping[str, float] | None
           ) -> dict[str, float]:
    """The parameters a fit of the law ``name`` with ``extras`` starts from: the searched ones at 1 (the wait's at a
    rare wait of a few milliseconds), ``measured`` as they are, ``drift`` and ``queue`` at 1 (not fitted)."""
    params: dict[str, float] = {"power": POWERS[-1]} if name == "soft" else {}
    params.update({k: CURVE_START.get(k, 1.0) for k, _, on_tails, _ in searched if not on_tails})
    if "wait" in extras:  # a start for the search: a rare wait, a slice of a few milliseconds
        params.update(measured or {"wait_p": 0.05, "wait_s": 3e-3})
    if "drift" in extras:  # the phases follow the host's speed as measured (not fitted)
        params["drift"] = 1.0
    if "queue" in extras:  # a take-up waits while short work takes the cores (sim.device.Law; not fitted)
        params["queue"] = 1.0
    return params


def leave_one_out(profile: Profile, device: str, observations: Sequence[Observation],
                  names: Sequence[str] = FORMS) -> dict[str, float]:
    """Per form, the mean absolute log error on each closed-loop observation of the law fitted on the others."""
    out = {}
    for name in names:
        errs = []
        for i, held in enumerate(observations):
            if held.rates:  # an open loop's throughput is its offered load
                continue
            law, _ = fit(profile, device, [o for j, o in enumerate(observations) if j != i], name)
            errs.append(error(with_law(profile, device, law), [held]))
        out[name] = float(np.mean(errs)) if errs else math.nan
    return out
