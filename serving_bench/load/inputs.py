"""Request payloads, built from what the server says a model takes, before the clock starts.

For each model the driver reads ``get_model_metadata`` (input names, datatypes, shapes) and ``get_model_config``
(``max_batch_size``, ensemble steps). Sample ``k`` of a model is one item (one row of every input) drawn from
``numpy.random.default_rng([sample_seed, k])`` — or row ``k mod N`` of the profile's ``.npy`` file for that input.
A request of batch size ``b`` and sample ``k`` carries items ``k, k+1, ..., k+b-1`` (mod the number of samples).
Every (model, sample, batch) the schedule uses becomes one serialized ``ModelInferRequest`` (tritonclient's
protobuf), so sending costs no tensor or protobuf work.

Random data by datatype: floats ~ N(0, 1); integers uniform in [0, 100) except inputs whose name contains ``mask``
(all ones, a valid attention mask); BOOL uniform; BYTES short ASCII strings. Dynamic dimensions (-1 after the batch
axis) take their size from the profile's ``shapes`` (an error names the model and input otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from serving_bench.errors import InputError
from serving_bench.serving_config import batch_refusal, queue_policy_settings

NUMPY_OF = {"BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
            "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
            "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_}


@dataclass(frozen=True)
class TensorSpec:
    """One input as the server declares it: ``shape`` without the batch axis (-1 = dynamic)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelSpec:
    """What a served model takes. ``max_batch_size`` 0 means the model does not batch (shape is the full shape).
    ``instances``: its instance count as served; ``queue_policy``: the settings that turn Triton's payload
    prefetching off (:func:`serving_bench.serving_config.queue_policy_settings`)."""

    name: str
    inputs: tuple[TensorSpec, ...]
    max_batch_size: int
    platform: str = ""
    ensemble_members: tuple[str, ...] = ()
    instances: int = 1
    queue_policy: tuple[str, ...] = ()

    @classmethod
    def from_server(cls, metadata, config) -> "ModelSpec":
        """From tritonclient's ``ModelMetadataResponse`` and the served ``ModelConfig`` (protobufs)."""
        cfg = config
        batched = cfg.max_batch_size > 0
        inputs = tuple(TensorSpec(i.name, i.datatype, tuple(int(d) for d in (i.shape[1:] if batched else i.shape)))
                       for i in metadata.inputs)
        members = tuple(step.model_name for step in cfg.ensemble_scheduling.step)
        instances = sum(max(1, g.count) * max(1, len(g.gpus)) for g in cfg.instance_group) or 1
        return cls(metadata.name, inputs, int(cfg.max_batch_size), cfg.platform or cfg.backend, members, instances,
                   queue_policy_settings(cfg))


def _random_item(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = NUMPY_OF.get(spec.datatype)
    if dtype is None:
        raise InputError(None, spec.name, f"datatype {spec.datatype} is not supported by the load generator")
    if spec.datatype == "BYTES":
        letters = rng.integers(97, 123, size=(*shape, 8))
        return np.array([bytes(row.tolist()) for row in letters.reshape(-1, 8)], dtype=np.object_).reshape(shape)
    if spec.datatype == "BOOL":
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        if "mask" in spec.name.lower():
            return np.ones(shape, dtype=dtype)
        return rng.integers(0, 100, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _item_shape(model: ModelSpec, spec: TensorSpec, shapes: Mapping[str, Sequence[int]], source) -> tuple[int, ...]:
    shape = spec.shape
    if any(d < 0 for d in shape):
        given = shapes.get(spec.name)
        if given is None or len(given) != len(shape) or any(d >= 0 and g != d for d, g in zip(shape, given)):
            raise InputError(source, f"models.{model.name}.shapes.{spec.name}",
                             f"the input has dynamic shape {list(shape)}; expected a matching list of sizes")
        shape = tuple(int(g) for g in given)
    return shape


class SampleBank:
    """The items of one model: ``items[input][k]`` is sample ``k`` of that input (batch axis first)."""

    def __init__(self, model: ModelSpec, *, samples: int, seed: int, files: Mapping[str, str] | None = None,
                 shapes: Mapping[str, Sequence[int]] | None = None, source: str | None = None):
        self.model = model
        files = dict(files or {})
        shapes = dict(shapes or {})
        unknown = sorted(set(files) - {s.name for s in model.inputs})
        if unknown:
            raise InputError(source, f"models.{model.name}.inputs.{unknown[0]}",
                             f"not an input of the served model; inputs: {', '.join(s.name for s in model.inputs)}")
        self.items: dict[str, np.ndarray] = {}
        for spec in model.inputs:
            if spec.name in files:
                self.items[spec.name] = self._from_file(spec, files[spec.name], source)
            else:
                shape = _item_shape(model, spec, shapes, source)
                rows = [_random_item(spec, shape, np.random.default_rng([seed, k])) for k in range(samples)]
                self.items[spec.name] = np.stack(rows)

    def _from_file(self, spec: TensorSpec, path: str, source) -> np.ndarray:
        field = f"models.{self.model.name}.inputs.{spec.name}"
        try:
            data = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise InputError(source, field, f"cannot read {path} as .npy: {err}") from None
        if data.ndim != len(spec.shape) + 1 or any(d >= 0 and d != s for d, s in zip(spec.shape, data.shape[1:])):
            raise InputError(source, field, f"{path} has shape {list(data.shape)}; expected [N, "
                                            f"{', '.join(str(d) for d in spec.shape)}] (N samples)")
        want = NUMPY_OF[spec.datatype]
        if spec.datatype != "BYTES" and not np.can_cast(data.dtype, want, casting="same_kind"):
            raise InputError(source, field, f"{path} holds {data.dtype}; expected {np.dtype(want).name}")
        return data.astype(want, copy=False) if spec.datatype != "BYTES" else data

    def batch(self, sample: int, size: int) -> dict[str, np.ndarray]:
        """Inputs of a request: items ``sample .. sample+size-1`` (mod the sample count), batch axis first."""
        out = {}
        for name, items in self.items.items():
            rows = (sample + np.arange(size)) % len(items)
            out[name] = items[rows]
        return out


def infer_request(model: ModelSpec, inputs: Mapping[str, np.ndarray]) -> bytes:
    """A serialized ``inference.ModelInferRequest`` carrying ``inputs`` (raw binary tensors)."""
    request = service_pb2.ModelInferRequest(model_name=model.name)
    for spec in model.inputs:
        array = inputs[spec.name]
        if model.max_batch_size == 0:
            array = array[0]  # a model without a batch axis takes one item
        tensor = request.inputs.add(name=spec.name, datatype=spec.datatype, shape=list(array.shape))
        del tensor  # shape and type are all the server needs; the bytes go in raw_input_contents
        if spec.datatype == "BYTES":
            request.raw_input_contents.append(serialize_byte_tensor(array).tobytes())
        else:
            request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    return request.SerializeToString()


def check_batch(model: ModelSpec, batch: int, source) -> None:
    """Raise :class:`InputError` if the model cannot take a request of ``batch`` items."""
    problem = batch_refusal(model.max_batch_size, batch)
    if problem:
        raise InputError(source, f"models.{model.name}.batch", problem)
