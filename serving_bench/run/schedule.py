"""The Schedule: every request of a run, decided up front from a profile and a seed.

It is plain data (LoadGen's ``GenerateQueries``, AlpaServe's ``Workload``): the real replay (``TritonTarget``) and the
simulator (``SimTarget``) consume the same object, and nothing else decides when requests happen. Saved as ``.npz``
(no pickles) so a run can be repeated exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from serving_bench.errors import InputError
from serving_bench.files import atomic_write

SCHEDULE_FORMAT = 1


@dataclass(frozen=True, eq=False)
class Schedule:
    """Requests sorted by arrival.

    ``arrival_s``: float64 seconds from the start of the run, non-decreasing. ``model``: int32 index into ``models``
    (the served entry names: single models or ensembles). ``sample``: int32 index of the input sample to send.
    ``batch``: int32 batch size of each request (rows in its input tensor). ``meta``: JSON-able facts about how it
    was made (profile file, seed, duration_s, warmup_s, cooldown_s, slos, ...).
    """

    arrival_s: np.ndarray
    model: np.ndarray
    models: tuple[str, ...]
    sample: np.ndarray
    batch: np.ndarray
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        n = len(self.arrival_s)
        object.__setattr__(self, "arrival_s", np.ascontiguousarray(self.arrival_s, dtype=np.float64))
        for name in ("model", "sample", "batch"):
            arr = np.ascontiguousarray(getattr(self, name), dtype=np.int32)
            if arr.shape != (n,):
                raise ValueError(f"Schedule.{name} has shape {arr.shape}, expected ({n},)")
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "models", tuple(self.models))
        if n and (np.any(np.diff(self.arrival_s) < 0) or self.arrival_s[0] < 0):
            raise ValueError("Schedule.arrival_s must be non-negative and non-decreasing")
        if n and (self.model.min() < 0 or self.model.max() >= len(self.models)):
            raise ValueError("Schedule.model holds an index outside Schedule.models")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        """Scheduled length of the run: ``meta['duration_s']`` if set, else the last arrival."""
        return float(self.meta.get("duration_s", self.arrival_s[-1] if len(self) else 0.0))

    def model_names(self) -> np.ndarray:
        """Per-request entry name (object array)."""
        return np.asarray(self.models, dtype=object)[self.model]

    def equals(self, other: "Schedule") -> bool:
        """Same requests, models and meta (bit for bit)."""
        return (self.models == other.models and self.meta == other.meta
                and all(np.array_equal(getattr(self, k), getattr(other, k))
                        for k in ("arrival_s", "model", "sample", "batch")))

    def select(self, mask: np.ndarray) -> "Schedule":
        """The sub-schedule of the requests where ``mask`` is true (same model table and meta)."""
        return Schedule(self.arrival_s[mask], self.model[mask], self.models, self.sample[mask], self.batch[mask],
                        dict(self.meta))

    @classmethod
    def at_times(cls, times_s, model: str, rows: int = 1) -> "Schedule":
        """Requests of ``rows`` rows (sample 0) to one entry at ``times_s`` (seconds from the run's start,
        non-decreasing); ``duration_s`` the last of them."""
        n = len(times_s)
        return cls(np.asarray(times_s, dtype=np.float64), np.zeros(n, dtype=np.int32), (model,),
                   np.zeros(n, dtype=np.int32), np.full(n, rows, dtype=np.int32),
                   {"duration_s": float(times_s[-1]) if n else 0.0})

    @classmethod
    def closed_loop(cls, rows: Mapping[str, int], per_model: int, meta: dict) -> "Schedule":
        """The request pool of a closed loop (:class:`~serving_bench.run.target.ClosedLoop` sends the next of an
        entry's requests when one of its answers comes back): ``per_model`` requests of ``rows[m]`` rows (sample 0)
        to each entry ``m``, in ``rows``' order, all at time 0."""
        names = tuple(rows)
        n = per_model * len(names)
        return cls(np.zeros(n), np.repeat(np.arange(len(names), dtype=np.int32), per_model), names,
                   np.zeros(n, dtype=np.int32), np.repeat(np.array([rows[m] for m in names], dtype=np.int32),
                                                          per_model), meta)

    def save(self, path: str | Path) -> Path:
        """Write ``.npz`` (arrays + JSON meta; loadable without pickle)."""
        return atomic_write(path, lambda tmp: np.savez_compressed(
            tmp, format=np.array(SCHEDULE_FORMAT), arrival_s=self.arrival_s, model=self.model, sample=self.sample,
            batch=self.batch, models=np.array(json.dumps(list(self.models))),
            meta=np.array(json.dumps(self.meta, sort_keys=True))))

    @classmethod
    def load(cls, path: str | Path) -> "Schedule":
        """Read a schedule written by :meth:`save`; a malformed file is an :class:`InputError`."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                if int(data["format"]) != SCHEDULE_FORMAT:
                    raise InputError(path, "format", f"expected schedule format {SCHEDULE_FORMAT}")
                return cls(data["arrival_s"], data["model"], tuple(json.loads(str(data["models"]))),
                           data["sample"], data["batch"], json.loads(str(data["meta"])))
        except (OSError, KeyError, ValueError) as err:
            raise InputError(path, None, f"not a serving-bench schedule (.npz): {err}") from None
