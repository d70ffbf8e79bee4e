"""Payload preparation, before the clock starts: the schedule's models checked against the server, and every request
it needs serialized once (:mod:`serving_bench.load.inputs`).

A request is identified by (model, sample, batch); requests that share all three share one payload. Each model with
requests gets one warm-up payload (its first), sent before the run so the first measured request does not pay for a
cold channel or model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from serving_bench.errors import InputError
from serving_bench.load.inputs import ModelSpec, SampleBank, check_batch, infer_request
from serving_bench.run.schedule import Schedule
from serving_bench.serve.control import Control

_KEY = 100003  # (sample, batch) -> sample * _KEY + batch; batches are far below it


@dataclass(frozen=True)
class Payloads:
    """``payloads[index[i]]`` is request ``i``'s serialized ``ModelInferRequest``; ``warmup`` indexes one payload per
    model; ``facts`` is what the server said about the models (``ensembles``: name -> members, ``platforms``,
    ``instances``, ``queue_policies``)."""

    payloads: list[bytes]
    index: np.ndarray
    warmup: list[int]
    facts: dict


def fetch_specs(url: str, models: Sequence[str], source: str) -> dict[str, ModelSpec]:
    """What each of ``models`` takes, from the server at gRPC ``url``; a model it does not serve is an
    :class:`InputError` (``source``: the file that named it) listing the served ones."""
    with Control(url) as control:
        served = control.served_models()
        specs = {}
        for name in models:
            if name not in served:
                raise InputError(source, f"models.{name}",
                                 f"not served by the server at {url}; served models: {', '.join(served) or 'none'}")
            specs[name] = ModelSpec.from_server(control.model_metadata(name), control.model_config(name))
        return specs


def prepare_payloads(schedule: Schedule, specs: dict[str, ModelSpec], source: str) -> Payloads:
    """Serialize every request of ``schedule`` (inputs from ``schedule.meta['inputs']``, seeded by the schedule's
    seed); an impossible batch size or a bad input file is an :class:`InputError` naming ``source``."""
    inputs_meta = schedule.meta.get("inputs", {})
    seed = int(schedule.meta.get("seed", 0))
    payloads: list[bytes] = []
    index = np.zeros(len(schedule), dtype=np.int64)
    warmup: list[int] = []
    for m, name in enumerate(schedule.models):
        rows = np.flatnonzero(schedule.model == m)
        if not len(rows):
            continue
        spec = specs[name]
        info = inputs_meta.get(name, {})
        bank = SampleBank(spec, samples=int(info.get("samples", 16)), seed=int(info.get("seed", seed)),
                          files=info.get("files"), shapes=info.get("shapes"), source=source)
        for b in np.unique(schedule.batch[rows]):
            check_batch(spec, int(b), source)
        keys = schedule.sample[rows].astype(np.int64) * _KEY + schedule.batch[rows]
        unique, inverse = np.unique(keys, return_inverse=True)
        base = len(payloads)
        for key in unique:
            sample, batch = divmod(int(key), _KEY)
            payloads.append(infer_request(spec, bank.batch(sample, batch)))
        index[rows] = base + inverse
        warmup.append(base)
    facts = {"ensembles": {n: list(s.ensemble_members) for n, s in specs.items() if s.ensemble_members},
             "platforms": {n: s.platform for n, s in specs.items()},
             "instances": {n: s.instances for n, s in specs.items()},
             "queue_policies": {n: list(s.queue_policy) for n, s in specs.items() if s.queue_policy}}
    return Payloads(payloads, index, warmup, facts)
