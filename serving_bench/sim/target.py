"""``SimTarget(profile, serving_config, seed=0).run(schedule) -> Records``: the simulator as a Target.

It returns the :class:`~serving_bench.run.records.Records` of every target (``sent_s = intended_s``: the simulated
client is never late), so :func:`serving_bench.run.metrics.summarize` works unchanged on simulated and replayed runs.
Same schedule, profile, config and seed give identical records. ``engine="fast"`` (default) and ``engine="simpy"``
(the SimPy reference, slower) give identical records too. Open loop only, for now (a :class:`ClosedLoop` raises
``NotImplementedError``).

Besides the table, ``records.info.sim`` (:class:`~serving_bench.run.records.SimFacts`) holds what only a simulator
knows: per-model busy time, executed batches and items per executed batch (Triton's ``inference_count /
execution_count``), mean time inside the server per answered request (Triton's ``success`` time: no client/network
overhead), utilisation (busy instance-seconds over instances x makespan), per-device busy time, the engine and the seed.

    from serving_bench.profiles import Profile
    from serving_bench.serving_config import ServingConfig
    records = SimTarget(Profile.load("p.json"), ServingConfig.from_repo("model_repo/")).run(schedule)
"""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pandas as pd

from serving_bench.errors import InputError
from serving_bench.profiles.schema import Profile
from serving_bench.run.records import STATUSES, Records, SimFacts, new_records
from serving_bench.run.schedule import Schedule
from serving_bench.run.target import ClosedLoop, OpenLoop
from serving_bench.serving_config import ServingConfig
from serving_bench.sim.core import Server
from serving_bench.sim.fast import run_fast
from serving_bench.sim.reference import run_simpy
from serving_bench.sim.spec import SimSpec, build_spec

ENGINES = ("fast", "simpy")


