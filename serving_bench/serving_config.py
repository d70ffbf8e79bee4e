"""ServingConfig: the knobs the tuner turns and the simulator models, read from and written back to a repository.

Per served entry: ``max_batch_size``, dynamic-batching ``max_queue_delay_us`` and ``preferred_batch_sizes``, queue
policy (``max_queue_size``, ``queue_timeout_us``; 0 = unlimited / none), and instance placement as
``(device, count)`` pairs where ``device`` is ``"cpu"`` or ``"gpu0"``, ``"gpu1"``, ... Ensembles map to their member
names. For the whole server: the runtime threads each instance gets (``threads_per_instance``; 0: the embedded
server's default, :func:`default_threads` over all served instances). Frozen and hashable, so a search can use
configs as keys.

What Triton accepts of these knobs, checked the same wherever a config comes from a user's file
(:func:`check_serving`), and what it answers to a request larger than a model takes (:func:`batch_refusal`,
:func:`triton_batch_answer`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from tritonclient.grpc import model_config_pb2 as mc

from serving_bench.errors import InputError
from serving_bench.export.repository import (CONFIG_NAME, ModelConfig, ensemble_deps, ensemble_members, entry_dir,
                                             list_entries, read_config, resolve_models, write_config)


INT32_MAX = 2**31 - 1  # max_batch_size, preferred sizes, max_queue_size and counts are int32 in Triton's config
# Triton accepts any int32 instance count and starts every instance: in the python backend a stub process each (68 MB
# resident for the sleep model here), elsewhere a copy of the model on its device. More than this many of one model
# on one device is refused as a typo: more than an H200 has SMs (132) to run them side by side.
MAX_INSTANCES = 128


@dataclass(frozen=True)
class ModelServing:
    """How one entry is served. Times in microseconds, as in Triton's config."""

    name: str
    max_batch_size: int = 0
    dynamic_batching: bool = False
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 0
    queue_timeout_us: int = 0
    instances: tuple[tuple[str, int], ...] = (("cpu", 1),)

    @property
    def instance_count(self) -> int:
        return sum(count for _, count in self.instances)

    @property
    def queue_policy(self) -> tuple[str, ...]:
        """The settings that make Triton's batcher run without payload prefetching (:func:`queue_policy_settings`);
        empty when none."""
        config = ModelConfig(max_batch_size=self.max_batch_size)
        if self.dynamic_batching:
            config.dynamic_batching.SetInParent()
            config.dynamic_batching.default_queue_policy.max_queue_size = self.max_queue_size
            config.dynamic_batching.default_queue_policy.default_timeout_microseconds = self.queue_timeout_us
        return queue_policy_settings(config)

    def replace(self, **changes) -> "ModelServing":
        return dataclasses.replace(self, **changes)


def cpu_cores() -> int:
    """Cores this process may run on (its CPU affinity; all the host's where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_threads(total_instances: int, cores: int | None = None) -> int:
    """The embedded server's intra-op threads per instance, so that all instances together use at most the
    ``cores`` (default: this host's, :func:`cpu_cores`): ``cores // total_instances``, at least 1 (more instances
    than cores oversubscribe at one thread each). The one home of this rule: the server, the simulator, the tuner
    and the profile measurement all ask here."""
    return max(1, (cpu_cores() if cores is None else cores) // max(1, total_instances))


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads-per-instance N``, the same for every command that serves or simulates (``serve``, ``simulate``,
    ``validate``, ``tune``): an int, None when not given (the default rule, :func:`default_threads`). Each command
    checks it with ``require_count`` before any work."""
    parser.add_argument("--threads-per-instance", type=int,
                        help="runtime (intra-op) threads of every served instance (default: the embedded server's, "
                             "cores // all served instances, at least 1)")


