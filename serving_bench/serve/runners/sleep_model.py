"""Python-backend runner of the ``sleep`` model: a deterministic service time, the calibration target.

Each ``execute`` call (one batch formed by Triton's dynamic batcher) sleeps ``base_ms + per_item_ms * items`` where
``items`` is the sum of the requests' batch dimensions, then echoes each request's input as its output. Parameters
come from the config's ``parameters`` (``base_ms``, ``per_item_ms``), so one repository can hold several sleep entries.
"""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.base_s = float(params.get("base_ms", {}).get("string_value", "0")) / 1e3
        self.per_item_s = float(params.get("per_item_ms", {}).get("string_value", "0")) / 1e3

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "input").as_numpy() for r in requests]
        items = sum(int(x.shape[0]) for x in inputs)
        delay = self.base_s + self.per_item_s * items
        if delay > 0:
            time.sleep(delay)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("output", x)]) for x in inputs]