class SimTarget:
    """The calibrated simulator behind the Target interface. Construction checks profile against config (one-line
    :class:`InputError` naming the profile file and field); it writes nothing."""

    name = "sim"

    def __init__(self, profile: Profile, serving_config: ServingConfig, seed: int = 0, *, engine: str = "fast",
                 ensemble_deps: dict[str, tuple] | None = None):
        if engine not in ENGINES:
            raise InputError("--engine", None, f"expected one of {', '.join(ENGINES)}, got {engine!r}")
        self.profile = profile
        self.config = serving_config
        self.seed = int(seed)
        self.engine = engine
        self.spec: SimSpec = build_spec(profile, serving_config, ensemble_deps)

    # -- the Target interface ----------------------------------------------------------------------------------------
    def run(self, schedule: Schedule, mode: OpenLoop | ClosedLoop | None = None) -> Records:
        """Simulate ``schedule`` open loop (``mode`` None or :class:`OpenLoop`; its cap is not modelled)."""
        if isinstance(mode, ClosedLoop):
            raise NotImplementedError("the simulator's closed loop: issue 10")
        spec = self.spec
        kinds = []
        for name in schedule.models:
            kind = spec.served_index(name)
            if kind is None:
                raise InputError(self.profile.path or "profile", f"models.{name}",
                                 f"the schedule sends requests to {name!r}, which the serving config/profile lack; "
                                 f"served: {', '.join(m.name for m in spec.models) or 'none'}")
            kinds.append(kind)
        records = new_records(schedule, target="sim")
        n = len(schedule)
        arrival = schedule.arrival_s
        batch = schedule.batch.astype(np.int64)
        code = schedule.model
        run = _Run(spec, self.seed, n)
        order = np.argsort(arrival, kind="stable")
        since = np.empty(n)  # time since the previous request reached the server (any model): cold-start extras
        since[order] = np.diff(arrival[order], prepend=-np.inf)
        run.since = since
        dispatch_rng = np.random.default_rng((self.seed, 3))

        # requests per served model / ensemble, in arrival order; over-large batches fail at validation
        for s_index, (kind, index) in enumerate(kinds):
            ids = np.flatnonzero(code == s_index)
            if kind == "model":
                ms = spec.models[index]
                items = batch[ids] if ms.max_batch > 0 else np.ones(len(ids), dtype=np.int64)
                bad = items > ms.max_batch if ms.max_batch > 0 else np.zeros(len(ids), dtype=bool)
                run.error_ids.append(ids[bad])
                ids, items = ids[~bad], items[~bad]
                times = arrival[ids]
                if ms.dispatch_grid:  # the measured time before the batcher has the request (plus its cold extra)
                    grid = np.asarray(ms.dispatch_grid)
                    times = times + np.interp(dispatch_rng.random(len(ids)), np.linspace(0.0, 1.0, len(grid)), grid)
                    idle = ms.idle.get(ms.instance_devices[0]) if ms.instance_devices else None
                    if idle is not None and idle.dispatch_extra_s:
                        times = times + np.interp(since[ids], idle.overhead_gap_s, idle.dispatch_extra_s)
                    by_time = np.argsort(times, kind="stable")
                    ids, items, times = ids[by_time], items[by_time], times[by_time]
                run.add_source(index, ids, times, items)
            else:
                run.add_ensemble_source(index, ids, arrival[ids], batch[ids])
        collect = gc.isenabled()
        gc.disable()  # millions of short-lived acyclic objects: the cyclic collector would only cost time
        try:
            server = run.execute(self.engine)
        finally:
            if collect:
                gc.enable()
        facts = self._fill(records.table, run, server, schedule)
        return Records(records.table, dataclasses.replace(records.info, mode=OpenLoop.name, sim=facts))

    # -- records ------------------------------------------------------------------------------------------------------
    def _fill(self, records: pd.DataFrame, run: "_Run", server: Server, schedule: Schedule) -> SimFacts:
        spec = self.spec
        n = len(schedule)
        done = np.full(n, np.nan)
        status = np.full(n, STATUSES.index("error"), dtype=np.int8)
        exec_batch = np.full(n, -1, dtype=np.int32)
        instance = np.full(n, -1, dtype=np.int32)
        error = np.full(n, "", dtype=object)
        overhead_grid_of = np.zeros(n, dtype=np.int32)  # which overhead grid each request uses (index into grids)
        grids = [m.overhead_grid for m in spec.models] + [e.overhead_grid for e in spec.ensembles]
        idles = [m.idle.get(m.instance_devices[0]) if m.instance_devices else None for m in spec.models] + \
            [None] * len(spec.ensembles)
        seen = np.zeros(n, dtype=bool)

        for st in server.models:
            owners = np.asarray(st.owner, dtype=np.int64)
            m = st.m
            if st.out_a:
                a = np.asarray(st.out_a, dtype=np.int64)
                lengths = np.asarray(st.out_b, dtype=np.int64) - a
                local = _expand(a, lengths)
                who = owners[local]
                direct = who >= 0
                ids = who[direct]
                done[ids] = np.repeat(np.asarray(st.out_t), lengths)[direct]
                status[ids] = STATUSES.index("ok")
                exec_batch[ids] = np.repeat(np.asarray(st.out_items, dtype=np.int32), lengths)[direct]
                instance[ids] = np.repeat(np.asarray(st.out_inst, dtype=np.int32), lengths)[direct]
                overhead_grid_of[ids] = m
                seen[ids] = True
            for a, b, t in st.timed_out:
                who = owners[a:b]
                ids = who[who >= 0]
                # the server answers "Request timeout expired" at t; like a client deadline, a timeout has no
                # done_s in the records contract (tests/conformance.py)
                status[ids] = STATUSES.index("timeout")
                error[ids] = "Request timeout expired"
                overhead_grid_of[ids] = m
                seen[ids] = True
                for o in who[who < 0]:
                    run.ensemble_failed(int(o), "timeout", t)
            for owner, t in st.rejected:
                if owner >= 0:
                    done[owner] = t
                    status[owner] = STATUSES.index("rejected")
                    error[owner] = "Exceeds maximum queue size"
                    overhead_grid_of[owner] = m
                    seen[owner] = True
                else:
                    run.ensemble_failed(owner, "rejected", t)
        for ids in run.error_ids:
            done[ids] = records["intended_s"].to_numpy()[ids]
            error[ids] = "inference request batch-size exceeds the model's max_batch_size"
            seen[ids] = True
        for e_index, rid, t_done, outcome in run.ensemble_outcomes():
            done[rid] = t_done if outcome != "timeout" else np.nan
            status[rid] = STATUSES.index(outcome)
            if outcome != "ok":
                error[rid] = "Request timeout expired" if outcome == "timeout" else "Exceeds maximum queue size"
            overhead_grid_of[rid] = len(spec.models) + e_index
            seen[rid] = True
        unseen = ~seen
        if unseen.any():  # cannot happen with a well-formed model; reported, never hidden
            error[unseen] = "simulation ended before this request finished"
            done[unseen] = np.nan

        # client/network overhead (all of it added on the return path: the server sees the request at its send time
        # plus the model's dispatch time), one draw per request, plus the model's cold-start extra for the time since
        # the previous request reached the server (any model)
        rng = np.random.default_rng((self.seed, 2))
        u = rng.random(n)
        extra = np.zeros(n)
        intended = records["intended_s"].to_numpy()
        since = run.since
        for g_index, grid in enumerate(grids):
            sel = overhead_grid_of == g_index
            if sel.any():
                xs = np.linspace(0.0, 1.0, len(grid))
                extra[sel] = np.interp(u[sel], xs, np.asarray(grid))
                idle = idles[g_index]
                if idle is not None:
                    extra[sel] += np.interp(since[sel], idle.overhead_gap_s, idle.overhead_extra_s)
        ok = status == STATUSES.index("ok")
        server_mean = {}
        for st in server.models:  # time inside the server (arrival to answer, no client/network overhead)
            sel = ok & (overhead_grid_of == st.m)
            server_mean[st.spec.name] = float(np.mean(done[sel] - intended[sel])) if sel.any() else None
        records["sent_s"] = records["intended_s"].to_numpy().copy()
        records["done_s"] = done + extra
        records["status"] = pd.Categorical.from_codes(status, categories=list(STATUSES))
        records["error"] = error
        records["exec_batch"] = exec_batch
        records["instance"] = instance
        makespan = float(np.nanmax(records["done_s"].to_numpy())) if n and not np.isnan(done).all() else 0.0
        duration = max(schedule.duration_s, makespan, 1e-12)
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


