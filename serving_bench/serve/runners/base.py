"""The shared python-backend loop: one executed batch = all requests Triton's batcher handed to ``execute``.

A runner file (copied into an entry's version folder as ``model.py``) subclasses :class:`BatchingRunner` as
``TritonPythonModel`` and implements :meth:`load` and :meth:`run`. This class concatenates the requests' inputs along
the batch axis, calls ``run`` once, splits the outputs back per request, and turns any exception into a Triton error
response for every request of the batch (the server keeps running).

With the config parameter ``execution_log`` (a folder; set by ``TritonServer(..., execution_log=True)``) every
instance records each executed batch: start and end (``perf_counter``), rows and requests
(:mod:`serving_bench.serve.execution_log`).

Only importable inside the python backend (it needs ``triton_python_backend_utils``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from serving_bench.export.variants import loader_settings
from serving_bench.serve.execution_log import PARAMETER, ExecutionLogWriter
from serving_bench.serve.malloc import fix_mmap_threshold


class BatchingRunner:
    """Base of every runner. Subclasses set up state in :meth:`load` and compute in :meth:`run`."""

    def initialize(self, args: dict) -> None:
        self.config = json.loads(args["model_config"])
        self.params = {k: v.get("string_value", "") for k, v in self.config.get("parameters", {}).items()}
        self.input_names = [i["name"] for i in self.config["input"]]
        self.output_names = [o["name"] for o in self.config["output"]]
        self.output_dtypes = {o["name"]: pb_utils.triton_string_to_numpy(o["data_type"]) for o in self.config["output"]}
        self.batched = int(self.config.get("max_batch_size", 0)) > 0
        self.model_dir = Path(args["model_repository"]) / args["model_version"]
        self.device = "cuda:%s" % args["model_instance_device_id"] if args.get("model_instance_kind") == "GPU" else "cpu"
        # the entry's variant settings (serving_bench.export.variants), read from the fields a native backend reads;
        # intra-op threads the entry states win over the server's threads_per_instance
        graph_level = self.config.get("optimization", {}).get("graph", {}).get("level", 0)
        self.settings = loader_settings(self.params.get("framework", ""), self.params, graph_level)
        self.threads = self.settings.pop("threads", None) or \
            int(self.params.get("threads_per_instance") or os.environ.get("OMP_NUM_THREADS") or 1)
        folder = self.params.get(PARAMETER)
        self.execution_log = ExecutionLogWriter(folder, args["model_name"], args["model_instance_name"]) \
            if folder else None
        fix_mmap_threshold()  # memory that does not depend on the order of the batches run (serve.malloc)
        self.load()

    def load(self) -> None:
        """Load the artifact from ``self.model_dir`` onto ``self.device`` using ``self.threads`` intra-op threads and
        the variant's other runtime settings ``self.settings`` (keyword arguments of ``load_predictor``)."""

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Compute one batch: input name -> array (batch first) to output name -> array."""
        raise NotImplementedError

    def execute(self, requests):
        start, cpu = time.perf_counter(), time.process_time()
        responses, rows = self._execute(requests)
        if self.execution_log is not None:
            self.execution_log.write(start, time.perf_counter(), time.process_time() - cpu, rows, len(requests))
        return responses

    def finalize(self) -> None:
        if self.execution_log is not None:
            self.execution_log.close()

    def _execute(self, requests):
        """(responses, rows of the batch)."""
        rows = 0
        try:
            per_request = [{name: pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.input_names}
                           for r in requests]
            sizes = [len(x[self.input_names[0]]) for x in per_request] if self.batched else [1] * len(per_request)
            rows = sum(sizes)
            if self.batched and len(per_request) > 1:
                merged = {n: np.concatenate([x[n] for x in per_request]) for n in self.input_names}
                outputs = self.run(merged)
                cuts = np.cumsum(sizes)[:-1]
                split = {n: np.split(np.asarray(outputs[n]), cuts) for n in self.output_names}
                results = [{n: split[n][i] for n in self.output_names} for i in range(len(requests))]
            else:
                results = [self.run(x) for x in per_request]
            return [pb_utils.InferenceResponse([
                pb_utils.Tensor(n, np.ascontiguousarray(out[n], dtype=self.output_dtypes[n])) for n in self.output_names])
                for out in results], rows
        except Exception as err:  # answer every request of the batch with the error; the server keeps running
            message = f"{type(err).__name__}: {err}"
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(message)) for _ in requests], rows