@dataclass(frozen=True)
class ServingConfig:
    """All served entries; ``ensembles`` maps an ensemble name to its member entry names (in step order), and
    ``ensemble_deps`` an ensemble to the steps each step needs (:func:`ensemble_deps`; an ensemble not listed is a
    chain, each step needing the one before). ``threads_per_instance``: every instance's runtime threads (``serve
    --threads-per-instance``); 0, the server's default (:meth:`instance_threads`)."""

    models: tuple[ModelServing, ...]
    ensembles: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())
    ensemble_deps: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = field(default=())
    threads_per_instance: int = 0

    def instance_threads(self, cores: int) -> int:
        """The runtime threads of each instance on a host of ``cores`` cores: ``threads_per_instance``, or the
        embedded server's default over all the served instances."""
        return self.threads_per_instance or default_threads(sum(m.instance_count for m in self.models), cores)

    def __getitem__(self, name: str) -> ModelServing:
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    @property
    def ensemble_map(self) -> dict[str, tuple[str, ...]]:
        return dict(self.ensembles)

    def steps_needed(self, ensemble: str) -> tuple[tuple[int, ...], ...]:
        """Per step of ``ensemble`` the steps whose outputs it needs: its graph (``ensemble_deps``), or without one a
        chain, each step consuming the previous one's output."""
        deps = dict(self.ensemble_deps).get(ensemble)
        if deps is None:
            deps = tuple(() if i == 0 else (i - 1,) for i in range(len(self.ensemble_map[ensemble])))
        return deps

    def with_threads(self, threads_per_instance: int | None) -> "ServingConfig":
        """A copy whose every instance runs ``threads_per_instance`` runtime threads; itself for None (as it is)."""
        if threads_per_instance is None:
            return self
        return dataclasses.replace(self, threads_per_instance=threads_per_instance)

    def with_model(self, model: ModelServing) -> "ServingConfig":
        """A copy with ``model`` replacing the entry of the same name."""
        return dataclasses.replace(self, models=tuple(model if m.name == model.name else m for m in self.models))

    # -- repository I/O -------------------------------------------------------------------------------------------
    @classmethod
    def from_repo(cls, repo: str | Path, models: list[str] | None = None) -> "ServingConfig":
        """Read every (or the named) entry's ``config.pbtxt``; ensembles pull in their members."""
        repo = Path(repo)
        served, ensembles, deps = [], [], []
        for name in resolve_models(repo, models or list_entries(repo)):
            config = read_config(entry_dir(repo, name) / CONFIG_NAME)
            if config.platform == "ensemble":
                ensembles.append((name, tuple(ensemble_members(config))))
                deps.append((name, ensemble_deps(config)))
            else:
                served.append(model_serving_from_config(config, name))
        return cls(tuple(served), tuple(ensembles), tuple(deps))

    def apply_to_repo(self, repo: str | Path) -> None:
        """Patch each entry's ``config.pbtxt`` in ``repo`` with these settings (other fields are kept)."""
        for model in self.models:
            path = entry_dir(repo, model.name) / CONFIG_NAME
            write_config(apply_model_serving(read_config(path), model), path)


def model_serving_from_config(config: ModelConfig, name: str | None = None) -> ModelServing:
    """The serving knobs of one Triton config."""
    has_db = config.HasField("dynamic_batching")
    db = config.dynamic_batching
    instances = []
    for group in config.instance_group or [mc.ModelInstanceGroup(count=1)]:
        count = group.count or 1
        if group.kind == mc.ModelInstanceGroup.KIND_GPU:
            for gpu in (group.gpus or [0]):
                instances.append((f"gpu{gpu}", count))
        else:
            instances.append(("cpu", count))
    policy = db.default_queue_policy
    return ModelServing(name=name or config.name, max_batch_size=config.max_batch_size, dynamic_batching=has_db,
                        max_queue_delay_us=int(db.max_queue_delay_microseconds),
                        preferred_batch_sizes=tuple(int(b) for b in db.preferred_batch_size),
                        max_queue_size=int(policy.max_queue_size),
                        queue_timeout_us=int(policy.default_timeout_microseconds), instances=tuple(instances))


def apply_model_serving(config: ModelConfig, model: ModelServing) -> ModelConfig:
    """A copy of ``config`` with ``model``'s knobs written in (Triton field names)."""
    out = ModelConfig()
    out.CopyFrom(config)
    out.max_batch_size = model.max_batch_size
    if model.dynamic_batching and model.max_batch_size > 0:
        db = out.dynamic_batching
        db.max_queue_delay_microseconds = model.max_queue_delay_us
        del db.preferred_batch_size[:]
        db.preferred_batch_size.extend(model.preferred_batch_sizes)
        if model.max_queue_size or model.queue_timeout_us:
            db.default_queue_policy.max_queue_size = model.max_queue_size
            db.default_queue_policy.default_timeout_microseconds = model.queue_timeout_us
            db.default_queue_policy.timeout_action = mc.ModelQueuePolicy.REJECT
    else:
        out.ClearField("dynamic_batching")
    del out.instance_group[:]
    for device, count in model.instances:
        if device == "cpu":
            out.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_CPU)
        elif device.startswith("gpu") and device[3:].isdigit():
            out.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[int(device[3:])])
        else:
            raise InputError(None, f"{model.name}.instances", f"device {device!r}: expected 'cpu' or 'gpuN'")
    return out


def queue_policy_settings(config: ModelConfig) -> tuple[str, ...]:
    """The dynamic-batching settings of ``config`` that make Triton's batcher run without payload prefetching, as
    ``field value`` texts (empty: none). Triton (``PriorityQueue``, core r24.10) prefetches only with no priority
    levels and a default queue policy without ``max_queue_size``, ``default_timeout_microseconds`` and
    ``allow_timeout_override``; without prefetching the bundled 2.51 batcher can wait up to 0.5 s for an instance
    that is already free (docs/serve.md#queue-policies-under-overload-the-bundled-tritonserver-251)."""
    if not config.HasField("dynamic_batching") or config.max_batch_size <= 0:
        return ()
    db = config.dynamic_batching
    policy = db.default_queue_policy
    found = []
    if policy.max_queue_size:
        found.append(f"max_queue_size {policy.max_queue_size}")
    if policy.default_timeout_microseconds:
        found.append(f"default_timeout_microseconds {policy.default_timeout_microseconds}")
    if policy.allow_timeout_override:
        found.append("allow_timeout_override true")
    if db.priority_levels:
        found.append(f"priority_levels {db.priority_levels}")
    return tuple(found)


