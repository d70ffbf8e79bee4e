"""TorchScript exporter: ``torch.jit.trace`` -> ``model.pt`` (Triton ``pytorch_libtorch``).

Triton's libtorch backend maps inputs by the forward argument names (``input``, ``input_ids``, ...) and outputs by
their order in the config, so the names stay the zoo's.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from serving_bench.export.frameworks import ExportOptions, Predictor, outputs_dict
from serving_bench.models import ModelSpec


def unavailable_reason() -> str | None:
    return None  # torch is a hard dependency


def write(module, spec: ModelSpec, version_dir: Path, opts: ExportOptions) -> dict:
    import torch  # heavy: ~1 s to import

    example = tuple(torch.from_numpy(a) for a in spec.make_inputs(min(2, opts.max_batch_size), opts.seed).values())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated; Triton's libtorch needs it
        traced = torch.jit.trace(module, example, check_trace=False)
    traced.save(str(version_dir / "model.pt"))
    return {"torch": torch.__version__, "method": "trace"}


def load(version_dir: Path, input_names: list[str], output_names: list[str], *, device: str = "cpu",
         threads: int | None = None, inter_threads: int | None = None, **_settings) -> Predictor:
    """``threads`` and ``inter_threads`` are torch's process-wide intra- and inter-op thread counts (a served
    instance is a process of its own); the inter-op pool can be sized only before it first runs, so asking for
    another size later raises."""
    import torch  # heavy: ~1 s to import

    if threads:
        torch.set_num_threads(int(threads))
    if inter_threads and torch.get_num_interop_threads() != int(inter_threads):
        try:
            torch.set_num_interop_threads(int(inter_threads))
        except RuntimeError as err:
            raise RuntimeError(f"cannot use {inter_threads} inter-op threads: this process already runs "
                               f"{torch.get_num_interop_threads()} ({err})") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(version_dir / "model.pt"), map_location=device).eval()

    def predict(inputs):
        with torch.inference_mode():
            args = [torch.from_numpy(inputs[n]).to(device) for n in input_names]
            out = module(*args)
        out = [t.cpu().numpy() for t in out] if isinstance(out, (list, tuple)) else out.cpu().numpy()
        return outputs_dict(out, output_names)

    return predict
