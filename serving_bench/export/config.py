"""``config.pbtxt`` of an exported entry, built as a ``ModelConfig`` protobuf (``model_config_pb2``).

Every framework gets the same input/output names, dtypes and dims (without the batch axis), ``max_batch_size``,
``dynamic_batching`` and one ``instance_group`` (``KIND_GPU`` where the framework can use a GPU and torch sees one,
else ``KIND_CPU``) with the requested count.
"""

from __future__ import annotations

from typing import Mapping

from tritonclient.grpc import model_config_pb2 as mc

from serving_bench.export.frameworks import ExportOptions, Framework
from serving_bench.export.repository import NUMPY_TO_TRITON, ModelConfig
from serving_bench.models import ModelSpec, TensorSpec


def add_tensors(config: ModelConfig, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> None:
    for t in inputs:
        config.input.add(name=t.name, data_type=NUMPY_TO_TRITON[t.dtype], dims=list(t.shape))
    for t in outputs:
        config.output.add(name=t.name, data_type=NUMPY_TO_TRITON[t.dtype], dims=list(t.shape))


def instance_kind(gpu: bool) -> int:
    return mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU


def entry_config(name: str, spec: ModelSpec, framework: Framework, opts: ExportOptions, *, gpu: bool,
                 parameters: Mapping[str, str] | None = None) -> ModelConfig:
    """The config of entry ``name`` = ``spec`` exported with ``framework``."""
    config = ModelConfig(name=name, max_batch_size=opts.max_batch_size)
    if framework.platform:
        config.platform = framework.platform
    else:
        config.backend = framework.backend
    add_tensors(config, spec.inputs, spec.outputs)
    config.dynamic_batching.SetInParent()
    config.instance_group.add(count=opts.instances, kind=instance_kind(gpu and framework.gpu_capable))
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = str(value)
    return config