def parse_instances(text: str, source: str = "--instances") -> Mapping[str, int]:
    """``"a=2,b=1"`` -> ``{"a": 2, "b": 1}`` (counts >= 1)."""
    out: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, count = item.partition("=")
        if not sep or not count.strip().isdigit() or int(count) < 1:
            raise InputError(source, item, "expected MODEL=COUNT with COUNT >= 1, comma-separated")
        out[name.strip()] = int(count)
    return out


def check_serving(model: ModelServing, source) -> None:
    """An :class:`InputError` (``source``: the file; field ``models.NAME.KNOB``) for the first knob of ``model``
    Triton would refuse, or that would have no effect: max_batch_size outside 0..int32; dynamic batching without a
    batch dimension (``dynamic batching ... max_batch_size 0``); a dynamic-batching knob without dynamic batching; a
    preferred size outside 1..max_batch_size (Triton: ``dynamic batching preferred size must be <= max batch
    size``); a queue size above int32; a device other than ``cpu``/``gpuN``; a count outside 1..:data:`MAX_INSTANCES`."""
    where = f"models.{model.name}"
    if not 0 <= model.max_batch_size <= INT32_MAX:
        raise InputError(source, f"{where}.max_batch_size", f"expected 0 (no batching) .. {INT32_MAX:,}, got "
                                                             f"{model.max_batch_size}")
    if model.dynamic_batching and model.max_batch_size == 0:
        raise InputError(source, f"{where}.dynamic_batching", "set while max_batch_size is 0; expected max_batch_size "
                                                              ">= 1 (a model without a batch dimension cannot batch)")
    knobs = {"max_queue_delay_us": model.max_queue_delay_us, "preferred_batch_sizes": model.preferred_batch_sizes,
             "max_queue_size": model.max_queue_size, "queue_timeout_us": model.queue_timeout_us}
    unused = next((k for k, v in knobs.items() if v and not model.dynamic_batching), None)
    if unused:
        raise InputError(source, f"{where}.{unused}", "set without dynamic_batching: true, where Triton has no use "
                                                      "for it; expected dynamic_batching: true or no such field")
    bad = [b for b in model.preferred_batch_sizes if not 1 <= b <= model.max_batch_size]
    if bad:
        raise InputError(source, f"{where}.preferred_batch_sizes", f"{bad[0]}: expected sizes between 1 and "
                                                                   f"max_batch_size {model.max_batch_size}")
    if model.max_queue_size > INT32_MAX:
        raise InputError(source, f"{where}.max_queue_size", f"expected at most {INT32_MAX:,}, got "
                                                            f"{model.max_queue_size}")
    for device, count in model.instances:
        if device != "cpu" and not (device.startswith("gpu") and device[3:].isdigit()):
            raise InputError(source, f"{where}.instances", f"device {device!r}: expected 'cpu' or 'gpuN'")
        if not 1 <= count <= MAX_INSTANCES:
            raise InputError(source, f"{where}.instances", f"{count} instances on {device}: expected 1 .. "
                                                           f"{MAX_INSTANCES} of one model on one device")


def batch_refusal(max_batch_size: int, batch: int) -> str | None:
    """Why a model with ``max_batch_size`` cannot take a request of ``batch`` items, as an input error's expected
    text (None: it takes it). Triton refuses a request above ``max_batch_size``, and any batched shape where it is 0
    (:func:`triton_batch_answer`)."""
    if max_batch_size == 0 and batch != 1:
        return f"the served model does not batch (max_batch_size 0); expected batch 1, got {batch}"
    if max_batch_size > 0 and batch > max_batch_size:
        return f"expected <= the model's max_batch_size {max_batch_size}, got {batch}"
    return None


def triton_batch_answer(name: str, max_batch_size: int, batch: int) -> str:
    """What Triton answers (gRPC ``INVALID_ARGUMENT``) to a request of ``batch`` items that model ``name`` refuses,
    as a replay's records keep it. Seen on the bundled Triton 2.51 (2026-12-06): ``[request id: <id_unknown>]
    inference request batch-size must be <= 4 for 's32'``, and for ``max_batch_size`` 0 ``[request id:
    <id_unknown>] unexpected shape for input 'input' for model 's0'. Expected [4], got [4,4].`` (input names and
    shapes are not known here, so that one names the items)."""
    if max_batch_size > 0:
        return (f"INVALID_ARGUMENT: [request id: <id_unknown>] inference request batch-size must be <= "
                f"{max_batch_size} for '{name}'")
    return (f"INVALID_ARGUMENT: [request id: <id_unknown>] unexpected shape for model '{name}': it takes no batch "
            f"dimension (max_batch_size 0), got a request of {batch} items")
