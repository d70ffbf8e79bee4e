"""A measurement under way (:class:`Lab`): its plan, the log, the notes so far, the runs of the phase with one
instance per model and what each model's figures are so far (:class:`ModelResult`); sessions on new servers for
each phase."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, ContextManager, Sequence

import numpy as np

from serving_bench.calibrate.plan import QUIET_SECONDS, Plan, quiet_rates
from serving_bench.calibrate.runs import LoopRun
from serving_bench.calibrate.session import ServerSetup, Session, Step, open_session, run_steps
from serving_bench.profiles.distributions import Curve, Dist, IdleEffect
from serving_bench.profiles.entries import ThreadTable
from serving_bench.sim.interference import open_schedule


@dataclass
class ModelResult:
    """One model's figures as the phases find them (the fields of its :class:`ModelOnDevice` and
    :class:`ModelProfile` to be)."""

    device: str
    config: object
    batches: dict[int, Dist] = field(default_factory=dict)
    overhead: Dist | None = None
    gap_s: float = 0.0
    per_request_s: float = 0.0
    curves: list[Curve] = field(default_factory=list)
    idle: IdleEffect | None = None
    dispatch: Dist | None = None
    demand: dict[int, float] = field(default_factory=dict)
    request_demand: float | None = None
    hop_s: float = 0.0
    handoff_cpu_s: float = 0.0
    pickup_s: float = 0.0
    drift: dict | None = None
    other_threads: dict[int, ThreadTable] = field(default_factory=dict)


@dataclass
class Lab:
    """One measurement under way: ``runs`` holds what each step of the phase with one instance per model measured
    (by step key), ``gpu_busy`` NVML's busy share of each (model, batch)'s solo run on a GPU, ``results`` each
    model's figures so far; ``notes`` go into the profile."""

    plan: Plan
    log: Callable[[str], None]
    notes: list[str] = field(init=False)
    runs: dict = field(init=False, default_factory=dict)
    gpu_busy: dict[tuple[str, int], float | None] = field(init=False, default_factory=dict)
    results: dict[str, ModelResult] = field(init=False)

    def __post_init__(self) -> None:
        self.notes = list(self.plan.notes)
        self.results = {m: ModelResult(self.plan.devices[m], self.plan.configs[m]) for m in self.plan.models}

    def sessions(self, instances: int, per_instance: int | None = None,
                 only: Sequence[str] | None = None) -> Callable[[], ContextManager[Session]]:
        """New sessions with ``instances`` of every model (of ``only`` where given, and then no ensemble) at
        ``per_instance`` runtime threads each (default the plan's); an external server as it serves them, or, where it
        allows model control, reloaded so."""
        plan, config = self.plan, self.plan.config
        models = plan.models if only is None else only
        threads = plan.threads if per_instance is None else per_instance
        setup = ServerSetup(plan.repo, tuple(models), instances, threads, config.trace, config.cuda_graphs, config.url,
                            tuple(plan.ensembles) if only is None else (), plan.reloads)
        return partial(open_session, setup, self.notes, self.log)

    def run_phase(self, steps: Sequence[Step], results: dict, sessions: Callable[[], ContextManager[Session]],
                  phase: str) -> None:
        """Measure ``steps`` into ``results`` (:func:`~serving_bench.calibrate.session.run_steps`)."""
        run_steps(steps, results, sessions, self.log, self.notes, phase, self.plan.restarts)

    def longest(self) -> tuple[str, float]:
        """The model of the longest service at its smallest batch size one at a time (the solo runs, Triton's
        compute time) and that service (s): the one whose executions the others wait behind."""
        models, sizes = self.plan.models, self.plan.sizes
        service = {m: self.runs[(m, "solo", sizes[m][0])].compute_s(m) for m in models}
        slowest = max(models, key=lambda m: service[m])
        return slowest, service[slowest]

    def quiet_run(self, session: Session, rate: float) -> tuple[dict[str, float], LoopRun]:
        """An open loop of every model together, the longest at a small share of a core, the others at ``rate``:
        its rates (:func:`~serving_bench.calibrate.plan.quiet_rates`) and the run."""
        rates = quiet_rates(self.plan.models, *self.longest(), rate)
        return rates, session.replay(open_schedule(rates, QUIET_SECONDS, 0))

    def cold_spacing(self, name: str) -> float:
        """The back-to-back latency a cold-start request of ``name`` waits for before its quiet time (an
        ensemble's: its members' summed)."""
        return sum(float(np.mean(self.runs[(m, "solo", 1)].latency[m])) for m in self.plan.ensembles.get(name, [name]))
