"""A device's sharing law as a profile names it: how the device shares itself among the work placed on it.

One vocabulary: the law names (:data:`NAMES`: the parameters each needs and the device kinds it is valid on) and the
parameters (:data:`PARAMETERS`: meaning, default, valid range; :data:`GROUPS`: those given together). A profile's
``law`` object is parsed once, where the profile is loaded (:meth:`Law.from_json`: an :class:`InputError` naming the
file and field), into a frozen :class:`Law`; everything after reads its typed fields. The simulator runs it as
:class:`serving_bench.sim.device.Law` (the name and the throughput parameters) and
:class:`serving_bench.sim.spec.CoreWait` (the wait for a core); the parameters are fitted by
:mod:`serving_bench.sim.interference`. Layout (every parameter optional unless the name needs it)::

    {"name": "pool_eff", "eta": 0.9, "psi": 0.8, "wait_p": 0.05, "wait_s": 0.003, "drift": 1.0, "queue": 1.0}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from serving_bench.errors import InputError
from serving_bench.profiles.distributions import number


@dataclass(frozen=True)
class LawName:
    """A law's name: the parameters it needs and the device kinds (``cpu``, ``gpu``) it is valid on."""

    name: str
    needs: tuple[str, ...]
    kinds: tuple[str, ...]
    meaning: str


NAMES: dict[str, LawName] = {n.name: n for n in (
    LawName("pool", (), ("cpu", "gpu"), "processor sharing over the device's capacity C: s = max(1, D / C)"),
    LawName("pool_eff", ("eta",), ("cpu", "gpu"), "the same over an effective capacity eta C"),
    LawName("soft", ("eta", "power"), ("cpu", "gpu"), "contention before the pool is full: "
            "s = (1 + (D / (eta C)) ** power) ** (1 / power)"),
    LawName("none", (), ("cpu", "gpu"), "no interference: every job at its solo speed (the baseline)"),
    LawName("serial", (), ("gpu",), "a GPU's kernels one at a time (each running kind its own rate)"),
    LawName("overlap", ("alpha",), ("gpu",), "a GPU's kernels overlap: n in flight run at n ** alpha kernels' worth"),
    LawName("overlap_sat", ("sigma",), ("gpu",), "a GPU's kernels overlap up to a saturation: n in flight run at "
            "n / (1 + sigma (n - 1)) kernels' worth (at most 1 / sigma; sigma above 1: less than one kernel's)"),
    LawName("overlap_usl", ("sigma", "kappa"), ("gpu",), "a GPU's kernels overlap with contention and coherence "
            "costs: n / (1 + sigma (n - 1) + kappa n (n - 1)) kernels' worth (the universal scalability law)"),
)}
OVERLAP = ("overlap", "overlap_sat", "overlap_usl")  # the GPU laws of a device capacity that grows with the kernels
DEFAULT_BY_KIND = {"cpu": "pool", "gpu": "serial"}  # a device's law where the profile names none
GPU_LAW = DEFAULT_BY_KIND["gpu"]  # chosen by held-out error (scripts/gpu_check.py --predict; docs/sim.md#laws-and-forms)


@dataclass(frozen=True)
class Parameter:
    """A law parameter: its ``default`` where a law does not name it, and its valid range ``(0, most]``
    (``most`` None: any number > 0)."""

    name: str
    default: float
    most: float | None
    meaning: str


PARAMETERS: dict[str, Parameter] = {p.name: p for p in (
    Parameter("eta", 1.0, None, "effective capacity as a share of the device's"),
    Parameter("power", 8.0, None, "the soft law's onset sharpness"),
    Parameter("alpha", 1.0, 1.0, "law overlap: the exponent of the device's speed in the kernels in flight"),
    Parameter("sigma", 0.0, 2.0, "laws overlap_sat and overlap_usl: each further kernel's contention (above 1: "
              "kernels of several contexts lose time switching)"),
    Parameter("kappa", 0.0, 1.0, "law overlap_usl: the coherence cost of each pair of kernels in flight"),
    Parameter("psi", 1.0, None, "the share of the measured hand-off demand that competes for the cores"),
    Parameter("wait_p", 0.0, 1.0, "the chance a request's way in or out waits for a core behind a long execution"),
    Parameter("wait_s", 0.0, None, "that wait's length up to (s): the scheduler's slice"),
    Parameter("wait_quiet_s", 0.0, None, "the chance by the host's recent quiet time instead (s; 0: by demand)"),
    Parameter("wait_quiet_memory", 1.0, 1.0, "the newest gap's weight in the host's recent quiet time"),
    Parameter("wait_instances", 0.0, None, "the model instances in all on the host at which wait_p was measured"),
    Parameter("wait_p_fewer", 0.0, 1.0, "wait_p measured at wait_instances_fewer instances"),
    Parameter("wait_instances_fewer", 0.0, None, "the fewer instances of wait_p_fewer"),
    Parameter("wait_s_quiet", 0.0, None, "the wait's length after a long quiet (s)"),
    Parameter("wait_gap_s", 0.0, None, "the quiet up to which the length is wait_s (s)"),
    Parameter("wait_gap_quiet_s", 0.0, None, "the quiet from which the length is wait_s_quiet (s)"),
    Parameter("drift", 0.0, 1.0, "the share of the measured drift of the host's speed the phases follow"),
    Parameter("queue", 0.0, None, "a run queue for the instances' take-ups: its gate as a share of eta C"),
)}
# a law takes these only where its name needs them; every law may take the others
THROUGHPUT = ("eta", "power", "alpha", "sigma", "kappa")
WAIT_BY_INSTANCES = ("wait_instances", "wait_p_fewer", "wait_instances_fewer")  # the chance at two instance counts
WAIT_BY_QUIET = ("wait_gap_s", "wait_gap_quiet_s", "wait_s_quiet")  # the length at two quiet times
# (parameters given all together or none, the one that must be less, the one it must be less than)
GROUPS = ((WAIT_BY_INSTANCES, "wait_instances_fewer", "wait_instances"),
          (WAIT_BY_QUIET, "wait_gap_s", "wait_gap_quiet_s"))


