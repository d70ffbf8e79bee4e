"""Triton's control plane, in one place: health, the repository index, model load/unload, statistics, trace settings,
model config and metadata — every call serving-bench makes to a server other than inference itself.

    with Control(endpoints.grpc_url) as control:
        control.ready(); control.served_models(); control.statistics(["m"])

One synchronous ``tritonclient.grpc`` client per :class:`Control` (gRPC works on every server the tool talks to; the
HTTP port of an external server is only guessed). A server that does not answer is a :class:`ServerError` naming the
address, except in :meth:`Control.live` / :meth:`Control.ready`, which answer False. Times in seconds; Triton's own
counters stay in its units (``*_ns``) and :func:`stats_delta` turns them into seconds per request;
:meth:`Control.model_times` reads them per executed batch size (:class:`ModelTimes`, whose difference around a run
is that run's).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from serving_bench.errors import ServerError

PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
COMPUTE_PHASES = ("compute_input", "compute_infer", "compute_output")  # what the per-batch-size statistics hold
Duration = tuple[int, int]  # Triton's StatisticDuration: (count, cumulative ns)


@dataclass(frozen=True)
class ModelTimes:
    """One model's cumulative counters from Triton's statistics extension (every backend reports them, native ones
    included): per executed batch size each of :data:`COMPUTE_PHASES` as (executions, ns) (``by_batch``); per
    request (the extension has no queue time per batch size) ``queue`` (from the request reaching the scheduler to
    its batch's execution) and ``success`` (the whole request inside the server) as (requests, ns); ``inferences``
    (rows) and ``executions`` (batches). :meth:`minus` of the counters before a run is that run's."""

    by_batch: Mapping[int, Mapping[str, Duration]] = field(default_factory=dict)
    queue: Duration = (0, 0)
    success: Duration = (0, 0)
    inferences: int = 0
    executions: int = 0

    def minus(self, before: "ModelTimes") -> "ModelTimes":
        """The counters since ``before`` (batch sizes that ran no batch since then are left out)."""
        by_batch = {}
        for b, phases in self.by_batch.items():
            old = before.by_batch.get(b, {})
            delta = {p: _minus(d, old.get(p, (0, 0))) for p, d in phases.items()}
            if delta["compute_infer"][0] > 0:
                by_batch[b] = delta
        return ModelTimes(by_batch, _minus(self.queue, before.queue), _minus(self.success, before.success),
                          self.inferences - before.inferences, self.executions - before.executions)

    def executed(self, batch: int) -> int:
        """Batches of exactly ``batch`` rows executed."""
        return self.by_batch.get(batch, {}).get("compute_infer", (0, 0))[0]

    def compute_s(self, batch: int) -> float | None:
        """Mean compute time (s; input + infer + output) of the executed batches of exactly ``batch`` rows (None:
        none ran)."""
        count = self.executed(batch)
        return sum(d[1] for d in self.by_batch[batch].values()) * 1e-9 / count if count else None

    def batch_counts(self) -> dict[int, Duration]:
        """Per executed batch size (executions, compute ns): :meth:`Control.batch_stats`' form."""
        return {b: (self.executed(b), sum(d[1] for d in phases.values())) for b, phases in self.by_batch.items()}

    @property
    def queue_s(self) -> float | None:
        """Mean queue time per request (s; None: no request)."""
        return self.queue[1] * 1e-9 / self.queue[0] if self.queue[0] else None

    @property
    def success_s(self) -> float | None:
        """Mean time per successful request inside the server (s; None: none)."""
        return self.success[1] * 1e-9 / self.success[0] if self.success[0] else None


def _minus(a: Duration, b: Duration) -> Duration:
    return a[0] - b[0], a[1] - b[1]


class Control:
    """The control plane of the Triton server at gRPC ``url`` (``host:port``); ``timeout_s`` bounds each call."""

    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url = url
        self.timeout_s = timeout_s
        self._client = grpcclient.InferenceServerClient(url)

    def __enter__(self) -> "Control":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _call(self, what: str, fn, *args, **kwargs) -> Any:
        try:
            return fn(*args, client_timeout=self.timeout_s, **kwargs)
        except InferenceServerException as err:
            raise ServerError(f"cannot {what} on Triton at {self.url}: {err.message()}") from None

    # -- health ----------------------------------------------------------------------------------------------------
    def live(self) -> bool:
        """The server answers ``live`` (False when it does not answer at all)."""
        try:
            return bool(self._client.is_server_live(client_timeout=self.timeout_s))
        except InferenceServerException:
            return False

    def ready(self) -> bool:
        """The server answers ``ready`` (False when it does not answer at all; after a refused connection the channel
        waits out gRPC's reconnect backoff, so to poll a starting server use a new :class:`Control` each time)."""
        try:
            return bool(self._client.is_server_ready(client_timeout=self.timeout_s))
        except InferenceServerException:
            return False

    # -- repository ------------------------------------------------------------------------------------------------
    def served_models(self) -> list[str]:
        """Names of the models in state READY, sorted."""
        index = self._call("read the repository index", self._client.get_model_repository_index)
        return sorted(m.name for m in index.models if m.state == "READY")

    def load_model(self, name: str, config: mc.ModelConfig | None = None) -> None:
        """Load (or reload) ``name``, with ``config`` overriding its ``config.pbtxt`` (explicit model control)."""
        override = json_format.MessageToJson(config) if config is not None else None
        self._call(f"load {name}", self._client.load_model, name, config=override)

    def unload_model(self, name: str) -> None:
        self._call(f"unload {name}", self._client.unload_model, name)

    def model_config(self, name: str) -> mc.ModelConfig:
        """The configuration the server runs ``name`` with."""
        return self._call(f"read the config of {name}", self._client.get_model_config, name).config

    def model_metadata(self, name: str):
        """``ModelMetadataResponse`` of ``name`` (inputs, outputs, platform)."""
        return self._call(f"read the metadata of {name}", self._client.get_model_metadata, name)

    # -- statistics ------------------------------------------------------------------------------------------------
    def statistics(self, models: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
        """Triton's cumulative per-model counters (``inference_count``, ``execution_count``, ``busy_ns`` — the compute
        time of its executions from the per-batch-size statistics —, ``<phase>_count`` and ``<phase>_ns`` for each of
        :data:`PHASES`) for ``models`` (default: every served model)."""
        out = {}
        for name in self.served_models() if models is None else models:
            stats = self._call(f"read the statistics of {name}", self._client.get_inference_statistics, name)
            for s in stats.model_stats:
                inf = s.inference_stats
                busy = sum(b.compute_input.ns + b.compute_infer.ns + b.compute_output.ns for b in s.batch_stats)
                out[name] = {"inference_count": s.inference_count, "execution_count": s.execution_count,
                             "busy_ns": busy, **{f"{k}_count": getattr(inf, k).count for k in PHASES},
                             **{f"{k}_ns": getattr(inf, k).ns for k in PHASES}}
        return out

    def model_times(self, models: Sequence[str]) -> dict[str, ModelTimes]:
        """Each model's cumulative :class:`ModelTimes` (summed over its versions)."""
        out = {}
        for name in models:
            stats = self._call(f"read the statistics of {name}", self._client.get_inference_statistics, name)
            by_batch: dict[int, dict[str, Duration]] = {}
            queue, success, inferences, executions = (0, 0), (0, 0), 0, 0
            for s in stats.model_stats:
                for b in s.batch_stats:
                    phases = by_batch.setdefault(int(b.batch_size), {p: (0, 0) for p in COMPUTE_PHASES})
                    for p in COMPUTE_PHASES:
                        d = getattr(b, p)
                        phases[p] = (phases[p][0] + int(d.count), phases[p][1] + int(d.ns))
                inf = s.inference_stats
                queue = (queue[0] + int(inf.queue.count), queue[1] + int(inf.queue.ns))
                success = (success[0] + int(inf.success.count), success[1] + int(inf.success.ns))
                inferences += int(s.inference_count)
                executions += int(s.execution_count)
            out[name] = ModelTimes(by_batch, queue, success, inferences, executions)
        return out

    def batch_stats(self, models: Sequence[str]) -> dict[str, dict[int, Duration]]:
        """Triton's cumulative per-batch-size statistics: model -> executed batch size -> (executions, compute ns)."""
        return {name: times.batch_counts() for name, times in self.model_times(models).items()}

    # -- tracing ---------------------------------------------------------------------------------------------------
    def set_trace_level(self, level: str) -> None:
        """Triton's request trace level for every model (``OFF``, ``TIMESTAMPS``, ...)."""
        self._call("update the trace settings", self._client.update_trace_settings,
                   settings={"trace_level": [level]})


def stats_delta(before: dict, after: dict) -> dict:
    """Per model between two :meth:`Control.statistics`: requests, executions, mean batch, the server's mean time
    per request in each phase (s) and ``busy_s``, the compute time of its executions summed (instance-seconds)."""
    out = {}
    for name, a in after.items():
        b = before.get(name, {})
        d = {k: a[k] - b.get(k, 0) for k in a}
        count = d.get("success_count", 0)
        row = {"inference_count": d["inference_count"], "execution_count": d["execution_count"],
               "success_count": count, "fail_count": d.get("fail_count", 0),
               "mean_exec_batch": d["inference_count"] / d["execution_count"] if d["execution_count"] else None,
               "busy_s": d.get("busy_ns", 0) / 1e9}
        for phase in ("queue", "compute_input", "compute_infer", "compute_output", "success"):
            c = d.get(f"{phase}_count", 0)
            row[f"{phase}_mean_s"] = d[f"{phase}_ns"] / c / 1e9 if c else None
        out[name] = row
    return out


def metrics_answer(metrics_url: str, timeout_s: float = 1.0) -> bool:
    """Whether the metrics endpoint (``host:port``) answers ``/metrics`` with 200 (it starts after the gRPC and
    HTTP services, so a caller that samples telemetry right away waits for it)."""
    try:
        with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=timeout_s) as reply:
            return reply.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False
