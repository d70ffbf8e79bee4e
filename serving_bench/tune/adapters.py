"""The one place that calls the other packages' APIs (load profiles, simulator, profiles, replay), so the tuner,
the planner and the demo stay a thin orchestration of them.

Everything here is picklable (Ray ships it to workers) and imports its package lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from serving_bench.load.schedule import Schedule


@dataclass(frozen=True)
class ScheduleBuilder:
    """``builder(seed)`` -> the Schedule of the load profile at ``path`` with that seed (engineer C's
    ``LoadProfile`` + ``build_schedule``); ``duration_s`` overrides the profile's duration."""

    path: str
    duration_s: float | None = None

    def profile(self):
        import dataclasses

        from serving_bench.load.profile import LoadProfile

        prof = LoadProfile.load(self.path)
        if self.duration_s is not None:
            prof = dataclasses.replace(prof, duration_s=float(self.duration_s))
        return prof

    def __call__(self, seed: int | None = None) -> Schedule:
        import dataclasses

        from serving_bench.load.profile import build_schedule

        prof = self.profile()
        return build_schedule(prof if seed is None else dataclasses.replace(prof, seed=int(seed)))


def load_profile(path: str | Path):
    """The simulator's hardware profile (engineer D's ``Profile.load``)."""
    from serving_bench.profiles import Profile

    return Profile.load(path)


def simulate(profile, config, schedule: Schedule, seed: int = 0):
    """Records of ``schedule`` run through ``SimTarget`` with ``config`` (engineer D)."""
    from serving_bench.sim import SimTarget

    return SimTarget(profile, config, seed=seed).run(schedule)


def replay(endpoints, schedule: Schedule):
    """Records of ``schedule`` replayed open loop against a running Triton (engineer C's ``TritonTarget``)."""
    from serving_bench.load import TritonTarget

    return TritonTarget(endpoints).run(schedule)


def config_from_profile(profile, models) -> "ServingConfig":
    """A base serving config for a profile without a repository: one entry per schedule model, batching up to
    the largest batch size the profile measured (engineer D's profile)."""
    from serving_bench.serving_config import ModelServing, ServingConfig

    entries = []
    for name in models:
        mbs = int(profile.max_batch_size(name))
        entries.append(ModelServing(name, max_batch_size=mbs, dynamic_batching=mbs > 0))
    return ServingConfig(tuple(entries))


def profile_description(profile) -> str:
    """One line: device and execution mode of a profile (say 'eager mode' where it was measured in eager)."""
    describe = getattr(profile, "describe", None)
    return describe() if callable(describe) else str(getattr(profile, "device", "profile"))


def utilisation(records, summary) -> float | None:
    """Busy fraction of the simulated device, where the simulator reports it (else None)."""
    value = records.attrs.get("utilisation") if hasattr(records, "attrs") else None
    if isinstance(value, dict):
        value = max(value.values()) if value else None
    return float(value) if isinstance(value, (int, float)) else None


def measure_profile(repo, models, out_path, log=None):
    """Measure a simulator profile of ``models`` on the embedded Triton and save it (engineer D's profiling)."""
    from serving_bench.profiles import measure

    return measure.measure_profile(repo, models, out_path, log=log)


def validate(load_profile, repo, profile_path, out_dir, replay_dir=None):
    """Simulated vs measured table for the same schedule (engineer D's ``validate``); returns its rows."""
    from serving_bench.sim import validate as sim_validate

    return sim_validate.run_validation(load_profile, repo, profile_path, out_dir, replay_dir=replay_dir)
