"""Load generation: arrival processes, traces, load profiles, the Schedule, and the drivers that replay it.

``TritonTarget``, ``OpenLoop`` and ``ClosedLoop`` are imported lazily (they pull in gRPC)."""

_LAZY = {"TritonTarget": "serving_bench.load.driver", "OpenLoop": "serving_bench.load.driver",
         "ClosedLoop": "serving_bench.load.driver", "LoadProfile": "serving_bench.load.profile",
         "build_schedule": "serving_bench.load.profile", "Schedule": "serving_bench.load.schedule"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'serving_bench.load' has no attribute {name!r}")
