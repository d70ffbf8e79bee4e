"""Python-backend runner of the ``sleep`` model: a deterministic service time, the calibration target.

Each executed batch (all requests Triton's dynamic batcher handed over at once) sleeps
``base_ms + per_item_ms * items``, where ``items`` is the number of rows in the batch, then echoes each request's input
as its output. ``base_ms`` and ``per_item_ms`` come from the config's ``parameters``, so one repository can hold
several sleep entries.
"""

import time

from serving_bench.serve.runners.base import BatchingRunner


class TritonPythonModel(BatchingRunner):
    def load(self):
        self.base_s = float(self.params.get("base_ms") or 0) / 1e3
        self.per_item_s = float(self.params.get("per_item_ms") or 0) / 1e3

    def run(self, inputs):
        x = inputs["input"]
        delay = self.base_s + self.per_item_s * len(x)
        if delay > 0:
            time.sleep(delay)
        return {"output": x}
