"""Profiles: the simulator's measured knowledge of hardware (schema, CSV import, measurement on Triton)."""

from serving_bench.profiles.distributions import Curve, Dist, IdleEffect
from serving_bench.profiles.schema import DeviceInfo, ModelOnDevice, ModelProfile, PairCurve, Profile

__all__ = ["Curve", "DeviceInfo", "Dist", "IdleEffect", "ModelOnDevice", "ModelProfile", "PairCurve", "Profile"]