def _expand(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``range(s, s + l)`` for each pair, vectorised."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + (np.arange(total) - offsets)


class _Run:
    """One run's inputs and ensemble bookkeeping, shared by both engines."""

    def __init__(self, spec: SimSpec, seed: int, n: int):
        self.spec = spec
        self.seed = seed
        self.sources: dict[int, tuple] = {}
        self.error_ids: list[np.ndarray] = []
        self.ens_sources: dict[int, tuple] = {}
        self.ens: list = []  # slot -> [rid, e_index, done_steps(set), issued(set), fail(outcome, t) | None, t_done]
        self.n = n
        self.since: np.ndarray | None = None  # per request: time since the previous request (cold starts)
        members = {m for e in spec.ensembles for m in e.steps}
        self.dynamic_models = members

    def add_source(self, m: int, ids, times, items) -> None:
        self.sources[m] = (np.asarray(times, dtype=np.float64), np.asarray(ids, dtype=np.int64),
                           np.asarray(items, dtype=np.int64))

    def add_ensemble_source(self, e: int, ids, times, items) -> None:
        self.ens_sources[e] = (np.asarray(times, dtype=np.float64), np.asarray(ids, dtype=np.int64),
                               np.asarray(items, dtype=np.int64))

    def static_lists(self, m: int) -> tuple[list, list, list]:
        if m in self.dynamic_models or self.spec.models[m].max_queue_size:
            return [], [], []
        times, ids, items = self.sources.get(m, (np.zeros(0), np.zeros(0, dtype=np.int64),
                                                 np.zeros(0, dtype=np.int64)))
        return times.tolist(), ids.tolist(), items.tolist()

    def execute(self, engine: str) -> Server:
        spec = self.spec

        def factory(clock):
            server = Server(spec, clock, [self.static_lists(m.index) for m in spec.models], self.seed)
            for st in server.models:
                if st.m in self.dynamic_models or st.spec.max_queue_size:
                    st.static = False
            server.ensemble_step_done = lambda code, now: self._step_done(clock, code, now)
            self.clock = clock
            return server

        feeds = []  # (time, kind, payload) external arrivals the engine must deliver one by one
        for m, (times, ids, items) in self.sources.items():
            if m in self.dynamic_models or spec.models[m].max_queue_size:
                feeds.append((times, ids, items, ("model", m)))
        for e, (times, ids, items) in self.ens_sources.items():
            feeds.append((times, ids, items, ("ensemble", e)))
        if engine == "fast":
            return run_fast(factory, len(spec.models), feeds, self.ensemble_arrival)
        return run_simpy(factory, len(spec.models), feeds, self.ensemble_arrival)

    # -- ensembles ---------------------------------------------------------------------------------------------------
    def ensemble_arrival(self, e: int, rid: int, t: float, items: int) -> None:
        """An ensemble request reaches the server: issue the steps that need nothing."""
        slot = len(self.ens)
        ens = self.spec.ensembles[e]
        self.ens.append([rid, e, set(), set(), None, None, items])
        for step, deps in enumerate(ens.deps):
            if not deps:
                self._issue(slot, step, t)

    def _code(self, slot: int, step: int) -> int:
        return -1 - (slot * 64 + step)

    def _issue(self, slot: int, step: int, t: float) -> None:
        entry = self.ens[slot]
        entry[3].add(step)
        ens = self.spec.ensembles[entry[1]]
        self.clock.arrive(ens.steps[step], t + self.spec.step_s, self._code(slot, step), entry[6])

    def _step_done(self, clock, code: int, now: float) -> None:
        slot, step = divmod(-1 - code, 64)
        entry = self.ens[slot]
        entry[2].add(step)
        ens = self.spec.ensembles[entry[1]]
        if len(entry[2]) == len(ens.steps):
            entry[5] = now
            return
        for nxt, deps in enumerate(ens.deps):
            if nxt not in entry[3] and all(d in entry[2] for d in deps):
                self._issue(slot, nxt, now)

    def ensemble_failed(self, code: int, outcome: str, t: float) -> None:
        slot, _ = divmod(-1 - code, 64)
        entry = self.ens[slot]
        if entry[4] is None or t < entry[4][1]:
            entry[4] = (outcome, t)

    def ensemble_outcomes(self):
        for rid, e, _done, _issued, fail, t_done, _items in self.ens:
            if fail is not None:
                yield e, rid, fail[1], fail[0]
            elif t_done is not None:
                yield e, rid, t_done, "ok"
