"""Python-backend combiner of an ensemble: averages the members' outputs (deep ensembles).

Its config has, for each output ``o`` of the members, inputs ``o__0 .. o__{k-1}`` (one per member) and the output
``o``; the mean is taken in float32 and cast to the output's dtype. See ``serving_bench/export/ensemble.py``.
"""

import numpy as np

from serving_bench.serve.runners.base import BatchingRunner


class TritonPythonModel(BatchingRunner):
    def load(self):
        self.groups = {name: [i for i in self.input_names if i.rsplit("__", 1)[0] == name]
                       for name in self.output_names}
        missing = [name for name, members in self.groups.items() if not members]
        if missing:
            raise ValueError(f"combiner config has no inputs {missing[0]}__0..: expected one per member")

    def run(self, inputs):
        return {name: np.mean([inputs[i].astype(np.float32) for i in members], axis=0)
                for name, members in self.groups.items()}
