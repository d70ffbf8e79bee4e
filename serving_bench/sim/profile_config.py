"""The serving config a profile implies when no repository or serving YAML gives one: the one default that
``simulate`` and ``tune`` (and ``plan``) both use.

Each model is served as ``serving-bench export`` writes it and Triton then serves it: one instance on the model's
first measured device, the dynamic batcher on with Triton's defaults (``dynamic_batching {}``: batches as large as
the queue allows, no delay, no preferred sizes), up to the largest batch size the profile measured. By default
``serving-bench profile`` measures its entry's batch sizes from 1 up to the entry's ``max_batch_size``
(``calibrate.plan``), so that largest size is the measured repository's ``max_batch_size``; a model measured at
batch 1 only gets 1 (one request per execution). A model not measured at batch 1 is served without batching
(``max_batch_size`` 0): the simulator can run no other size.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from serving_bench.profiles.schema import Profile
from serving_bench.serving_config import ModelServing, ServingConfig


def max_servable_batch(profile: Profile, name: str, devices: Iterable[str]) -> int:
    """The largest ``max_batch_size`` the simulator can run for ``name`` on ``devices``: every executed batch size
    1..max must lie in the measured range, so the smallest of the devices' largest measured sizes; 0 when batch 1
    was not measured on one of them."""
    best = None
    for device in devices:
        sizes = profile.on_device(name, device).batch_sizes
        top = sizes[-1] if sizes[0] == 1 else 0
        best = top if best is None else min(best, top)
    return best or 0


def config_from_profile(profile: Profile, models: Sequence[str]) -> ServingConfig:
    """One entry per model of ``models`` as the module doc says: one instance on its first measured device (in name
    order), dynamic batching up to :func:`max_servable_batch` (none when that is 0)."""
    entries = []
    for name in models:
        device = sorted(profile.model(name).devices)[0]
        largest = max_servable_batch(profile, name, [device])
        entries.append(ModelServing(name, max_batch_size=largest, dynamic_batching=largest > 0,
                                    instances=((device, 1),)))
    return ServingConfig(tuple(entries))
