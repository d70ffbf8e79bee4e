"""What a measurement is: the ``profile`` command's options (:class:`MeasureConfig`) resolved once against the model
repository into a :class:`Plan` — the models measured (an ensemble's members too), their configurations, devices,
batch sizes and padded sizes, and the runtime threads per instance. Checked before any server starts (an external
server is asked how it serves the models and whether it allows model control)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from serving_bench.calibrate.session import ExternalServing, inspect_external, local_server_pid
from serving_bench.errors import InputError, require_count
from serving_bench.export.repository import CONFIG_NAME, ensemble_members, entry_dir, read_config
from serving_bench.export.variants import ALLOWED, Variant, variant_of
from serving_bench.profiles.law import NAMES, require_kind
from serving_bench.serve.runners.cuda_graphs import parse_batch_sizes
from serving_bench.serve.server import MAX_RESTARTS
from serving_bench.serving_config import ModelServing, cpu_cores, default_threads, model_serving_from_config
from serving_bench.sim.interference import FORMS

DEFAULT_SECONDS = 2.0
DEFAULT_ROUNDS = 3
DEFAULT_CALIBRATION = 2  # instances per model in the co-located runs the law is fitted to
DEFAULT_LAW = "pool_eff+wait"  # on a CPU host, chosen by held-out error: benchmarks/colocation_fidelity.py
IDLE_ROUNDS = 2  # rounds of the cold-start runs, minutes apart: a busy host only ever inflates a round's extras
HOST_DEVICE = "cpu"  # the host's cores: where CPU instances run and every request is handled
PER_REQUEST_CONCURRENCY = 8
SPLIT_CONCURRENCY = (2, 4, 8, 16, 32)  # the loads the host CPU outside the runner is split over (up to max batch)
LONG_SHARE = 0.1  # the quiet-wait runs (open loop): the longest model's rate keeps this share of a core busy ...
QUIET_RATES_RPS = (15.0, 150.0)  # ... every other model's rate in each run (a quiet host, then a busier one) ...
QUIET_SECONDS = 15.0  # ... each this long
LAW_CHOICES = FORMS + tuple(n for n in NAMES if n not in FORMS)  # what ``--law`` fits: a form, or a law as it is


@dataclass(frozen=True)
class MeasureConfig:
    """How to measure (:func:`~serving_bench.calibrate.measure.measure_profile`). ``calibrate``: instances per model
    in the co-located calibration runs the device's sharing law ``law`` is fitted to (0: none, processor sharing over
    the cores; ``law`` None: :data:`DEFAULT_LAW` on a CPU host, ``serial`` on a GPU); ``colocation``: instance counts
    for measured override curves S(k) (k > 1 measured; none by default); ``colocation_batches``: batch sizes of the
    curves (default 1 and the largest measured); ``pairs``: measure pair curves; ``seconds``: closed-loop seconds per
    measured point; ``rounds``: interleaved rounds per co-located point; ``idle_rounds``: rounds of the cold-start
    runs; ``threads``: threads per instance (embedded server; None: as served); ``url``: an external server's gRPC
    address instead of the embedded one; ``trace``: server-side times from Triton's request trace instead of the
    runners' execution logs; ``cuda_graphs``: serve TorchScript entries on GPU instances with CUDA graphs (``all``
    or sizes, as ``serve --cuda-graphs``); ``resources``: measure each entry's memory per instance and energy (or
    CPU-seconds) per request (:mod:`~serving_bench.calibrate.resources`; embedded server only)."""

    batch_sizes: tuple[int, ...] | None = None
    colocation: tuple[int, ...] = ()
    colocation_batches: tuple[int, ...] | None = None
    pairs: bool = True
    seconds: float = DEFAULT_SECONDS
    rounds: int = DEFAULT_ROUNDS
    threads: int | None = None
    url: str | None = None
    trace: bool = False
    cuda_graphs: str | None = None
    calibrate: int = DEFAULT_CALIBRATION
    law: str | None = None
    idle_rounds: int = IDLE_ROUNDS
    resources: bool = True

    def __post_init__(self) -> None:  # sequences given as lists are kept as tuples (a frozen value)
        for name in ("batch_sizes", "colocation", "colocation_batches"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(value))


@dataclass(frozen=True)
class Plan:
    """A measurement resolved against the repository: ``models`` measured (an ensemble's members included, each
    once), ``named`` the configurations of the entries as given (ensembles too), ``configs`` those of ``models``,
    ``ensembles`` each named ensemble's members in step order, per model its ``device``, measured batch ``sizes`` and
    ``padded`` sizes; ``threads`` per instance (an external server's: as it serves them, where its configuration
    says, else 1), ``spread``: the co-located servers' instances share the host's cores as served (else ``threads``
    everywhere); ``cores``: the host's; ``external``: how the external server serves the models and whether it
    allows model control (None: the embedded server)."""

    repo: Path
    config: MeasureConfig
    models: tuple[str, ...]
    named: Mapping[str, Any]
    configs: Mapping[str, Any]
    ensembles: Mapping[str, list[str]]
    devices: Mapping[str, str]
    sizes: Mapping[str, list[int]]
    padded: Mapping[str, list[int]]
    threads: int
    spread: bool
    cores: int
    notes: tuple[str, ...]  # the measurement's first notes (how it ran)
    external: ExternalServing | None = None

    @property
    def restarts(self) -> int:
        """How often a phase starts a dead server again: never an external one (not ours to start)."""
        return 0 if self.config.url else MAX_RESTARTS

    @property
    def reloads(self) -> bool:
        """The external server allows model control: each phase reloads its models with the phase's instances."""
        return self.external is not None and self.external.refusal is None

    def sets_threads(self, model: str) -> bool:
        """A phase can give ``model``'s instances other runtime threads: on the embedded server, or on an external
        one that allows model control where the served configuration names them."""
        return self.external is None or self.reloads and self.external.threads.get(model) is not None

    def instances_at_most(self, model: str, wanted: int) -> int:
        """The instances of ``model`` a phase can have: ``wanted``, or an external server's own count where it does
        not allow model control."""
        return wanted if self.external is None or self.reloads else self.external.instances.get(model, 1)

    @property
    def calibrated(self) -> bool:
        """Co-located calibration runs, and a law fitted to them: on one device of the embedded server, or of an
        external one that allows model control."""
        return self.config.calibrate > 1 and (self.external is None or self.reloads) and \
            len(set(self.devices.values())) == 1

    @property
    def quiet_waits(self) -> bool:
        """The wait for a core measured too (on one instance, and on ``calibrate`` each): beside another model, where
        the runners log their batches (the embedded server)."""
        return self.calibrated and len(self.models) > 1 and self.external is None

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The model pairs on one device whose pair curves are measured."""
        return [(a, b) for i, a in enumerate(self.models) for b in self.models[i + 1:]
                if self.config.pairs and self.devices[a] == self.devices[b]]

    def pair_batches(self, a: str, b: str) -> list[int]:
        """The batch sizes a pair's curve is measured at: 1 and the largest both allow."""
        return sorted({1, min(self.sizes[a][-1], self.sizes[b][-1])})

    @property
    def ks(self) -> list[int]:
        """The instance counts k > 1 of the co-location curves."""
        return sorted({int(k) for k in self.config.colocation if k > 1})

    def split_levels(self, model: str) -> list[int]:
        """The concurrencies of the split runs beside the per-request one (``min(max_batch_size, 8)``)."""
        largest = self.configs[model].max_batch_size
        return [c for c in SPLIT_CONCURRENCY if c <= largest and c != min(largest, PER_REQUEST_CONCURRENCY)]

    def variant(self, model: str) -> Variant | None:
        """The variant an exported entry is (its config's ``framework`` and ``variant`` parameters); None for an
        entry this tool's exporter did not write as one (the sleep model, a native entry from elsewhere)."""
        params = {k: v.string_value for k, v in self.configs[model].parameters.items()}
        if params.get("framework") not in ALLOWED:
            return None
        try:
            return variant_of(params["framework"], params, params.get("precision") or "fp32")
        except InputError:  # a variant id this version cannot read: measured as an entry, not named as a variant
            return None

    def zoo_model(self, model: str) -> str:
        """The zoo model an entry is a variant of (its name less the variant's suffix; "" when not a variant)."""
        variant = self.variant(model)
        suffix = variant.entry_name("") if variant is not None else ""
        return model[:-len(suffix)] if suffix and model.endswith(suffix) and len(model) > len(suffix) else ""

    def fixed_threads(self, model: str) -> int:
        """The intra-op threads an entry's variant fixes (``intra=N``: they win over the server's threads per
        instance); 0 when it follows the server's."""
        variant = self.variant(model)
        return variant.intra_threads if variant is not None else 0

    def batched(self, model: str) -> bool:
        """The model batches requests dynamically (its per-request cost and split runs are measured)."""
        config = self.configs[model]
        return config.HasField("dynamic_batching") and config.max_batch_size > 1


