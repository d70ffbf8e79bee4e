"""Telemetry during a run: Triton ``/metrics``, NVML (GPU) where a GPU exists, psutil (CPU) always.

See :class:`~serving_bench.telemetry.sampler.Telemetry`.
"""

from serving_bench.telemetry.sampler import Telemetry

__all__ = ["Telemetry"]
