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
    """``builder(seed)`` -> the Schedule of the load profile at ``path`` for that seed (engineer C's ``build_schedule``)."""

    path: str
    duration_s: float | None = None

    def __call__(self, seed: int) -> Schedule:
        from serving_bench.load import build_schedule

        kwargs = {"seed": seed}
        if self.duration_s is not None:
            kwargs["duration_s"] = self.duration_s
        return build_schedule(self.path, **kwargs)


def load_profile(path: str | Path):
    """The simulator's hardware profile (engineer D's ``Profile.load``)."""
    from serving_bench.profiles import Profile

    return Profile.load(path)


def simulate(profile, config, schedule: Schedule, seed: int = 0):
    """Records of ``schedule`` run through ``SimTarget`` with ``config`` (engineer D)."""
    from serving_bench.sim import SimTarget

    return SimTarget(profile, config, seed=seed).run(schedule)
