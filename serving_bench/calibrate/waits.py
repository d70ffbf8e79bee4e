"""The wait for a core behind a long execution, measured (:func:`quiet_wait`): requests sent while a batch of the
longest model ran, by how quiet the host was before, give a law's ``wait_p``, ``wait_s`` and ``wait_quiet_s`` (and,
from two servers, the chance at two counts of the host's instances; from two rates, the length by the quiet)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from serving_bench.calibrate.runs import LoopRun, hop_s, matched_batches
from serving_bench.profiles.distributions import recent_means

QUIET_MEMORY = 1 / 8  # the newest gap's weight in the host's recent quiet time (CoreWait.memory)
WAITED_S = 0.001  # a way in this much longer than the model's usual one beside no long execution waited for a core
WAIT_MINIMUM = 20  # requests sent during a long execution that the wait's estimate needs
LENGTH_MINIMUM = 10  # waits (> WAITED_S) a run's rate needs for its own length (QuietWait.slice_quiet_s)
QUIET_GRID_S = np.geomspace(5e-4, 1.0, 61)  # the quiet times the estimate searches
P_GRID = np.linspace(0.01, 1.0, 100)  # ... and the probabilities


@dataclass(frozen=True)
class QuietWait:
    """The wait for a core behind a long execution as a law's ``wait_p``, ``wait_s`` and ``wait_quiet_s``
    (:class:`serving_bench.sim.spec.CoreWait`), measured: from ``beside`` requests sent while one ran, ``waited`` of
    them longer than :data:`WAITED_S` on their way in. Where it was measured on two servers, ``p`` holds with
    ``instances`` instances in all on the host and ``p_fewer`` with ``instances_fewer`` (the law's ``wait_instances``,
    ``wait_p_fewer`` and ``wait_instances_fewer``: the chance follows the host's instances, its threads)."""

    p: float
    slice_s: float
    quiet_s: float
    beside: int
    waited: int
    instances: int | None = None
    p_fewer: float | None = None
    instances_fewer: int | None = None
    beside_fewer: int = 0
    waited_fewer: int = 0
    slice_quiet_s: float | None = None  # the wait's length on a quieter host (see quiet_wait)
    gap_s: float | None = None
    gap_quiet_s: float | None = None
    slice_one_s: float | None = None  # where the length follows the quiet: the one length of every wait (before)

    def law(self) -> dict[str, float]:
        out = {"wait_p": self.p, "wait_s": self.slice_s, "wait_quiet_s": self.quiet_s,
               "wait_quiet_memory": QUIET_MEMORY}
        if self.p_fewer is not None and self.instances is not None and self.instances_fewer is not None:
            out.update(wait_instances=float(self.instances), wait_p_fewer=self.p_fewer,
                       wait_instances_fewer=float(self.instances_fewer))
        if self.slice_quiet_s is not None and self.gap_s is not None and self.gap_quiet_s is not None:
            out.update(wait_s_quiet=self.slice_quiet_s, wait_gap_s=self.gap_s, wait_gap_quiet_s=self.gap_quiet_s)
        return out


def beside_long(runs: Sequence[LoopRun], long: str) -> tuple[np.ndarray, np.ndarray]:
    """The requests of open-loop runs sent while a batch of ``long`` ran, each other model's that met their batch
    alone: the host's recent quiet time at the send (s; the weighted mean of the times between sends of any model,
    the newest weighing :data:`QUIET_MEMORY`) and the way in's excess (s; send to batch start, less half the hop,
    over that model's median of those sent while no ``long`` batch ran)."""
    quiet, excess = [], []
    for run in runs:
        executions = run.executions or {}
        if long not in executions or not run.sent:
            continue
        sends = np.sort(np.concatenate(list(run.sent.values())))
        recent = np.array(recent_means(np.diff(sends, prepend=-np.inf).tolist(), QUIET_MEMORY))
        long_runs = executions[long]
        for model in run.sent:
            found = matched_batches(run, model, 5) if model != long else None
            if found is None:
                continue
            matched, batches = found
            alone = batches.requests == 1
            sent = run.sent[model][matched][alone]
            way_in = (batches.start_s - run.sent[model][matched] - hop_s(run, batches, model) / 2)[alone]
            during = long_runs.running_at(sent)
            if during.all() or not during.any():
                continue
            quiet.append(recent[np.searchsorted(sends, sent)][during])
            excess.append(way_in[during] - float(np.median(way_in[~during])))
    if not quiet:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(quiet), np.concatenate(excess)


def quiet_wait(runs: Sequence[LoopRun], long: str, slice_range: tuple[float, float], instances: int | None = None,
               fewer: tuple[int, Sequence[LoopRun]] | None = None) -> QuietWait | None:
    """The wait for a core behind ``long``'s executions, from open-loop runs of it beside other models at different
    rates, every one's batches logged (:func:`beside_long`): a request sent while a ``long`` batch ran that took
    :data:`WAITED_S` longer on its way in waited.

    As :class:`~serving_bench.sim.spec.CoreWait` draws it — with probability ``q = p (1 - exp(-g / quiet_s))``, ``g``
    the host's recent quiet time (how busy the host has been, more than the last gap), a time uniform on
    (0, ``slice_s``) — a request waits longer than :data:`WAITED_S` with probability ``q (1 - WAITED_S / slice_s)``,
    and those that do wait on average ``(slice_s + WAITED_S) / 2`` longer: ``slice_s`` from their mean excess (within
    ``slice_range``), ``p`` and ``quiet_s`` by maximum likelihood over a grid. ``fewer``: the same runs on a server
    with fewer instances in all (``(instances in all, runs)``; ``runs`` had ``instances``) — one ``slice_s`` and one
    ``quiet_s`` for both, a ``p`` for each. Where the runs' two rates each had enough waits (:func:`wait_lengths`),
    the length follows the host's quiet: ``slice_s`` is the busier rate's and ``slice_quiet_s`` the quieter's, and
    each request's ``1 - WAITED_S / slice`` takes its own quiet's length. None with fewer than :data:`WAIT_MINIMUM`
    requests sent during a long batch (without ``fewer``'s ``p`` where only those runs had too few)."""
    per_run = [beside_long([run], long) for run in runs]  # each run once: pooled by server here, by rate below
    per_fewer = [beside_long([run], long) for run in fewer[1]] if fewer is not None else []
    groups = [pooled(per_run)]
    if len(groups[0][0]) < WAIT_MINIMUM:
        return None
    if fewer is not None and len((second := pooled(per_fewer))[0]) >= WAIT_MINIMUM:
        groups.append(second)
    slice_s = wait_length(np.concatenate([e for _, e in groups]), slice_range)
    lengths = wait_lengths(per_run, per_fewer if len(groups) > 1 else [], slice_range)
    likelihoods = []
    for g, e in groups:
        slices = np.interp(g, lengths[0], lengths[1]) if lengths else np.full(len(g), slice_s)
        seen = np.maximum(1.0 - WAITED_S / slices, 0.0)  # [request]
        shape = -np.expm1(-g[None, :] / QUIET_GRID_S[:, None])  # [quiet grid, request]
        chance = np.clip(P_GRID[:, None, None] * seen * shape[None], 1e-12, 1 - 1e-12)  # [p, quiet, request]
        likelihoods.append(np.where(e > WAITED_S, np.log(chance), np.log1p(-chance)).sum(axis=2))  # [p, quiet]
    j = int(np.argmax(sum(lk.max(axis=0) for lk in likelihoods)))  # the quiet time both share
    p = [float(P_GRID[int(np.argmax(lk[:, j]))]) for lk in likelihoods]
    (g, e), rest = groups[0], groups[1:]
    out = QuietWait(p[0], slice_s, float(QUIET_GRID_S[j]), int(len(g)), int((e > WAITED_S).sum()), instances)
    if rest:
        out = replace(out, p_fewer=p[1], instances_fewer=fewer[0], beside_fewer=int(len(rest[0][0])),
                      waited_fewer=int((rest[0][1] > WAITED_S).sum()))
    if lengths:
        (gap_s, gap_quiet_s), (busy_s, quiet_s) = lengths
        out = replace(out, slice_s=busy_s, slice_quiet_s=quiet_s, gap_s=gap_s, gap_quiet_s=gap_quiet_s,
                      slice_one_s=slice_s)
    return out


def wait_length(excess: np.ndarray, slice_range: tuple[float, float]) -> float:
    """The length (s) of a wait uniform on (0, length) whose waits over :data:`WAITED_S` have the mean excess of
    those in ``excess`` (s): ``2 x mean - WAITED_S``, within ``slice_range`` (its low end where none waited)."""
    waited = excess > WAITED_S
    return float(np.clip(2 * excess[waited].mean() - WAITED_S, *slice_range)) if waited.any() else slice_range[0]


def pooled(beside: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Several runs' :func:`beside_long` figures as one run's (what :func:`beside_long` of them all gives)."""
    if not beside:
        return np.zeros(0), np.zeros(0)
    return np.concatenate([g for g, _ in beside]), np.concatenate([e for _, e in beside])


def wait_lengths(runs: Sequence[tuple[np.ndarray, np.ndarray]], fewer: Sequence[tuple[np.ndarray, np.ndarray]],
                 slice_range: tuple[float, float]) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The wait's length by the host's quiet, from the :func:`beside_long` figures of each run at the two send rates
    (``runs``, and ``fewer``'s runs in the same order of rates), each rate's pooled — ((median recent quiet of the
    busier rate, of the quieter), (:func:`wait_length` of each one's excesses)), for the simulator to interpolate
    between, flat outside (:class:`~serving_bench.sim.spec.CoreWait`); None unless there are two rates with
    :data:`LENGTH_MINIMUM` waits each and the quieter one's median quiet at least twice the busier's."""
    if len(runs) != 2 or (fewer and len(fewer) != 2):
        return None
    rates = [pooled([runs[i], *([fewer[i]] if fewer else [])]) for i in range(2)]
    if any(int((e > WAITED_S).sum()) < LENGTH_MINIMUM for _, e in rates):
        return None
    (busy_g, busy_e), (quiet_g, quiet_e) = sorted(rates, key=lambda r: float(np.median(r[0])))
    gaps = (float(np.median(busy_g)), float(np.median(quiet_g)))
    if gaps[1] < 2 * gaps[0]:
        return None
    return gaps, (wait_length(busy_e, slice_range), wait_length(quiet_e, slice_range))
