"""The propose/observe loop: a generator proposes a batch, an executor evaluates it on the simulator, each result is
observed and appended to the checkpoint as soon as it is known.

Batches have a fixed size (not the number of workers), and results are observed in proposal order, so the local and
the Ray executor reach the same observations. ``max_evals`` counts observations including resumed ones, so a resumed
search stops where the uninterrupted one would have.

On a long load the search may run on a *screen* of it (``tune.load.screen``) and :func:`confirm` then simulates the
best screened candidates on the whole load: every reported figure of a confirmed candidate is the whole load's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from serving_bench.tune.checkpoint import Checkpoint
from serving_bench.tune.executors import Executor
from serving_bench.tune.generators import GeneratorChoice, choose_generator, make_generator
from serving_bench.tune.load import screen, screen_fraction
from serving_bench.tune.objective import EvalContext, evaluate, rank_key, value


DEFAULT_FINALISTS = 2  # screened candidates confirmed on the whole load at a time (confirm)


@dataclass(frozen=True)
class SearchSettings:
    generator: str = "auto"
    seed: int = 0
    batch_size: int = 4
    max_evals: int | None = None
    budget_s: float | None = None
    grid_limit: int = 256
    first_alone: bool = False  # evaluate the first point on its own (a fresh search's time is estimated from it)


@dataclass
class SearchResult:
    """Every observation (``{"key", "params", "result", "value"}``) in the order observed."""

    observations: list[dict]
    choice: GeneratorChoice
    objective: str
    max_gpus: int
    resumed: int = 0
    evaluated: int = 0
    stopped: str = "exhausted"
    wall_s: float = 0.0
    ranked: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.rank()

    def rank(self) -> None:
        """Best first; candidates known only from a screen (``"screened": True``) after every confirmed one."""
        self.ranked = sorted(self.observations, key=lambda o: (o.get("screened", False), self.rank_key(o)))

    def rank_key(self, obs: dict) -> tuple:
        return rank_key(obs["result"], obs["key"], self.objective, self.max_gpus)

    @property
    def best(self) -> dict | None:
        return self.ranked[0] if self.ranked else None

    @property
    def satisfiable(self) -> bool:
        return bool(self.ranked) and self.ranked[0]["result"]["feasible"]


def schedule_fingerprint(ctx: EvalContext) -> str:
    """sha256 of the base schedule's arrays and model table (a checkpoint is only reused for the same load)."""
    s = ctx.load.base
    digest = hashlib.sha256()
    for arr in (s.arrival_s, s.model, s.sample, s.batch):
        digest.update(np.ascontiguousarray(arr).tobytes())
    digest.update(repr(s.models).encode())
    return digest.hexdigest()[:16]


def search_header(ctx: EvalContext, choice: GeneratorChoice, settings: SearchSettings, profile_id: str) -> dict:
    """What must match for a checkpoint to be resumed."""
    obj = ctx.objective
    return {"space": ctx.space.describe(), "base": repr(ctx.space.base), "slos": {m: dict(s) for m, s in ctx.slos.items()},
            "objective": {"name": obj.name, "max_scale": obj.max_scale, "min_scale": obj.min_scale, "steps": obj.steps_per_doubling,
                          "max_failed_fraction": obj.max_failed_fraction, "sim_seed": obj.sim_seed,
                          **({"confidence": obj.confidence, "replications": obj.replications,
                              "host_sigma": obj.host_sigma} if obj.confidence is not None else {})},
            "load": schedule_fingerprint(ctx), "load_seed": ctx.load.seed, "growth": ctx.load.growth,
            "profile": profile_id,
            "generator": choice.name, "seed": settings.seed, "batch_size": settings.batch_size}


