"""The simulator: a model of Triton on shared devices, calibrated from a profile. ``SimTarget`` is the entry point."""

from serving_bench.sim.target import SimTarget

__all__ = ["SimTarget"]
