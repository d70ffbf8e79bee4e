"""``SimTarget(profile, serving_config, seed=0).run(schedule, mode=None) -> Records``: the simulator as a Target.

It returns the :class:`~serving_bench.run.records.Records` of every target (``sent_s = intended_s``: the simulated
client is never late), so :func:`serving_bench.run.metrics.summarize` works unchanged on simulated and replayed runs.
Same schedule, profile, config and seed give identical records. ``engine="fast"`` (default) and ``engine="simpy"``
(the SimPy reference, slower) give identical records too. ``host_speed`` (default 1) runs the profile on a host whose
work takes that many times as long (:func:`serving_bench.sim.host_speed.at_host_speed`: what the replications of
:mod:`serving_bench.sim.intervals` draw).

Besides the table, ``records.info.sim`` (:class:`~serving_bench.run.records.SimFacts`) holds what only a simulator
knows: per-model busy time, executed batches and items per executed batch (Triton's ``inference_count /
execution_count``), mean time inside the server per answered request (queued and computed: no client/network
overhead), utilisation (busy instance-seconds over instances x makespan), per-device busy time, the engine and the
seed.

    from serving_bench.profiles import Profile
    from serving_bench.serving_config import ServingConfig, batch_refusal, triton_batch_answer
    records = SimTarget(Profile.load("p.json"), ServingConfig.from_repo("model_repo/")).run(schedule)
"""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pandas as pd

from serving_bench.errors import InputError
from serving_bench.profiles.schema import Profile
from serving_bench.run.records import STATUSES, Records, RunInfo, SimFacts, new_table
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop, OpenLoop
from serving_bench.serving_config import ServingConfig, batch_refusal, triton_batch_answer
from serving_bench.sim.core import Hooks, Server
from serving_bench.sim.fast import run_fast
from serving_bench.sim.host_speed import at_host_speed
from serving_bench.sim.reference import run_simpy
from serving_bench.sim.spec import SimSpec, build_spec
from serving_bench.sim.state import ModelState
from serving_bench.sim.workload import FAILURE_TEXT, Workload

ENGINES = ("fast", "simpy")


