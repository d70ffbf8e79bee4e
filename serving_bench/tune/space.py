"""The search space: per-model instance count, ``max_batch_size``, ``max_queue_delay_us``, preferred batch sizes,
the variant serving it (``tune --variants``: :mod:`serving_bench.tune.variants`), and which models share which GPU,
as a discrete space whose points are :class:`ServingConfig` s (and, with variants, the entry serving each model).

A point is a *params* dict (``"<model>.instances"``, ``"<model>.max_batch_size"``, ``"<model>.max_queue_delay_us"``,
``"<model>.preferred"``, ``"<model>.variant"`` where a model has two candidate entries or more, and with ``gpus >= 1``
``"<model>.gpu"``). Placements that only rename GPUs are the same
point: :meth:`SearchSpace.canonical` relabels GPUs in order of first use, and :meth:`SearchSpace.key` is the
canonical params as JSON, the identity the checkpoint and the generators share.

Preferred batch sizes are chosen by rule, relative to the candidate's ``max_batch_size``: ``none`` (no preference),
``max`` (``[max_batch_size]``) or ``pow2`` (every power of two up to it).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from serving_bench.errors import InputError
from serving_bench.serving_config import ServingConfig

PREFERRED_RULES = ("none", "max", "pow2")
KNOBS = ("instances", "max_batch_size", "max_queue_delay_us", "preferred")
VARIANT = "variant"  # the knob of the entry serving a model, where it has a choice

Params = dict[str, "int | str"]


def preferred_sizes(rule: str, max_batch_size: int) -> tuple[int, ...]:
    """Preferred batch sizes for ``rule`` at ``max_batch_size`` (empty without batching)."""
    if max_batch_size <= 0 or rule == "none":
        return ()
    if rule == "max":
        return (max_batch_size,)
    if rule == "pow2":
        return tuple(2 ** i for i in range(int(math.log2(max_batch_size)) + 1) if 2 ** i <= max_batch_size)
    raise ValueError(f"unknown preferred-batch rule {rule!r}")


@dataclass(frozen=True)
class ModelKnobs:
    """Candidate values of one served entry's knobs (each a non-empty tuple)."""

    name: str
    instances: tuple[int, ...] = (1, 2)
    max_batch_size: tuple[int, ...] = (1, 8, 32)
    max_queue_delay_us: tuple[int, ...] = (0, 1000)
    preferred: tuple[str, ...] = ("none",)
    variant: tuple[str, ...] = ()  # the entries that may serve it (none or one: no choice; none: itself)

    def __post_init__(self):
        for knob in KNOBS:
            values = tuple(getattr(self, knob))
            if not values:
                raise InputError(None, f"{self.name}.{knob}", "expected at least one candidate value")
            object.__setattr__(self, knob, values)
        if any(int(v) < 1 for v in self.instances):
            raise InputError(None, f"{self.name}.instances", "expected instance counts >= 1")
        if any(int(v) < 0 for v in self.max_batch_size + self.max_queue_delay_us):
            raise InputError(None, f"{self.name}.max_batch_size", "expected values >= 0")
        bad = [r for r in self.preferred if r not in PREFERRED_RULES]
        if bad:
            raise InputError(None, f"{self.name}.preferred", f"{bad[0]!r}: expected one of {', '.join(PREFERRED_RULES)}")

    def choices(self) -> dict[str, tuple]:
        out = {knob: getattr(self, knob) for knob in KNOBS}
        if len(self.variant) > 1:
            out[VARIANT] = tuple(self.variant)
        return out

    def entry(self, params: Mapping[str, "int | str"]) -> str:
        """The entry serving this model at ``params``."""
        if len(self.variant) > 1:
            return str(params[f"{self.name}.{VARIANT}"])
        return self.variant[0] if self.variant else self.name