def run_search(ctx: EvalContext, executor: Executor, settings: SearchSettings = SearchSettings(), *,
               checkpoint: Checkpoint | None = None, restart: bool = False, choice: GeneratorChoice | None = None,
               on_observation: Callable[[dict, int], None] | None = None) -> SearchResult:
    """Search ``ctx.space``; ``on_observation(obs, total)`` is called after each observation is checkpointed."""
    t0 = time.perf_counter()
    choice = choice or choose_generator(settings.generator, ctx.space, settings.grid_limit)
    objective, max_gpus = ctx.objective.name, ctx.space.gpus
    generator = make_generator(choice.name, ctx.space, settings.seed)
    observations: list[dict] = []
    if checkpoint is not None:
        old = [] if restart else checkpoint.load()
        for row in old:
            v = value(row["result"], objective, max_gpus)
            generator.replay(row["params"], v)
            observations.append({"key": row["key"], "params": row["params"], "result": row["result"], "value": v})
        checkpoint.start(fresh=restart)
    resumed = len(observations)
    stopped = "exhausted"
    while True:
        if settings.max_evals is not None and len(observations) >= settings.max_evals:
            stopped = "max_evals"
            break
        if settings.budget_s is not None and time.perf_counter() - t0 >= settings.budget_s:
            stopped = "budget"
            break
        n = 1 if settings.first_alone and not observations else settings.batch_size
        if settings.max_evals is not None:
            n = min(n, settings.max_evals - len(observations))
        batch = generator.propose(n)
        if not batch:
            break
        for params, result in zip(batch, executor.imap(evaluate, ctx, batch)):
            key = ctx.space.key(params)
            v = value(result, objective, max_gpus)
            generator.observe(params, v)
            if checkpoint is not None:
                checkpoint.append(key, params, result)
            obs = {"key": key, "params": params, "result": result, "value": v}
            observations.append(obs)
            if on_observation is not None:
                on_observation(obs, len(observations))
    return SearchResult(observations, choice, objective, max_gpus, resumed=resumed,
                        evaluated=len(observations) - resumed, stopped=stopped, wall_s=time.perf_counter() - t0)


def screen_context(ctx: EvalContext, asked: str | float = "auto") -> tuple[EvalContext, float]:
    """(the context a search runs in, the fraction of the load's time it sees): ``ctx`` on a screen of its load when
    ``asked`` calls for one (``tune.load.screen_fraction``), else ``ctx`` itself and 1."""
    fraction = screen_fraction(ctx.load, asked)
    return (ctx, 1.0) if fraction >= 1 else (dataclasses.replace(ctx, load=screen(ctx.load, fraction)), fraction)


def confirm_checkpoint(path: str | Path, ctx: EvalContext, choice: GeneratorChoice, settings: SearchSettings,
                       profile_id: str, screened: Checkpoint) -> Checkpoint:
    """The checkpoint of :func:`confirm` on ``ctx``'s whole load after the search checkpointed in ``screened``."""
    return Checkpoint(path, dict(search_header(ctx, choice, settings, profile_id), stage="confirm",
                                 screen=screened.header))


def confirm(ctx: EvalContext, executor: Executor, screened: SearchResult, finalists: int, *,
            checkpoint: Checkpoint | None = None, restart: bool = False,
            on_observation: Callable[[dict, int], None] | None = None) -> SearchResult:
    """Simulate the best of ``screened`` (a search on a screen of ``ctx.load``) on the whole load, ``finalists`` at a
    time in the screen's order, until the best confirmed candidate ranks ahead of the next one's screen result.

    The result's observations: the confirmed candidates with their whole-load results, then the others with their
    screen results marked ``"screened": True`` (``SearchResult.rank`` puts those last). Resumable from
    ``checkpoint`` like :func:`run_search`. The rule trusts a screen not to rank a candidate far below its whole-load
    result; it prunes only candidates ranked behind a confirmed one.
    """
    t0 = time.perf_counter()
    done = {} if checkpoint is None or restart else {row["key"]: row["result"] for row in checkpoint.load()}
    if checkpoint is not None:
        checkpoint.start(fresh=restart)
    queue = list(screened.ranked)
    confirmed: list[dict] = []
    evaluated = 0
    while queue and (not confirmed or screened.rank_key(min(confirmed, key=screened.rank_key)) >
                     screened.rank_key(queue[0])):
        batch, queue = queue[:max(finalists, 1)], queue[max(finalists, 1):]
        todo = [obs["params"] for obs in batch if obs["key"] not in done]
        for params, result in zip(todo, executor.imap(evaluate, ctx, todo)):
            key = ctx.space.key(params)
            done[key] = result
            evaluated += 1
            if checkpoint is not None:
                checkpoint.append(key, params, result)
        for obs in batch:
            result = done[obs["key"]]
            confirmed.append({"key": obs["key"], "params": obs["params"], "result": result,
                              "value": value(result, screened.objective, screened.max_gpus),
                              "screen_result": obs["result"]})
            if on_observation is not None:
                on_observation(confirmed[-1], len(confirmed))
    others = [dict(obs, screened=True) for obs in queue]
    return SearchResult(confirmed + others, screened.choice, screened.objective, screened.max_gpus,
                        resumed=len(confirmed) - evaluated, evaluated=evaluated, stopped="confirmed",
                        wall_s=time.perf_counter() - t0)