class SimTarget:
    """The calibrated simulator behind the Target interface. Construction checks profile against config (one-line
    :class:`InputError` naming the profile file and field); it writes nothing."""

    name = "sim"

    def __init__(self, profile: Profile, serving_config: ServingConfig, seed: int = 0, *, engine: str = "fast",
                 ensemble_deps: dict[str, tuple] | None = None, host_speed: float = 1.0):
        if engine not in ENGINES:
            raise InputError("--engine", None, f"expected one of {', '.join(ENGINES)}, got {engine!r}")
        self.profile = profile
        self.config = serving_config
        self.seed = int(seed)
        self.engine = engine
        _check_batch_range(profile, serving_config)
        self.spec: SimSpec = at_host_speed(build_spec(profile, _as_engine_runs(serving_config), ensemble_deps),
                                           host_speed)

    # -- the Target interface ----------------------------------------------------------------------------------------
    def run(self, schedule: Schedule, mode: OpenLoop | ClosedLoop | None = None) -> Records:
        """Records of ``schedule`` in open loop (``mode`` None or open) or closed loop (``mode.name == "closed"``:
        ``mode.per_model(models)`` clients per model or ensemble for ``mode.duration_s`` or the schedule's
        duration; requests never reached are not in the records, and ``intended_s = sent_s`` is the send time).
        A request larger than its model takes is answered as Triton answers it (status ``error``,
        :func:`triton_batch_answer`) in open loop, and refused up front in closed loop (:func:`check_batches`)."""
        spec = self.spec
        kinds = []
        for name in schedule.models:
            kind = spec.served_index(name)
            if kind is None:
                raise InputError(self.profile.path or "profile", f"models.{name}",
                                 f"the schedule sends requests to {name!r}, which the serving config/profile lack; "
                                 f"served: {', '.join(m.name for m in spec.models) or 'none'}")
            kinds.append(kind)
        closed = None
        if isinstance(mode, ClosedLoop):
            check_batches(schedule, self.config, schedule.meta.get("profile") or "schedule")  # no answer to wait on
            per = mode.per_model(schedule.models)
            closed = ({i: per[name] for i, name in enumerate(schedule.models)},
                      float(mode.duration_s or schedule.duration_s))
        workload = Workload(spec, self.seed, kinds, schedule.model, schedule.batch.astype(np.int64),
                            schedule.arrival_s, closed)
        collect = gc.isenabled()
        gc.disable()  # millions of short-lived acyclic objects: the cyclic collector would only cost time
        try:
            server = self._execute(workload)
        finally:
            if collect:
                gc.enable()
        table, facts = self._records(schedule, workload, server)
        return Records(table, RunInfo(target=self.name, meta=dict(schedule.meta), mode=(mode or OpenLoop()).name,
                                      sim=facts, concurrency=dict(mode.per_model(schedule.models))
                                      if closed is not None else None))

    def _execute(self, workload: Workload) -> Server:
        spec = self.spec
        report_all = workload.closed is not None or bool(workload.hosted)
        heard = spec.ensembles or report_all  # the answers and failures the workload hears of

        def factory(clock):
            server = Server(spec, clock, [workload.static_arrivals(m.index) for m in spec.models], self.seed,
                            Hooks(on_done=workload.on_done if heard else None,
                                  on_failed=workload.on_failed if heard else None,
                                  on_phase=workload.on_phase, report_all=report_all))
            for st in server.models:
                st.static = st.m not in workload.dynamic
            workload.start(clock, server)
            return server

        run = run_fast if self.engine == "fast" else run_simpy
        return run(factory, len(spec.models), workload.feeds)

    # -- records ------------------------------------------------------------------------------------------------------
    def _records(self, schedule: Schedule, workload: Workload, server: Server) -> tuple[pd.DataFrame, SimFacts]:
        """The run's records table and its :class:`SimFacts`: each request's outcome gathered from where the run
        decided it, then the table as the client saw it, then the facts of the run."""
        out = _Outcomes(len(schedule))
        server_mean = {st.spec.name: out.add_model(st) for st in server.models}
        errors = np.asarray(workload.errors, dtype=np.int64)  # requests larger than their model takes
        if len(errors):  # answered at once, status "error" (the table's default)
            out.done[errors] = workload.sent_s[errors]
            out.failures += self._refusals(schedule, errors)
            out.seen[errors] = True
        out.add_ensembles(workload.ensembles)
        unseen = ~out.seen & ~np.isnan(workload.sent_s)
        if unseen.any():  # cannot happen with a well-formed model; reported, never hidden
            out.failures.append((unseen, "simulation ended before this request finished"))
            out.done[unseen] = np.nan
        records = _table(schedule, workload, out)
        return records, self._facts(schedule, workload, server, records, server_mean)

    def _facts(self, schedule: Schedule, workload: Workload, server: Server, records: pd.DataFrame,
               server_mean: dict[str, float | None]) -> SimFacts:
        """What only the simulator knows of the run: its duration is the later of the schedule's end (a closed
        loop's duration) and the last answer in ``records``."""
        finished = records["done_s"].to_numpy()
        makespan = float(np.nanmax(finished)) if len(records) and not np.isnan(finished).all() else 0.0
        duration = max(schedule.duration_s if workload.closed is None else workload.duration_s, makespan, 1e-12)
        return SimFacts(
            engine=self.engine, seed=self.seed, profile=self.profile.path, duration_s=duration,
            busy_s={st.spec.name: st.busy_s for st in server.models},
            executions={st.spec.name: st.executions for st in server.models},
            server_mean_s=server_mean,
            items_per_execution={st.spec.name: st.executed_items / st.executions if st.executions else None
                                 for st in server.models},
            utilisation={st.spec.name: st.busy_s / (len(st.spec.instance_devices) * duration)
                         for st in server.models},
            device_busy_s={name: dev.busy_s for name, dev in server.devices.items()})

    def _refusals(self, schedule: Schedule, rows: np.ndarray) -> list[tuple[np.ndarray, str]]:
        """Triton's answer to each refused request of ``rows`` (:func:`triton_batch_answer`), as (rows, text)."""
        out = []
        keys = schedule.model[rows].astype(np.int64) * (int(schedule.batch.max()) + 1) + schedule.batch[rows]
        for key in np.unique(keys):
            same = rows[keys == key]
            name, batch = schedule.models[schedule.model[same[0]]], int(schedule.batch[same[0]])
            out.append((same, triton_batch_answer(name, self.config[name].max_batch_size, batch)))
        return out


class _Outcomes:
    """Each request's outcome as the run decided it, filled in source by source: its time at the server (``done``,
    seconds; NaN where none), ``status`` (codes of :data:`STATUSES`), the executed batch and the instance that ran
    it, ``failures`` ((request ids, error text), applied in order) and ``seen`` (an outcome is known)."""

    def __init__(self, n: int):
        self.done = np.full(n, np.nan)
        self.status = np.full(n, STATUSES.index("error"), dtype=np.int8)
        self.exec_batch = np.full(n, -1, dtype=np.int32)
        self.instance = np.full(n, -1, dtype=np.int32)
        self.failures: list[tuple[object, str]] = []
        self.seen = np.zeros(n, dtype=bool)

    def settle(self, ids, status: str, done_s=None, text: str | None = None) -> None:
        """Requests ``ids`` ended as ``status`` (at ``done_s`` where given; ``text``: the error they read)."""
        if done_s is not None:
            self.done[ids] = done_s
        self.status[ids] = STATUSES.index(status)
        if text is not None:
            self.failures.append((ids, text))
        self.seen[ids] = True

    def add_model(self, st: ModelState) -> float | None:
        """The outcomes a served model's state holds (its executions, timeouts and refusals; ensemble steps, with
        negative owners, are their ensemble's); returns its mean time inside the server per executed request (queued
        and computed: from reaching the batcher to the answer, Triton's queue + compute), None without one."""
        times, owners = st.arrivals()
        executed = st.executed.table()
        mean = None
        if len(executed):
            a = executed[:, 0].astype(np.int64)
            lengths = executed[:, 1].astype(np.int64) - a
            local = _expand(a, lengths)
            end = np.repeat(executed[:, 2], lengths)
            mean = float((end - times[local]).mean())
            who = owners[local]
            direct = who >= 0
            ids = who[direct]
            self.settle(ids, "ok", end[direct])
            self.exec_batch[ids] = np.repeat(executed[:, 3].astype(np.int32), lengths)[direct]
            self.instance[ids] = np.repeat(executed[:, 4].astype(np.int32), lengths)[direct]
        for a, b, _t in st.timed_out:
            who = owners[a:b]
            # the server answers "Request timeout expired"; like a client deadline, a timeout has no done_s in the
            # records contract (tests/conformance.py)
            self.settle(who[who >= 0], "timeout", text=FAILURE_TEXT["timeout"])
        for owner, t in st.rejected:
            if owner >= 0:
                self.settle(owner, "rejected", t, FAILURE_TEXT["rejected"])
        return mean

    def add_ensembles(self, ensembles) -> None:
        """The outcomes of the ensembles' requests (:class:`~serving_bench.sim.workload.EnsembleRequest`)."""
        for entry in ensembles:
            if entry.failure is not None:
                outcome, t = entry.failure
                self.settle(entry.rid, outcome, t if outcome != "timeout" else np.nan, FAILURE_TEXT[outcome])
            elif entry.answered_s is not None:
                self.settle(entry.rid, "ok", entry.answered_s)