@dataclass(frozen=True)
class Law:
    """A device's sharing law (:data:`NAMES`) with the parameters it names (None: not named, the default of
    :data:`PARAMETERS` applies: :meth:`value`). Fields in the order a profile file writes them."""

    name: str = "pool"
    eta: float | None = None
    power: float | None = None
    alpha: float | None = None
    sigma: float | None = None
    kappa: float | None = None
    psi: float | None = None
    wait_p: float | None = None
    wait_s: float | None = None
    wait_quiet_s: float | None = None
    wait_quiet_memory: float | None = None
    wait_instances: float | None = None
    wait_p_fewer: float | None = None
    wait_instances_fewer: float | None = None
    wait_s_quiet: float | None = None
    wait_gap_s: float | None = None
    wait_gap_quiet_s: float | None = None
    drift: float | None = None
    queue: float | None = None

    def __post_init__(self) -> None:
        problem = _problem(self.name, self.params())
        if problem is not None:
            raise ValueError(f"law.{problem[0]}: {problem[1]}")

    def value(self, parameter: str) -> float:
        """The parameter as this law has it: named, or its default."""
        given = getattr(self, parameter)
        return PARAMETERS[parameter].default if given is None else given

    def params(self) -> dict[str, float]:
        """The parameters this law names, in the file's order."""
        return {p: getattr(self, p) for p in PARAMETERS if getattr(self, p) is not None}

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **self.params()}

    @classmethod
    def from_json(cls, data: Any, source: str, where: str) -> "Law":
        """A profile's ``law`` object; an :class:`InputError` naming ``source`` and the field on any problem. The
        parameters a name neither needs nor :data:`PARAMETERS` lists as optional (``eta`` of ``pool``) are
        ignored, as they always were."""
        if not isinstance(data, Mapping) or data.get("name") not in NAMES:
            raise InputError(source, f"{where}.name", f"expected one of {', '.join(NAMES)}")
        name = NAMES[data["name"]]
        params = {}
        for key in PARAMETERS:
            if key in name.needs and key not in data:
                raise InputError(source, f"{where}.{key}", f"missing; the {name.name} law needs it")
            if key in data and (key in name.needs or key not in THROUGHPUT):
                params[key] = number(data[key], source, f"{where}.{key}")
        problem = _problem(name.name, params)
        if problem is not None:
            raise InputError(source, f"{where}.{problem[0]}", problem[1])
        return cls(name.name, **params)

    def replace(self, **params: float | None) -> "Law":
        """This law with ``params`` set (None: not named)."""
        return dataclasses.replace(self, **params)


def default_law(kind: str) -> Law:
    """The law of a device of ``kind`` whose profile names none."""
    return Law(DEFAULT_BY_KIND[kind])


def require_kind(name: str, kind: str, source: str, field: str) -> None:
    """An :class:`InputError` at ``source``'s ``field`` where law ``name`` is not valid on a device of ``kind``."""
    if kind not in NAMES[name].kinds:
        raise InputError(source, field, f"the {name} law is for a {' or '.join(NAMES[name].kinds)} device, "
                         f"not a {kind} one")


def _problem(name: str, params: Mapping[str, float]) -> tuple[str, str] | None:
    """What is wrong with a law of ``name`` naming ``params``: (the field, what was expected), or None."""
    if name not in NAMES:
        return "name", f"expected one of {', '.join(NAMES)}"
    missing = next((p for p in NAMES[name].needs if p not in params), None)
    if missing is not None:
        return missing, f"missing; the {name} law needs it"
    for key, value in params.items():
        if key in THROUGHPUT and key not in NAMES[name].needs:
            return key, f"not a parameter of the {name} law"
        most = PARAMETERS[key].most
        if value <= 0:
            return key, "expected a number > 0"
        if most is not None and value > most:
            return key, f"expected a {'probability' if key.startswith('wait_p') else 'number'} in (0, {most:g}]"
    for group, low, high in GROUPS:
        given = [k for k in group if k in params]
        if given and len(given) < len(group):
            return next(k for k in group if k not in params), f"missing; {given[0]} needs it"
        if given and params[low] >= params[high]:
            return low, f"expected less than {high}"
    return None
