"""Repository entry for the ``sleep`` model (a python-backend model; no framework artifact to export or compare)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from serving_bench.export.repository import ModelConfig, staged_entry, write_config
from serving_bench.models import SLEEP_FEATURES

SLEEP_RUNNER = Path(__file__).resolve().parents[1] / "serve" / "runners" / "sleep_model.py"


def sleep_config(name: str, *, base_ms: float, per_item_ms: float, max_batch_size: int = 32, instances: int = 1,
                 max_queue_delay_us: int = 0, preferred_batch_sizes: tuple[int, ...] = ()) -> ModelConfig:
    """Config of a sleep entry: service time ``base_ms + per_item_ms * items`` per executed batch (milliseconds)."""
    config = ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
    config.input.add(name="input", data_type=mc.TYPE_FP32, dims=[SLEEP_FEATURES])
    config.output.add(name="output", data_type=mc.TYPE_FP32, dims=[SLEEP_FEATURES])
    if max_batch_size > 0:
        config.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
        config.dynamic_batching.preferred_batch_size.extend(preferred_batch_sizes)
    config.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.parameters["base_ms"].string_value = repr(float(base_ms))
    config.parameters["per_item_ms"].string_value = repr(float(per_item_ms))
    return config


def write_sleep_entry(repo: str | Path, name: str = "sleep_python", *, overwrite: bool = False, **kwargs) -> Path:
    """Write ``<repo>/<name>`` (config + ``1/model.py``) atomically; ``kwargs`` go to :func:`sleep_config`."""
    with staged_entry(repo, name, overwrite=overwrite) as staging:
        write_config(sleep_config(name, **kwargs), staging / "config.pbtxt")
        (staging / "1").mkdir()
        shutil.copy2(SLEEP_RUNNER, staging / "1" / "model.py")
    return Path(repo) / name