def _table(schedule: Schedule, workload: Workload, out: _Outcomes) -> pd.DataFrame:
    """The records table of the outcomes ``out``, as the client saw them: each answer after its client/network
    overhead, all of it on the return path (the server sees a request its dispatch time after the send: one draw per
    request, plus the cold-start extra for the time since the previous request), or when the simulated way out
    ended. A closed loop's table holds only the requests it reached, renumbered."""
    records = new_table(schedule)
    sent = workload.sent_s
    done = out.done
    if workload.closed is not None:
        records["intended_s"] = sent
    records["sent_s"] = sent.copy()
    finished = np.where(np.isnan(done), np.nan, done + np.nan_to_num(workload.overhead_s))
    at_client = ~np.isnan(done) & ~np.isnan(workload.client_done_s)  # the way out was simulated
    finished[at_client] = workload.client_done_s[at_client]
    records["done_s"] = finished
    records["status"] = pd.Categorical.from_codes(out.status, categories=list(STATUSES))
    if out.failures:  # the table's error column is empty text until then
        error = np.full(len(schedule), "", dtype=object)
        for ids, text in out.failures:
            error[ids] = text
        records["error"] = error
    records["exec_batch"] = out.exec_batch
    records["instance"] = out.instance
    if workload.closed is not None:  # requests never reached are not part of a closed loop's run
        records = records[~np.isnan(sent)].reset_index(drop=True)
        records["request_id"] = np.arange(len(records), dtype=np.int64)
    return records


def check_batches(schedule: Schedule, config: ServingConfig, source) -> None:
    """Refuse, as ``replay`` does before sending anything, a schedule with requests larger than their model takes
    (:func:`batch_refusal`: above max_batch_size, or batched where it is 0): one :class:`InputError` naming
    ``source`` (the load profile) and the model's ``batch`` field."""
    for index, name in enumerate(schedule.models):
        if name in config.names:
            sizes = np.unique(schedule.batch[schedule.model == index])
            problem = next(filter(None, (batch_refusal(config[name].max_batch_size, int(b)) for b in sizes)), None)
            if problem:
                raise InputError(source, f"models.{name}.batch", problem)


def _as_engine_runs(config: ServingConfig) -> ServingConfig:
    """``config`` as the engine runs it: a model without a batch dimension (``max_batch_size`` 0) takes requests of
    one item only — Triton refuses any batched shape — which the engine does as ``max_batch_size`` 1 without
    dynamic batching: the same executions at the same cost, and the same refusals."""
    return dataclasses.replace(config, models=tuple(
        m.replace(max_batch_size=1, dynamic_batching=False) if m.max_batch_size == 0 else m for m in config.models))


def _check_batch_range(profile: Profile, config: ServingConfig) -> None:
    """A ``max_batch_size`` above every batch size the profile measured on a device of the model, refused before the
    engine lays out a cost table that large (sizes outside the measured range are not extrapolated)."""
    for ms in config.models:
        model = profile.models.get(ms.name)
        for device, _ in ms.instances:
            sizes = model.devices[device].batch_sizes if model is not None and device in model.devices else ()
            top = max(sizes, default=None)  # None: the spec names what is missing
            if top is not None and ms.max_batch_size > top:
                raise InputError(profile.path or "profile", f"models.{ms.name}.devices.{device}.batches",
                                 f"the config needs batch size {top + 1} (max_batch_size {ms.max_batch_size}) but "
                                 f"the profile measured {list(sizes)}; sizes outside the measured range are not "
                                 "extrapolated")  # as the spec says it, before it lays out a table that large


def _expand(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``range(s, s + l)`` for each pair, vectorised."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + (np.arange(total) - offsets)
