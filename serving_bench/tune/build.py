"""``tune``'s search space built from what was asked and what the profile says: the candidate values per tuned
model, the variants that may serve each (:mod:`serving_bench.tune.variants`), the memory budget per device, and the
space pruned of what the profile rules out (:mod:`serving_bench.tune.prune`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from serving_bench.serving_config import ServingConfig
from serving_bench.tune import adapters
from serving_bench.tune.prune import prune, top_rates
from serving_bench.tune.space import SearchSpace, knobs_for
from serving_bench.tune.variants import Candidates, memory_budget, variant_candidates


@dataclass(frozen=True)
class SpaceAsk:
    """What ``tune`` was asked about the space: the candidate values (``--instances``, ``--max-batch-sizes``,
    ``--queue-delays-us``, ``--preferred``), ``--gpus``, ``--variants`` (None: none), ``--memory-gb`` (None: the
    devices' own), ``--max-scale`` and the repository (for ensembles' batch floors)."""

    instances: tuple[int, ...]
    max_batch_sizes: tuple[int, ...]
    queue_delays_us: tuple[int, ...]
    preferred: tuple[str, ...]
    gpus: int = 0
    variants: str | None = None
    memory_gb: float | None = None
    max_scale: float = 16.0
    repo: str | None = None


@dataclass(frozen=True)
class BuiltSpace:
    """The space, each model's candidate variants, each device's memory budget (bytes) and what was pruned."""

    space: SearchSpace
    candidates: Candidates
    budget: dict[str, int]
    pruned: tuple[str, ...]


def build_space(base: ServingConfig, profile, schedule, tuned: Sequence[str], ask: SpaceAsk) -> BuiltSpace:
    """The search space over ``tuned`` models of ``base`` (module doc); ``schedule``: the load at 1x."""
    devices = {m: ["gpu0"] if ask.gpus >= 1 else [d for d, _ in base[m].instances] for m in tuned}
    members = {member for _, ms in base.ensembles for member in ms}
    candidates = variant_candidates(profile, tuned, ask.variants, devices, fixed=members)
    caps = {m: min(adapters.max_servable_batch(profile, e, devices[m]) for e in candidates.per_slot[m])
            for m in tuned}
    floors = adapters.ensemble_batch_floors(ask.repo, base)
    knobs = knobs_for(tuned, instances=ask.instances, max_batch_size=ask.max_batch_sizes,
                      max_queue_delay_us=ask.queue_delays_us, preferred=ask.preferred, base=base, caps=caps,
                      floors=floors)
    if ask.variants:
        knobs = tuple(replace(k, variant=tuple(candidates.per_slot[k.name])) for k in knobs)
    placed = sorted({d for m in tuned for d in devices[m]})
    budget = memory_budget(profile, placed, ask.memory_gb)
    knobs, pruned = prune(knobs, profile, devices, top_rates(schedule, base, ask.max_scale), budget, ask.gpus < 2)
    return BuiltSpace(SearchSpace(base, knobs, gpus=ask.gpus), candidates, budget, tuple(pruned))
