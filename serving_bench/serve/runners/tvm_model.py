"""Python-backend runner of a TVM entry: ``1/model.so`` (compiled by ``serving_bench/export/tvm_export.py``) run by
a ``relax.VirtualMachine`` on the CPU, with the entry's ``intra_op_thread_count`` (its variant's ``intra=N``), else
``threads_per_instance`` (or ``OMP_NUM_THREADS``), TVM threads.

It loads the library through the same function the exporter's parity check used, so what was checked is what is
served. The batch axis of ``model.so`` is symbolic, so any batch 1..max_batch_size runs without padding; a tuned
entry (parameter ``buckets``) runs each batch in the smallest tuned static bucket that holds it, zero-padded.
"""

from serving_bench.export.frameworks import load_predictor
from serving_bench.serve.runners.base import BatchingRunner


class TritonPythonModel(BatchingRunner):
    def load(self):
        self.predict = load_predictor("tvm", self.model_dir, self.input_names, self.output_names, device="cpu",
                                      threads=self.threads, buckets=self.params.get("buckets") or None, **self.settings)

    def run(self, inputs):
        return self.predict(inputs)
