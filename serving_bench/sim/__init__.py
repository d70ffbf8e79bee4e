"""The simulator: a model of Triton on shared devices, calibrated from a profile. ``SimTarget`` is the entry point.

Its engine runs compiled (:mod:`serving_bench.sim.compiled`: built by the install, checked current here), or as pure
Python source with ``SERVING_BENCH_SIM_PURE=1``.
"""

from serving_bench.sim.compiled import use as _use_engine

ENGINE_BUILD = _use_engine()  # "compiled" or "pure"; before any engine module is imported

from serving_bench.sim.target import SimTarget  # noqa: E402

__all__ = ["SimTarget", "ENGINE_BUILD"]