@dataclass(frozen=True)
class SearchSpace:
    """Knobs per model over a base config; ``gpus`` >= 1 adds a placement of each model on one of that many GPUs
    (0 keeps the base config's devices, e.g. ``cpu`` for the embedded server)."""

    base: ServingConfig
    knobs: tuple[ModelKnobs, ...]
    gpus: int = 0
    fixed: tuple[str, ...] = field(default=())  # models whose base serving is kept as it is

    def __post_init__(self):
        names = set(self.base.names)
        for knob in self.knobs:
            if knob.name not in names:
                raise InputError("--models", knob.name, f"not a served model; served: {', '.join(self.base.names)}")
        if self.gpus < 0:
            raise InputError("--gpus", None, "expected a number of GPUs >= 0")

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def dimensions(self) -> dict[str, tuple]:
        """Every parameter name -> its candidate values (placement: GPU indices)."""
        dims: dict[str, tuple] = {}
        for knob in self.knobs:
            for name, values in knob.choices().items():
                dims[f"{knob.name}.{name}"] = values
            if self.gpus >= 1:
                dims[f"{knob.name}.gpu"] = tuple(range(self.gpus))
        return dims

    # -- points ----------------------------------------------------------------------------------------------------
    def canonical(self, params: Mapping[str, "int | str"]) -> Params:
        """``params`` with GPU indices relabelled in order of first use, and knobs that cannot matter normalised
        (batches of at most one: queue delay 0 and no preference)."""
        out: Params = {}
        relabel: dict[int, int] = {}
        for knob in self.knobs:
            m = knob.name
            mbs = int(params[f"{m}.max_batch_size"])
            out[f"{m}.instances"] = int(params[f"{m}.instances"])
            out[f"{m}.max_batch_size"] = mbs
            out[f"{m}.max_queue_delay_us"] = int(params[f"{m}.max_queue_delay_us"]) if mbs > 1 else 0
            out[f"{m}.preferred"] = str(params[f"{m}.preferred"]) if mbs > 1 else "none"
            if len(knob.variant) > 1:
                out[f"{m}.{VARIANT}"] = knob.entry(params)
            if self.gpus >= 1:
                gpu = int(params[f"{m}.gpu"])
                out[f"{m}.gpu"] = relabel.setdefault(gpu, len(relabel))
        return out

    def key(self, params: Mapping[str, "int | str"]) -> str:
        return json.dumps(self.canonical(params), sort_keys=True, separators=(",", ":"))

    def config(self, params: Mapping[str, "int | str"]) -> ServingConfig:
        """The serving config at ``params``."""
        params = self.canonical(params)
        config = self.base
        for knob in self.knobs:
            m = knob.name
            base = self.base[m]
            mbs = int(params[f"{m}.max_batch_size"])
            device = f"gpu{params[f'{m}.gpu']}" if self.gpus >= 1 else None
            devices = [device] if device else [d for d, _ in base.instances] or ["cpu"]
            count = int(params[f"{m}.instances"])
            config = config.with_model(base.replace(
                max_batch_size=mbs, dynamic_batching=mbs > 0,
                max_queue_delay_us=int(params[f"{m}.max_queue_delay_us"]),
                preferred_batch_sizes=preferred_sizes(str(params[f"{m}.preferred"]), mbs),
                instances=tuple((d, count) for d in devices)))
        return config

    def entries(self, params: Mapping[str, "int | str"]) -> dict[str, str]:
        """Per tuned model, the entry serving it at ``params`` (itself unless a variant was chosen)."""
        return {knob.name: knob.entry(params) for knob in self.knobs}

    @property
    def has_variants(self) -> bool:
        """Whether variants were searched (``tune --variants``): a model has its list of candidate entries."""
        return any(k.variant for k in self.knobs)

    def gpus_used(self, params: Mapping[str, "int | str"]) -> int:
        """Distinct GPUs a point uses (0 without placement)."""
        if self.gpus < 1:
            return 0
        return len({int(params[f"{k.name}.gpu"]) for k in self.knobs})

    # -- enumeration -----------------------------------------------------------------------------------------------
    def placements(self) -> Iterator[tuple[int, ...]]:
        """Canonical placements: restricted growth strings (model i on a GPU <= 1 + max of those before)."""
        n = len(self.knobs)
        if self.gpus < 1:
            yield ()
            return

        def grow(prefix: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
            if len(prefix) == n:
                yield prefix
                return
            top = max(prefix, default=-1) + 1
            for g in range(min(top, self.gpus - 1) + 1):
                yield from grow(prefix + (g,))

        yield from grow(())

    def size(self) -> int:
        """Number of distinct points (canonical)."""
        return sum(1 for _ in self.grid())

    def grid(self) -> Iterator[Params]:
        """Every distinct point once, in a fixed order."""
        seen: set[str] = set()
        per_model = []
        for knob in self.knobs:
            per_model.append(list(itertools.product(*knob.choices().values())))
        for placement in self.placements():
            for combo in itertools.product(*per_model):
                params: Params = {}
                for i, (knob, values) in enumerate(zip(self.knobs, combo)):
                    params.update({f"{knob.name}.{k}": v for k, v in zip(knob.choices(), values)})
                    if self.gpus >= 1:
                        params[f"{knob.name}.gpu"] = placement[i]
                key = self.key(params)
                if key not in seen:
                    seen.add(key)
                    yield self.canonical(params)

    def describe(self) -> dict:
        """JSON-able description (the checkpoint header compares it on resume)."""
        out = {"gpus": self.gpus, "knobs": {k.name: {n: list(v) for n, v in k.choices().items()} for k in self.knobs}}
        if self.has_variants:
            out["variants"] = {k.name: list(k.variant) for k in self.knobs if k.variant}
        return out


def parse_values(text: str, source: str, field: str, kind=int) -> tuple:
    """``"1,2,4"`` -> ``(1, 2, 4)``; a bad item is an :class:`InputError`."""
    out = []
    for item in filter(None, (p.strip() for p in str(text).split(","))):
        try:
            out.append(kind(item))
        except ValueError:
            raise InputError(source, field, f"{item!r}: expected comma-separated {kind.__name__} values") from None
    if not out:
        raise InputError(source, field, f"expected comma-separated {kind.__name__} values")
    return tuple(out)


def knobs_for(models: Sequence[str], *, instances=(1, 2), max_batch_size=(1, 8, 32), max_queue_delay_us=(0, 1000),
              preferred=("none",), base: ServingConfig | None = None,
              caps: Mapping[str, int] | None = None,
              floors: Mapping[str, int] | None = None) -> tuple[ModelKnobs, ...]:
    """The same candidate values for each model; models that cannot batch in ``base`` (max_batch_size 0 in the
    exported config) keep 0; ``caps`` bounds max_batch_size per model from above (e.g. the largest batch the profile
    measured), ``floors`` from below (an ensemble member must batch at least as much as its ensemble). The entries
    that may serve each model (``ModelKnobs.variant``) are set by the caller that searches variants."""
    out = []
    for m in models:
        mbs = tuple(max_batch_size)
        limit = None
        if base is not None:
            limit = base[m].max_batch_size
        if caps is not None and m in caps:
            limit = caps[m] if limit is None else min(limit, caps[m])
        if limit == 0:
            mbs = (0,)
        elif limit is not None:
            mbs = tuple(v for v in mbs if 0 < v <= limit) or (limit,)
        floor = (floors or {}).get(m, 0)
        if floor > 0 and mbs != (0,):
            mbs = tuple(v for v in mbs if v >= floor) or (floor,)
        out.append(ModelKnobs(m, tuple(instances), mbs, tuple(max_queue_delay_us), tuple(preferred)))
    return tuple(out)
