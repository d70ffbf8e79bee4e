"""Config generators (Model Analyzer's propose/observe): ``grid`` walks every point of a small space, ``optuna`` runs
a model-based optimiser (TPE) over a large one. Keyed by string; ``auto`` picks grid when the space has at most
``grid_limit`` points.

Contract: :meth:`Generator.propose` returns up to ``n`` points not proposed before (an empty list: nothing left);
:meth:`Generator.observe` gives back each point's scalar value (higher is better) in proposal order. Earlier
observations (a resumed checkpoint) are fed in with :meth:`Generator.replay` before the first proposal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

from serving_bench.errors import InputError
from serving_bench.tune.space import Params, SearchSpace


class Generator:
    name = "base"

    def __init__(self, space: SearchSpace, seed: int = 0):
        self.space = space
        self.seed = seed
        self.seen: dict[str, float] = {}

    def replay(self, params: Params, value: float) -> None:
        """An observation from an earlier run of this search."""
        self.seen[self.space.key(params)] = value

    def propose(self, n: int) -> list[Params]:
        raise NotImplementedError

    def observe(self, params: Params, value: float) -> None:
        self.seen[self.space.key(params)] = value


class GridGenerator(Generator):
    """Every distinct point in the space's fixed order, skipping the ones already observed."""

    name = "grid"

    def __init__(self, space: SearchSpace, seed: int = 0):
        super().__init__(space, seed)
        self._points: Iterator[Params] = space.grid()

    def propose(self, n: int) -> list[Params]:
        out: list[Params] = []
        for params in self._points:
            if self.space.key(params) not in self.seen:
                out.append(params)
                if len(out) == n:
                    break
        return out


class OptunaGenerator(Generator):
    """TPE over the categorical dimensions of the space (seeded; batches asked with the constant-liar strategy)."""

    name = "optuna"

    def __init__(self, space: SearchSpace, seed: int = 0):
        super().__init__(space, seed)
        import optuna  # heavy: ~0.5 s, one generator only

        optuna.logging.set_verbosity(logging.WARNING)
        self._optuna = optuna
        self._dims = {name: optuna.distributions.CategoricalDistribution(list(values))
                      for name, values in space.dimensions().items()}
        sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True, multivariate=True,
                                             n_startup_trials=min(10, max(2, space_size_hint(space) // 4)))
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self._pending: dict[str, list] = {}

    def replay(self, params: Params, value: float) -> None:
        super().replay(params, value)
        trial = self._optuna.trial.create_trial(params={k: params[k] for k in self._dims}, distributions=self._dims,
                                                value=float(value))
        self.study.add_trial(trial)

    def propose(self, n: int) -> list[Params]:
        out: list[Params] = []
        keys: set[str] = set()
        for _ in range(max(20 * n, 50)):
            if len(out) == n:
                break
            trial = self.study.ask(self._dims)
            params = dict(trial.params)
            key = self.space.key(params)
            if key in self.seen:  # a known point: teach the model its value without evaluating it again
                self.study.tell(trial, self.seen[key])
                continue
            if key in keys:  # proposed twice within this batch
                self._pending.setdefault(key, []).append(trial)
                continue
            keys.add(key)
            self._pending.setdefault(key, []).append(trial)
            out.append(self.space.canonical(params))
        return out

    def observe(self, params: Params, value: float) -> None:
        super().observe(params, value)
        for trial in self._pending.pop(self.space.key(params), []):
            self.study.tell(trial, float(value))


def space_size_hint(space: SearchSpace) -> int:
    """Upper bound of the number of points (product of dimension sizes), without enumerating."""
    size = 1
    for values in space.dimensions().values():
        size *= len(values)
    return size


@dataclass(frozen=True)
class GeneratorChoice:
    """Which generator a search uses and why (for the report)."""

    name: str
    space_points: int
    reason: str


GENERATORS = {"grid": GridGenerator, "optuna": OptunaGenerator}


def choose_generator(name: str, space: SearchSpace, grid_limit: int = 256) -> GeneratorChoice:
    """Resolve ``auto`` (grid when the space has at most ``grid_limit`` distinct points) and check the name."""
    if name not in (*GENERATORS, "auto"):
        raise InputError("--generator", None, f"{name!r}: expected one of auto, {', '.join(GENERATORS)}")
    hint = space_size_hint(space)
    points = space.size() if hint <= 20 * grid_limit else hint
    if name == "auto":
        name = "grid" if points <= grid_limit else "optuna"
        reason = f"{points} points {'<=' if name == 'grid' else '>'} grid limit {grid_limit}"
    else:
        reason = "chosen with --generator"
    return GeneratorChoice(name, points, reason)


def make_generator(name: str, space: SearchSpace, seed: int = 0) -> Generator:
    return GENERATORS[name](space, seed)