def plan_measurement(repo: str | Path, models: Sequence[str], config: MeasureConfig) -> Plan:
    """Read the entries' configurations and resolve ``config`` against them (module docstring); an
    :class:`InputError` before anything runs where an option does not fit them."""
    repo = Path(repo)
    require_count("--rounds", config.rounds)
    if config.law is not None and config.law not in LAW_CHOICES:
        raise InputError("--law", config.law, f"expected one of {', '.join(LAW_CHOICES)}")
    named = {m: read_config(entry_dir(repo, m) / CONFIG_NAME) for m in models}
    # an ensemble is simulated from its members (measured too, named or not) and measured alone for its own time
    ensembles = {m: ensemble_members(c) for m, c in named.items() if c.platform == "ensemble"}
    measured = tuple(dict.fromkeys([m for m in models if m not in ensembles] +
                                   [m for e in ensembles.values() for m in e]))
    configs = {m: named[m] if m in named else read_config(entry_dir(repo, m) / CONFIG_NAME) for m in measured}
    devices = {m: model_serving_from_config(c).instances[0][0] for m, c in configs.items()}
    if config.law is not None and any(d == HOST_DEVICE for d in devices.values()):
        require_kind(config.law.split("+")[0], "cpu", "--law", config.law)
    padded = {m: padded_sizes(c, config.cuda_graphs) for m, c in configs.items()}
    sizes = {}
    for m, c in configs.items():
        wanted = list(config.batch_sizes) if config.batch_sizes else default_batch_sizes(c.max_batch_size, padded[m])
        sizes[m] = sorted({b for b in wanted if b <= max(c.max_batch_size, 1)} | {1})
    external = inspect_external(config.url, measured) if config.url else None
    threads = config.threads if config.threads is not None else \
        default_threads(sum(max(sum(g.count or 1 for g in c.instance_group), 1) for c in configs.values()))
    if external is not None:
        threads = external_threads(external, config.threads)
    notes = [f"closed loop, {config.seconds:g} s per point, {config.rounds} interleaved rounds per co-location "
             f"point; {threads} thread(s) per instance"] + (external_notes(external, config.url) if external else [])
    spread = config.threads is None and all(d == HOST_DEVICE for d in devices.values()) and \
        (external is None or external.refusal is None and all(t is not None for t in external.threads.values()))
    return Plan(repo, config, measured, named, configs, ensembles, devices, sizes, padded, threads, spread,
                cpu_cores(), tuple(notes), external)


