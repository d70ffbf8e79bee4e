"""What the simulated clients send, and what became of it: one run's requests, per served model and ensemble.

* **Open loop**: every request at its scheduled time. It reaches its model's batcher a *dispatch* time later (one
  draw per request from the model's measured distribution, plus the cold-start extra for the time since the previous
  request reached the server); requests of models whose arrivals need no event each (no ensemble member, no queue
  limit) are handed to the engine as sorted lists, the others are fed one event per request.
* **Closed loop** (perf_analyzer's concurrency mode, as :class:`~serving_bench.load.driver.TritonTarget` runs it):
  ``concurrency`` clients per stream (a served model or ensemble the schedule calls), all sending at 0; each sends
  the stream's next request of the schedule when its previous one is answered at the client (the server's answer
  plus the request's return *overhead*), until ``duration_s``; requests never reached are not part of the run.
* **The host's cores** (where the profile says): a request's way in (the dispatch draw) and way out (the overhead
  draw) are work on the cores it shares with the batches (:meth:`Server.start_phase`), so they stretch when the
  cores are busy; otherwise they are plain delays.
* **Ensembles**: a request takes its first step's member's way in and its last step's member's way out
  (``EnsembleSpec.entry``, ``exit``); its steps are issued when their inputs are ready (``ensemble_step_s`` later,
  plus on a CPU host the wait for a core of the thread handing the step over, as a way out waits), each as a request
  to the member model with a negative owner naming (slot, step); the ensemble is answered when every step is, and
  fails with its first failed step.

A way in or out is a job whose payload is the request's row: ``rid`` on its way in, ``-1 - rid`` on its way out.

Per request ``rid`` (its schedule row): uniforms fixed by the seed — one for the dispatch draw, one for the overhead
draw, one per way and per ensemble step for the wait for a core — so a request's draws do not depend on the order
events happen in.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from math import inf as INF

import numpy as np

from serving_bench.profiles.distributions import recent_means
from serving_bench.sim.drift import at as drift_at, follow
from serving_bench.sim.spec import SimSpec
from serving_bench.sim.state import recent_mean

EXCEEDS_BATCH = "inference request batch-size exceeds the model's max_batch_size"
FAILURE_TEXT = {"timeout": "Request timeout expired", "rejected": "Exceeds maximum queue size"}


@dataclass
class EnsembleRequest:
    """One ensemble request in flight: its record, ensemble, rows, the steps issued and done, its first failure
    (outcome, time) and when it was answered (server time)."""

    rid: int
    ensemble: int
    items: int
    issued: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)
    failure: tuple[str, float] | None = None
    answered_s: float | None = None


@dataclass
class Stream:
    """A closed loop's requests to one served model (``kind`` "model") or ensemble: the schedule rows still to
    send, in order."""

    kind: str
    index: int
    queue: deque


def interp_one(x: float, xp, fp) -> float:
    """``np.interp(x, xp, fp)`` for one float ``x`` (``xp`` increasing; sequences of floats): the float operations
    of numpy's own loop, so bit for bit the same value, without the cost of an array call (the closed loop draws per
    request, one at a time)."""
    if x != x:
        return x
    if x >= xp[-1]:
        return fp[-1]
    if x < xp[0]:
        return fp[0]
    j = bisect_right(xp, x) - 1
    if xp[j] == x:
        return fp[j]
    slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])
    y = slope * (x - xp[j]) + fp[j]
    if y != y:  # numpy's fallback: from the other end
        y = slope * (x - xp[j + 1]) + fp[j + 1]
        if y != y and fp[j] == fp[j + 1]:
            y = fp[j]
    return y


class Grid:
    """A quantile grid (evenly spaced probabilities 0 .. 1) ready to sample: ``grid(u)`` is its value at probability
    ``u`` (an array, or one float: then a float), linearly interpolated as ``np.interp`` does. A constant grid (a
    constant distribution) gives its value without the search: what ``np.interp`` returns there too (zero slope:
    ``0 * dx + c``)."""

    def __init__(self, values):
        self.values = np.asarray(values, dtype=np.float64)
        self.probabilities = np.linspace(0.0, 1.0, len(self.values))
        self.constant = bool((self.values == self.values[0]).all())
        self._values, self._probabilities = self.values.tolist(), self.probabilities.tolist()

    def __call__(self, u):
        if isinstance(u, float):
            return self._values[0] + 0.0 if self.constant else interp_one(u, self._probabilities, self._values)
        if self.constant:
            return np.full(np.shape(u), self.values[0] + 0.0)
        return np.interp(u, self.probabilities, self.values)


def cold_extra(gap_s, u, gaps: tuple[float, ...], median: tuple[float, ...], p90: tuple[float, ...]):
    """A way's cold-start extra (s) after ``gap_s`` seconds since the previous request, drawn at probability ``u``
    (arrays, or floats: then a float): the median extra up to ``u = 0.5``, the p90 extra from ``u = 0.9``, linear
    between (the median extra everywhere when ``p90`` is empty)."""
    if isinstance(gap_s, float) and isinstance(u, float):
        extra = interp_one(gap_s, gaps, median)
        if not p90:
            return extra
        weight = min(max((u - 0.5) / 0.4, 0.0), 1.0)
        return extra + weight * (interp_one(gap_s, gaps, p90) - extra)
    extra = np.interp(gap_s, gaps, median)
    if not p90:
        return extra
    weight = np.clip((np.asarray(u) - 0.5) / 0.4, 0.0, 1.0)
    return extra + weight * (np.interp(gap_s, gaps, p90) - extra)


class Workload:
    """One run's requests (``n`` schedule rows) and their fate, shared by both engines. ``closed``: ``(concurrency
    per stream index, duration_s)`` for a closed loop, None for open loop."""

    def __init__(self, spec: SimSpec, seed: int, kinds: list[tuple[str, int]], model: np.ndarray,
                 items: np.ndarray, intended_s: np.ndarray, closed: tuple[dict[int, int], float] | None = None):
        self.spec = spec
        self.kinds = kinds  # schedule stream index -> ("model" | "ensemble", index)
        self.model = model
        self.items = items
        self.n = n = len(model)
        self.closed = closed
        rng = np.random.default_rng((seed, 3))
        self.u_dispatch = rng.random(n)
        self.u_overhead = np.random.default_rng((seed, 2)).random(n)
        self.drift_z = spec.drift.latent(seed) if spec.drift is not None else None  # the host's speed (drift.py)
        # where ways in and out wait for a core: per request one draw for each (column 0 in, 1 out)
        self.u_wait = np.random.default_rng((seed, 4)).random((n, 2)) if spec.core_wait is not None else None
        # ... and where each ensemble step's hand-off does (one column per step)
        steps = max((len(e.steps) for e in spec.ensembles), default=0)
        self.u_step = (np.random.default_rng((seed, 5)).random((n, steps))
                       if steps and spec.core_wait is not None and spec.request_device is not None else None)
        self.sent_s = np.full(n, np.nan) if closed else intended_s.astype(np.float64)
        self.since_s = np.full(n, np.inf)  # time since the previous request reached the server (cold starts)
        # the host's recent quiet time at each send (the wait for a core: CoreWait), and its running value
        self.quiet_memory = spec.core_wait.memory if spec.core_wait is not None else 1.0
        self.quiet_s = np.full(n, np.inf) if self.quiet_memory < 1.0 else self.since_s
        self.recent_quiet_s = INF
        self.overhead_s = np.full(n, np.nan)  # return overhead: open loop drawn up front, closed loop when answered
        self.client_done_s = np.full(n, np.nan)  # answered at the client, where the way out is simulated
        self.errors: list[int] = []  # rows whose batch exceeds the model's max_batch_size
        self.ensembles: list[EnsembleRequest] = []
        self.step_of: list[tuple[int, int]] = []  # owner -1 - k -> (ensemble slot, step)
        self.sources: dict[int, tuple] = {}  # open loop, models with sorted arrival lists: (times, rids, items)
        self.feeds: list[tuple] = []  # open loop, arrivals one event each: (times, rids, items, handler)
        members = {m for e in spec.ensembles for m in e.steps}
        self.hosted = {m.index for m in spec.models if m.request_kind is not None}  # ways in and out on the cores
        # per stream the models whose ways in and out its requests take: a model's own, an ensemble's entry and exit
        # members (EnsembleSpec)
        self.way_in = [index if kind == "model" else spec.ensembles[index].entry for kind, index in kinds]
        self.way_out = [index if kind == "model" else spec.ensembles[index].exit for kind, index in kinds]
        # at hand per request: its stream; per stream the model of its way in and of its way out where those are
        # simulated on the cores (-1: not), the ensemble it calls (-1: a model); per model the kind of its ways and
        # whether it batches (a request's items are its rows only then)
        self.stream_v = np.ascontiguousarray(model, dtype=np.int64)
        self.hosted_in_v = np.array([m if m in self.hosted else -1 for m in self.way_in], dtype=np.int64)
        self.hosted_out_v = np.array([m if m in self.hosted else -1 for m in self.way_out], dtype=np.int64)
        self.ensemble_v = np.array([index if kind == "ensemble" else -1 for kind, index in kinds], dtype=np.int64)
        self.request_kind = [m.request_kind for m in spec.models]
        self.batching_v = np.array([m.max_batch > 0 for m in spec.models], dtype=np.uint8)
        self.items_v = np.ascontiguousarray(items, dtype=np.int64)
        self.dynamic = members | self.hosted | {m.index for m in spec.models if m.max_queue_size}
        self.clock = None
        self.server = None
        self.host = None  # the device of the requests' ways in and out (the spec's request device), once started
        self.streams: list[Stream] = []
        self.stream_of = np.full(n, -1, dtype=np.int64)
        self.last_send_s = -np.inf
        # the measured distributions, ready to sample: each model's dispatch, each stream's return overhead
        self.dispatch_grid = {m.index: Grid(m.dispatch_grid) for m in spec.models if m.dispatch_grid}
        self.overhead_grid = [Grid(spec.models[m].overhead_grid) for m in self.way_out]
        self.ensemble_extra = [spec.ensembles[index].extra if kind == "ensemble" else None for kind, index in kinds]
        self.dispatch_work_s = np.full(n, np.nan)  # open loop, requests whose way in is simulated: its solo seconds
        if closed is None:
            self._open_loop(intended_s)
        else:
            self.dynamic |= {m.index for m in spec.models}
            self._closed_loop(*closed)
        # the per-request hooks read and write these arrays through typed views of the same memory (compiled)
        self.open_loop = closed is None
        self.waits = self.u_wait is not None
        self.wait_v = self.u_wait if self.waits else np.ones((1, 2))
        self.step_v = self.u_step if self.u_step is not None else np.ones((1, 1))
        self.sent_v, self.since_v, self.overhead_v = self.sent_s, self.since_s, self.overhead_s
        self.quiet_v = self.quiet_s
        self.client_done_v, self.work_in_v = self.client_done_s, self.dispatch_work_s

    # -- per-request draws ----------------------------------------------------------------------------------------
    def _drifted(self, draws: np.ndarray, rids, m: int, way: str, at_s):
        """The uniform draws ``draws[rids]`` of model ``m``'s way (``"way_in"`` or ``"way_out"``) at times
        ``at_s``, following the host's speed where the model's profile measured that (sim/drift.py)."""
        u = draws[rids]
        loadings = self.spec.models[m].drift if m >= 0 else None
        if self.drift_z is None or loadings is None:
            return u
        return follow(u, drift_at(self.drift_z, at_s), getattr(loadings, way))

    def dispatch_s(self, m: int, rids, since, at_s) -> np.ndarray:
        """Time from send (at ``at_s``) to the batcher for requests ``rids`` of model ``m`` (0 where nothing was
        measured): the measured time from send to the batch's start, less the instance's taking up of the payload
        where the engine simulates that (``ModelSpec.pickup_s``)."""
        ms = self.spec.models[m]
        if m not in self.dispatch_grid:
            return np.zeros(np.shape(rids))
        u = self._drifted(self.u_dispatch, rids, m, "way_in", at_s)
        out = self.dispatch_grid[m](u)
        device = ms.instance_devices[0] if ms.instance_devices else None
        idle = ms.idle.get(device)
        if idle is not None and idle.dispatch_extra_s:
            out = out + cold_extra(since, u, idle.overhead_gap_s, idle.dispatch_extra_s, idle.dispatch_extra_p90_s)
        pickup = ms.pickup_s.get(device, 0.0)
        if pickup <= 0.0:
            return out
        return max(out - pickup, 0.0) if isinstance(out, float) else np.maximum(out - pickup, 0.0)

    def overhead_of(self, stream: int, rids, at_s) -> np.ndarray:
        """Return-path overhead (client, network) of requests ``rids`` of schedule stream ``stream`` answered at
        ``at_s``, plus the model's cold-start extra for the time since the previous request reached the server (an
        ensemble's: its exit member's, and its own time beyond its members' where the profile measured it)."""
        m = self.way_out[stream]
        owner = self.spec.models[m]
        u = self._drifted(self.u_overhead, rids, m, "way_out", at_s)
        out = self.overhead_grid[stream](u)
        idle = owner.idle.get(owner.instance_devices[0]) if owner.instance_devices else None
        if idle is not None:
            out = out + cold_extra(self.since_s[rids], u, idle.overhead_gap_s, idle.overhead_extra_s,
                                   idle.overhead_extra_p90_s)
        extra = self.ensemble_extra[stream]
        if extra is not None:
            out = out + cold_extra(self.since_s[rids], u, extra.gap_s, extra.extra_s, extra.extra_p90_s)
        return out

    # -- open loop ------------------------------------------------------------------------------------------------
    def _open_loop(self, intended_s: np.ndarray) -> None:
        order = np.argsort(intended_s, kind="stable")
        self.since_s[order] = np.diff(intended_s[order], prepend=-np.inf)
        if self.quiet_memory < 1.0:
            self.quiet_s[order] = recent_means(self.since_s[order].tolist(), self.quiet_memory)
        for stream, (kind, index) in enumerate(self.kinds):
            rids = np.flatnonzero(self.model == stream)
            rids, items = self._servable(index, rids) if kind == "model" else (rids, self.items[rids])
            m = self.way_in[stream]
            if m in self.hosted:  # sent at its time; the way in is simulated
                self.dispatch_work_s[rids] = self.dispatch_s(m, rids, self.since_s[rids], intended_s[rids])
                self.feeds.append((intended_s[rids], rids, items, partial(self._way_in, m)))
                continue
            times = intended_s[rids] + self.dispatch_s(m, rids, self.since_s[rids], intended_s[rids])
            by_time = np.argsort(times, kind="stable")
            rids, items, times = rids[by_time], items[by_time], times[by_time]
            if kind == "ensemble":
                self.feeds.append((times, rids, items, partial(self._ensemble_feed, index)))
            elif index in self.dynamic:
                self.feeds.append((times, rids, items, partial(self._model_feed, index)))
            else:
                self.sources[index] = (times, rids, items)
        for stream in range(len(self.kinds)):  # each request's return overhead, known up front in open loop
            rids = np.flatnonzero(self.model == stream)  # (the host's speed read at its send: a few ms early)
            self.overhead_s[rids] = self.overhead_of(stream, rids, intended_s[rids])

    def _servable(self, m: int, rids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Requests of model ``m`` it can run and their items (batch rows; 1 without batching); the others fail."""
        ms = self.spec.models[m]
        if ms.max_batch <= 0:
            return rids, np.ones(len(rids), dtype=np.int64)
        items = self.items[rids]
        bad = items > ms.max_batch
        self.errors += rids[bad].tolist()
        return rids[~bad], items[~bad]

    def static_arrivals(self, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Model ``m``'s requests known up front, in order of arrival at its queue: times, record ids, items."""
        return self.sources.get(m, (np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)))

    # -- closed loop ----------------------------------------------------------------------------------------------
    def _closed_loop(self, concurrency: dict[int, int], duration_s: float) -> None:
        self.duration_s = duration_s
        self.concurrency = concurrency
        for stream, (kind, index) in enumerate(self.kinds):
            rids = np.flatnonzero(self.model == stream)
            if kind == "model":
                rids, _ = self._servable(index, rids)
            self.stream_of[rids] = len(self.streams)
            self.streams.append(Stream(kind, index, deque(rids.tolist())))

    def start(self, clock, server) -> None:
        """Bind to the engine's clock and server; a closed loop's clients send their first requests at 0."""
        self.clock, self.server = clock, server
        self.host = server.devices[self.spec.request_device] if self.spec.request_device is not None else None
        if self.closed is None:
            return
        for s, stream in enumerate(self.streams):
            for _ in range(self.concurrency.get(s, 0)):
                clock.call(0.0, partial(self._send, s))

    def _send(self, s: int, t: float) -> None:
        """A closed-loop client of stream ``s`` sends its next request at ``t`` (none after the run's end)."""
        stream = self.streams[s]
        if not stream.queue or t >= self.duration_s:
            return
        rid = stream.queue.popleft()
        self.sent_v[rid] = t
        self.since_v[rid] = t - self.last_send_s
        self.last_send_s = t
        if self.quiet_memory < 1.0:  # the host's recent quiet time
            self.recent_quiet_s = recent_mean(self.recent_quiet_s, self.since_v[rid], self.quiet_memory)
            self.quiet_v[rid] = self.recent_quiet_s
        m = self.way_in[self.stream_v[rid]]
        if self.hosted_in_v[self.stream_v[rid]] >= 0:
            self._way_in(m, rid, t, 0)
            return
        reached = t + float(self.dispatch_s(m, rid, self.since_v[rid], t))
        if stream.kind == "ensemble":
            self.clock.call(reached, partial(self._arrive, rid))
        else:
            self.clock.arrive(m, reached, rid, self._items(m, rid))

    def _items(self, m: int, rid: int) -> int:
        """Request ``rid``'s items at model ``m``: its batch rows where the model batches, else 1."""
        return self.items_v[rid] if self.batching_v[m] else 1

    def _way_in(self, m: int, rid: int, t: float, items: int) -> None:
        """Request ``rid`` leaves its client at ``t``: its way in, model ``m``'s (its own or its ensemble's entry
        member's), as work on the host's cores (``items``: unused, the request's own are known)."""
        work = self.work_in_v[rid] if self.open_loop else float(self.dispatch_s(m, rid, self.since_v[rid], t))
        if work > 0.0:
            self.server.start_phase(self.host, self.request_kind[m], work, rid, t,
                                    self.wait_v[rid, 0] if self.waits else 1.0, self.quiet_v[rid])
        else:
            self._arrive(rid, t)

    def _arrive(self, rid: int, now: float) -> None:
        """Request ``rid`` reaches the server at ``now``: its model's batcher, or its ensemble's scheduler."""
        stream = self.stream_v[rid]
        e = self.ensemble_v[stream]
        if e >= 0:
            self.ensemble_arrival(e, rid, now, self.items_v[rid])
        else:
            m = self.way_in[stream]
            self.server.arrive(m, now, rid, self._items(m, rid))

    def _answered(self, rid: int, now: float) -> None:
        """Request ``rid`` is answered by the server at ``now``: its way out starts (on the host's cores where that is
        simulated); in a closed loop its client sends the next request once the answer has come back."""
        stream = self.stream_v[rid]
        overhead = self.overhead_v[rid] if self.open_loop else float(self.overhead_of(stream, rid, now))
        m = self.hosted_out_v[stream]
        if m >= 0:
            self.server.start_phase(self.host, self.request_kind[m], overhead, -1 - rid, now,
                                    self.wait_v[rid, 1] if self.waits else 1.0, 0.0)  # after the server's work
            return
        if self.open_loop:
            return
        self.overhead_v[rid] = overhead
        self.clock.call(now + overhead, partial(self._send, self.stream_of[rid]))

    def on_phase(self, payload, now: float) -> None:
        """A request's way in (payload ``rid``: it reaches its model's batcher) or way out (``-1 - rid``: its client
        has the answer) is done."""
        rid = payload
        if rid >= 0:
            self._arrive(rid, now)
            return
        rid = -1 - rid
        self.client_done_v[rid] = now
        if not self.open_loop:
            self._send(self.stream_of[rid], now)

    # -- the engine's hooks ---------------------------------------------------------------------------------------
    def on_done(self, owner: int, now: float) -> None:
        if owner >= 0:
            self._answered(owner, now)
            return
        slot, step = self.step_of[-1 - owner]
        entry = self.ensembles[slot]
        entry.done.add(step)
        ens = self.spec.ensembles[entry.ensemble]
        if len(entry.done) == len(ens.steps):
            if entry.failure is None:
                entry.answered_s = now
                self._answered(entry.rid, now)
            return
        for nxt, deps in enumerate(ens.deps):
            if nxt not in entry.issued and entry.done.issuperset(deps):
                self._issue(slot, nxt, now)

    def on_failed(self, owner: int, now: float, outcome: str) -> None:
        """A request the server refused (``"rejected"``: queue full) or dropped (``"timeout"``) at ``now``."""
        if owner >= 0:
            self._answered(owner, now)
            return
        slot, _ = self.step_of[-1 - owner]
        entry = self.ensembles[slot]
        if entry.failure is None:
            entry.failure = (outcome, now)
            self._answered(entry.rid, now)

    def _model_feed(self, m: int, rid: int, t: float, items: int) -> None:
        self.server.arrive(m, t, rid, items)

    def _ensemble_feed(self, e: int, rid: int, t: float, items: int) -> None:
        self.ensemble_arrival(e, rid, t, items)

    def ensemble_arrival(self, e: int, rid: int, t: float, items: int) -> None:
        """An ensemble request reaches the server: issue the steps that need nothing."""
        slot = len(self.ensembles)
        self.ensembles.append(EnsembleRequest(rid, e, items))
        for step, deps in enumerate(self.spec.ensembles[e].deps):
            if not deps:
                self._issue(slot, step, t)

    def _issue(self, slot: int, step: int, t: float) -> None:
        """Issue step ``step`` of the ensemble request in ``slot`` at ``t``: it reaches its member's queue after the
        scheduler's cost per step, and on a CPU host after the wait for a core of the member's thread it wakes, with
        the request's way in's chance (the host's quiet when it was sent): on the demo's replay the hand-offs to the
        members and the combiner waited more than 1 ms beside a long batch about as often as the ways in did
        (scripts/diagnostics/wait_decomposition.py)."""
        entry = self.ensembles[slot]
        entry.issued.add(step)
        self.step_of.append((slot, step))
        owner = -len(self.step_of)
        at = t + self.spec.step_s
        if self.u_step is not None:
            rid = entry.rid
            at += self.server.wait_for_core(self.host, self.step_v[rid, step], self.quiet_v[rid])
        self.clock.arrive(self.spec.ensembles[entry.ensemble].steps[step], at, owner, entry.items)
