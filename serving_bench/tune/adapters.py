"""The one place that calls the other packages' APIs (load profiles, simulator, profiles, replay), so the tuner,
the planner and the demo stay a thin orchestration of them.

Everything here is picklable (Ray ships it to workers).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from serving_bench import validate as validation
from serving_bench.errors import InputError
from serving_bench.export.repository import CONFIG_NAME, entry_dir, read_config
from serving_bench.load.driver import TritonTarget
from serving_bench.load.profile import MAX_REQUESTS, LoadProfile, build_schedule, check_schedule_size
from serving_bench.calibrate import calibration, measure
from serving_bench.calibrate.plan import MeasureConfig
from serving_bench.profiles.importers import import_h200_eager
from serving_bench.profiles.schema import Profile
from serving_bench.run.records import Records
from serving_bench.run.schedule import Schedule
from serving_bench.serving_config import ServingConfig
from serving_bench.sim import profile_config
from serving_bench.sim.intervals import IntervalOptions
from serving_bench.sim.target import SimTarget


@dataclass(frozen=True)
class ScheduleBuilder:
    """``builder(seed, factor)`` -> the Schedule of the load profile at ``path`` with that seed and every arrival
    rate multiplied by ``factor`` (``LoadProfile.scaled``; default 1: the profile as written); ``duration_s``
    overrides the profile's duration."""

    path: str
    duration_s: float | None = None
    max_requests: int = MAX_REQUESTS

    def profile(self) -> LoadProfile:
        try:
            changed = Path(self.path).stat().st_mtime_ns
        except OSError:  # read_yaml says what is wrong with it, in one line
            changed = None
        prof = _read_load_profile(self.path, changed) if changed is not None else LoadProfile.load(self.path)
        if self.duration_s is not None:
            if not math.isfinite(self.duration_s) or self.duration_s <= 0:
                raise InputError("--duration", None, f"expected seconds > 0, got {self.duration_s:g}")
            prof = dataclasses.replace(prof, duration_s=float(self.duration_s))
        return prof

    def size(self) -> int:
        """The requests of the load at scale 1, known before it is built; refused above ``max_requests``, naming
        ``--duration`` where that override is at fault (:func:`check_schedule_size`)."""
        return check_schedule_size(self.profile(), self.max_requests,
                                   duration_option="--duration" if self.duration_s is not None else None)

    def __call__(self, seed: int | None = None, factor: float = 1.0) -> Schedule:
        prof = self.profile()
        prof = prof if factor == 1.0 else prof.scaled(factor)
        return build_schedule(prof if seed is None else dataclasses.replace(prof, seed=int(seed)), self.max_requests)


@lru_cache(maxsize=8)
def _read_load_profile(path: str, _mtime_ns: int) -> LoadProfile:
    """The load profile at ``path`` as of its modification time: parsed once for the many realisations a search
    and its replications build (frozen: safe to share)."""
    return LoadProfile.load(path)


BUILTIN_PROFILES = {"builtin:h200-eager": "the bundled H200 torch-eager table (engineer D's import_h200_eager)"}


def load_profile(path: str | Path):
    """The simulator's hardware profile (engineer D's ``Profile.load``); ``builtin:h200-eager`` is the bundled H200
    torch **eager mode** table imported by ``serving_bench.profiles.importers.import_h200_eager``."""
    if str(path) == "builtin:h200-eager":
        return import_h200_eager()
    return Profile.load(path)


def simulate(profile, config, schedule: Schedule, seed: int = 0, host_speed: float = 1.0) -> Records:
    """Records of ``schedule`` run through ``SimTarget`` with ``config`` (engineer D), on a host whose work takes
    ``host_speed`` times as long as the profile's (a replication's draw: ``sim.intervals``)."""
    return SimTarget(profile, config, seed=seed, host_speed=host_speed).run(schedule)


def replay(endpoints, schedule: Schedule, progress=None, progress_interval_s: float = 5.0) -> Records:
    """Records of ``schedule`` replayed open loop against a running Triton (engineer C's ``TritonTarget``);
    ``endpoints`` is an ``Endpoints``, a ``TritonServer`` (its death then ends the run), an ``ExternalServer`` or a
    gRPC host:port; ``progress(Progress)`` is called about every ``progress_interval_s``."""
    return TritonTarget(endpoints, progress=progress, progress_interval_s=progress_interval_s).run(schedule)


def profiled_batch_sizes(profile, name: str, device: str | None = None) -> tuple[int, ...]:
    """Batch sizes the profile measured for ``name`` (on ``device``, else on its first device)."""
    model = profile.model(name)
    md = model.devices[device] if device else next(iter(model.devices.values()))
    return md.batch_sizes