def external_threads(external: ExternalServing, given: int | None) -> int:
    """The runtime threads per instance recorded for an external server's models: ``given`` where the server can be
    told (model control, and a configuration that names them), else the first served model's that says, else 1."""
    said = [t for t in external.threads.values() if t is not None]
    if given is not None and external.refusal is None and said:
        return given
    return said[0] if said else 1


def external_notes(external: ExternalServing, url: str) -> list[str]:
    """What a profile of the external server at ``url`` rests on (the profile's notes)."""
    here = local_server_pid(url) is not None
    notes = [f"external server {url}: service time per batch size from Triton's statistics extension (its mean "
             "compute time per executed batch of that size; the spread and the cold starts from paced runs, each "
             "request's counters apart), the rest of a request's latency its way in and out; no runner logs, so no "
             "drift and no wait for a core measured" +
             ("; the host CPU from the server's processes on this machine" if here else
              "; the server is not a process on this machine: no host CPU measured")]
    if external.refusal is not None:
        notes.append(f"the server does not allow model control ({external.refusal}): co-location only up to the "
                     "instances it serves, no calibration runs (no sharing law fitted)")
    elif any(t is None for t in external.threads.values()):
        notes.append("runtime threads per instance not in the served configuration of " +
                     ", ".join(m for m, t in external.threads.items() if t is None) + ": left as served")
    return notes


