"""Profiles: the simulator's measured knowledge of hardware (schema, entries, sharing laws, distributions, CSV
import). Measuring one on Triton is :mod:`serving_bench.calibrate`."""

from serving_bench.profiles.distributions import Curve, Dist, IdleEffect
from serving_bench.profiles.entries import ModelOnDevice, ModelProfile
from serving_bench.profiles.law import Law
from serving_bench.profiles.schema import DeviceInfo, PairCurve, Profile

__all__ = ["Curve", "DeviceInfo", "Dist", "IdleEffect", "Law", "ModelOnDevice", "ModelProfile", "PairCurve", "Profile"]
