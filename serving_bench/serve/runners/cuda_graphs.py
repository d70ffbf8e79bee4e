"""CUDA graphs for a TorchScript module on a GPU: one captured graph per batch size, padded batches between them.

Why: eager PyTorch at small batch is CPU-launch-bound (DESIGN.md: ResNet-50 on the H200 takes ~4 ms at batch 1-32
eager, ~1 ms at batch 1 as a replayed graph). A graph replays the recorded kernels on fixed buffers, so each batch
size needs its own graph. :class:`CudaGraphPredictor` captures the sizes it is given at construction (after a few
warm-up runs on a side stream, as torch requires), then runs a batch of ``b`` rows on the smallest captured size
``>= b``, padding the extra rows with zeros and dropping their outputs. Batches larger than every captured size run
eagerly. Outputs are copied to host memory before the next replay can overwrite them.

Only usable where torch sees a CUDA device; nothing here has run on the CPU-only development machines (see
docs/serve.md#gpu-instances-and-cuda-graphs), and the GPU check script is what exercises it.
"""

from __future__ import annotations

import bisect
from typing import Mapping, Sequence

import numpy as np

WARMUP_RUNS = 3


def parse_batch_sizes(text: str, max_batch_size: int) -> list[int]:
    """``"all"`` -> 1..max; ``"1,2,4,8"`` -> those sizes (each 1..max, sorted, unique); ``""`` -> []."""
    text = (text or "").strip().lower()
    if text in ("", "0", "false", "off", "no"):
        return []
    upper = max(1, max_batch_size)
    if text in ("all", "true", "on", "yes", "1..max"):
        return list(range(1, upper + 1))
    sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    if not sizes or sizes[0] < 1 or sizes[-1] > upper:
        raise ValueError(f"cuda_graphs={text!r}: expected 'all' or batch sizes in 1..{upper}, comma-separated")
    return sizes


class CudaGraphPredictor:
    """``predict({name: array}) -> {name: array}`` replaying CUDA graphs of ``module`` on ``device``.

    ``example`` gives one row per input (dtype and shape after the batch axis) used to build the capture buffers.
    """

    def __init__(self, module, device: str, input_names: Sequence[str], output_names: Sequence[str],
                 example: Mapping[str, np.ndarray], batch_sizes: Sequence[int]):
        import torch  # heavy: ~1 s to import

        self.torch = torch
        self.module = module
        self.device = torch.device(device)
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.sizes = sorted(batch_sizes)
        self.graphs: dict[int, tuple] = {}
        self.pool = None  # one memory pool shared by all graphs of this instance
        for size in reversed(self.sizes):  # largest first: later, smaller graphs reuse its pool
            self.graphs[size] = self._capture(size, example)

    def _capture(self, size: int, example: Mapping[str, np.ndarray]) -> tuple:
        torch = self.torch
        static_in = [torch.zeros((size, *np.asarray(example[n]).shape[1:]),
                                 dtype=torch.from_numpy(np.asarray(example[n])[:0]).dtype, device=self.device)
                     for n in self.input_names]
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.inference_mode(), torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self.module(*static_in)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self.pool):
            out = self.module(*static_in)
        if self.pool is None:
            self.pool = graph.pool()
        static_out = list(out) if isinstance(out, (list, tuple)) else [out]
        if len(static_out) != len(self.output_names):
            raise RuntimeError(f"model returned {len(static_out)} outputs, config declares {len(self.output_names)}")
        return graph, static_in, static_out

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        rows = len(inputs[self.input_names[0]])
        at = bisect.bisect_left(self.sizes, rows)
        if at == len(self.sizes):  # larger than every graph: eager
            with torch.inference_mode():
                out = self.module(*[torch.from_numpy(inputs[n]).to(self.device) for n in self.input_names])
            out = list(out) if isinstance(out, (list, tuple)) else [out]
            return {n: t.cpu().numpy() for n, t in zip(self.output_names, out)}
        graph, static_in, static_out = self.graphs[self.sizes[at]]
        for name, buffer in zip(self.input_names, static_in):
            buffer[:rows].copy_(torch.from_numpy(inputs[name]))
            if rows < len(buffer):
                buffer[rows:].zero_()
        graph.replay()
        return {n: t[:rows].cpu().numpy() for n, t in zip(self.output_names, static_out)}  # .cpu() synchronises