def default_batch_sizes(max_batch_size: int, padded: Sequence[int] = ()) -> list[int]:
    """1, 2, 4, ... up to and including ``max_batch_size`` (just 1 without batching); with ``padded`` sizes (the
    sizes a runtime pads batches to), those sizes and the powers of two above the largest (run unpadded)."""
    if max_batch_size <= 1:
        return [1]
    sizes = [1]
    while sizes[-1] * 2 < max_batch_size:
        sizes.append(sizes[-1] * 2)
    sizes.append(max_batch_size)
    if padded:
        return sorted(set(padded) | {b for b in sizes if b > max(padded)})
    return sizes


def padded_sizes(config, cuda_graphs: str | None = None) -> list[int]:
    """The batch sizes the served runtime pads to: the CUDA graphs captured for a TorchScript entry on GPU
    instances (``cuda_graphs``, as ``serve --cuda-graphs``), or a tuned TVM entry's static buckets (parameter
    ``buckets``); [] when batches run at their own size."""
    params = {k: v.string_value for k, v in config.parameters.items()}
    if params.get("buckets"):
        return sorted({int(b) for b in params["buckets"].split(",") if b.strip()})
    if cuda_graphs and cuda_graph_entry(config):
        try:
            return parse_batch_sizes(cuda_graphs, config.max_batch_size)
        except ValueError as err:
            raise InputError("--cuda-graphs", cuda_graphs, str(err)) from None
    return []


def cuda_graph_entry(config) -> bool:
    """A TorchScript entry on GPU instances: what the runner can replay CUDA graphs for."""
    return (config.platform == "pytorch_libtorch" or config.backend == "pytorch") and \
        any(g.kind == g.KIND_GPU for g in config.instance_group)


def calibration_serving(config, device: str, instances: int, largest: int) -> ModelServing:
    """How a calibration run serves a model, for the simulator to replay it: the entry's own settings with
    ``instances`` instances, its batches capped at the largest measured size (one-row requests from at most
    ``instances`` clients never batch more)."""
    serving = model_serving_from_config(config)
    largest = min(serving.max_batch_size, largest) if serving.max_batch_size > 0 else 0
    return serving.replace(instances=((device, instances),), max_batch_size=largest,
                           preferred_batch_sizes=tuple(b for b in serving.preferred_batch_sizes if b <= largest))


def quiet_rates(models: Sequence[str], longest: str, longest_service_s: float, rate: float) -> dict[str, float]:
    """The rates (req/s) of a quiet-wait run (open loop): ``longest`` at :data:`LONG_SHARE` of a core (a batch of
    ``longest_service_s`` seconds now and then), every other model at ``rate``."""
    return {m: LONG_SHARE / longest_service_s if m == longest else rate for m in models}
