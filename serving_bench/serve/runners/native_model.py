"""Python-backend runner of a native entry (``onnxruntime_onnx``, ``pytorch_libtorch``, ``tensorrt_plan``) in the
embedded server: the same artifact, run by the same runtime, loaded by the same function the exporter's parity
check used (:func:`serving_bench.export.frameworks.load_predictor`).

Parameters written by :func:`serving_bench.serve.runners.runtime_entry`: ``framework`` (``onnxruntime``,
``torchscript``, ``tensorrt``), ``original_platform``, ``threads_per_instance``, and optionally ``cuda_graphs``
(TorchScript on a KIND_GPU instance: ``all`` or batch sizes such as ``1,2,4,8``; see ``cuda_graphs.py``). The
entry's variant settings (threads, ONNX Runtime's graph level and execution mode) are read by the base class from
the fields Triton's native backends read (:func:`serving_bench.export.variants.loader_settings`).
KIND_GPU instances run on ``cuda:<device id>``; a GPU instance where torch sees no GPU, or an ONNX Runtime entry on a
GPU instance where onnxruntime has no CUDA provider, fails to load with that reason (never a silent CPU fallback).
"""

import numpy as np

from serving_bench.export.frameworks import get_framework, load_predictor
from serving_bench.serve.runners.base import BatchingRunner
from serving_bench.serve.runners.cuda_graphs import CudaGraphPredictor, parse_batch_sizes


class TritonPythonModel(BatchingRunner):
    def load(self):
        framework = self.params.get("framework", "")
        reason = get_framework(framework, "parameters.framework").impl().unavailable_reason()
        if reason:
            raise RuntimeError(f"cannot serve {self.params.get('original_platform', framework)}: {reason}")
        if self.device.startswith("cuda"):
            import torch  # heavy: ~1 s to import

            if not torch.cuda.is_available():
                raise RuntimeError(f"KIND_GPU instance on {self.device}, but torch sees no CUDA GPU")
            if framework == "onnxruntime":  # ORT would quietly fall back to its CPU provider
                import onnxruntime  # heavy: ~0.3 s to import

                if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
                    raise RuntimeError("KIND_GPU instance, but this onnxruntime has no CUDAExecutionProvider "
                                       f"(providers: {', '.join(onnxruntime.get_available_providers())}); "
                                       "serve the entry with KIND_CPU instances or install onnxruntime-gpu")
        graphs = self.params.get("cuda_graphs", "")
        if graphs and framework == "torchscript" and self.device.startswith("cuda"):
            self.predict = self._cuda_graph_predictor(graphs)
        else:
            self.predict = load_predictor(framework, self.model_dir, self.input_names, self.output_names,
                                          device=self.device, threads=self.threads, **self.settings)

    def _cuda_graph_predictor(self, text):
        import torch  # heavy: ~1 s to import
        import triton_python_backend_utils as pb_utils  # exists only in Triton's python stub

        torch.set_num_threads(self.threads)
        if self.settings.get("inter_threads"):
            torch.set_num_interop_threads(self.settings["inter_threads"])
        module = torch.jit.load(str(self.model_dir / "model.pt"), map_location=self.device).eval()
        if any(int(d) < 0 for i in self.config["input"] for d in i["dims"]):
            raise RuntimeError("cuda_graphs needs fixed input dims (a graph replays fixed shapes); got -1")
        example = {i["name"]: np.zeros([1] + [int(d) for d in i["dims"]],
                                       dtype=pb_utils.triton_string_to_numpy(i["data_type"]))
                   for i in self.config["input"]}
        sizes = parse_batch_sizes(text, int(self.config.get("max_batch_size", 0)))
        return CudaGraphPredictor(module, self.device, self.input_names, self.output_names, example, sizes)

    def run(self, inputs):
        return self.predict(inputs)