def max_servable_batch(profile, name: str, devices) -> int:
    """The largest ``max_batch_size`` the simulator can run for ``name`` on ``devices``
    (:func:`serving_bench.sim.profile_config.max_servable_batch`)."""
    return profile_config.max_servable_batch(profile, name, devices)


def config_from_profile(profile, models) -> ServingConfig:
    """The base serving config for a profile without a repository: the one ``simulate`` uses too
    (:func:`serving_bench.sim.profile_config.config_from_profile`: one instance per model on its first device,
    dynamic batching up to its largest measured batch size)."""
    return profile_config.config_from_profile(profile, models)


def with_gpus(profile, count: int):
    """``profile`` with devices ``gpu0 .. gpu{count-1}``: when it describes one GPU (any name), that GPU's
    measurements stand for each of ``count`` identical GPUs. Unchanged when it already lists them."""
    wanted = [f"gpu{i}" for i in range(count)]
    if all(d in profile.devices for d in wanted):
        return profile
    gpus = [name for name, info in profile.devices.items() if info.kind == "gpu"]
    if len(gpus) != 1:
        raise InputError(profile.path or "profile", "devices", f"--gpus {count} needs devices gpu0..gpu{count - 1} "
                         f"or exactly one GPU to replicate; the profile has {', '.join(sorted(profile.devices))}")
    src = gpus[0]
    devices = dict(profile.devices)
    for name in wanted:
        devices[name] = dataclasses.replace(profile.devices[src], name=name)
    models = {}
    for name, mp in profile.models.items():
        per = dict(mp.devices)
        if src in per:
            for gpu in wanted:
                per[gpu] = mp.devices[src]
        models[name] = dataclasses.replace(mp, devices=per)
    return dataclasses.replace(profile, devices=devices, models=models)


def profile_description(profile) -> str:
    """One line naming the profile's devices and, on a GPU, the execution modes it was measured in ('torch eager
    mode', CUDA graphs, ...; a CPU entry runs its own framework, which the mode does not describe)."""
    devices = ", ".join(sorted({(info.model or info.name) + (f" ({info.kind})" if info.kind == "gpu" else
                                                              f" ({info.cores} cores)") for info in
                                profile.devices.values()}))
    modes = sorted({md.execution_mode for mp in profile.models.values() for name, md in mp.devices.items()
                    if name in profile.devices and profile.devices[name].kind == "gpu"})
    named = {"eager": "torch eager mode", "cuda_graphs": "CUDA graphs", "compiled": "torch.compile",
             "tensorrt": "TensorRT", "n/a": None}
    mode_text = ", ".join(filter(None, (named.get(m, m) for m in modes)))
    return f"{devices}" + (f", measured in {mode_text}" if mode_text else "")


def utilisation(records: Records, summary=None) -> float | None:
    """Busiest simulated device's busy fraction (``records.info.sim``), else None."""
    sim = records.info.sim
    if sim is None or not sim.device_busy_s:
        return None
    duration = float(sim.duration_s or 0.0)
    if duration <= 0:
        return None
    return max(float(v) / duration for v in sim.device_busy_s.values())


def measure_profile(repo, models, out_path, log=None, **options):
    """Measure a simulator profile of ``models`` on the embedded Triton and save it (engineer D's profiling;
    ``options``: the fields of its :class:`~serving_bench.calibrate.plan.MeasureConfig`, e.g. ``seconds``,
    ``colocation``, ``pairs``)."""
    return measure.measure_profile(repo, models, out_path, MeasureConfig(**options), log)


def profile_uncertain(profile) -> bool:
    """Is the profile's sharing law far off its own calibration runs (engineer D's ``calibration.uncertain``)?"""
    return calibration.uncertain(profile)


def validate(load_profile, repo, profile_path, out_dir, replay_dir=None, note=None):
    """Simulated vs measured table for the same schedule (``serving_bench.validate``, its default intervals);
    returns its rows."""
    return validation.run_validation(load_profile, repo, profile_path, out_dir,
                                     validation.ValidateOptions(replay_dir=replay_dir), note=note)


def coverage_line(rows: list[dict]) -> str:
    """The coverage of :func:`validate`'s rows in words (``serving_bench.validate.coverage_line``)."""
    return validation.coverage_line(validation.coverage(rows, IntervalOptions().confidence), None)


def ensemble_batch_floors(repo, config) -> dict[str, int]:
    """Per ensemble member, the largest ``max_batch_size`` of the ensembles that call it: Triton refuses an ensemble
    whose max_batch_size exceeds a member's, so a search must not go below it."""
    floors: dict[str, int] = {}
    if not repo:
        return floors
    for name, members in config.ensembles:
        mbs = int(read_config(entry_dir(repo, name) / CONFIG_NAME).max_batch_size)
        for member in members:
            floors[member] = max(floors.get(member, 0), mbs)
    return floors
