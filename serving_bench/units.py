"""Time units: the one table of how many seconds each unit name means.

Inside the program every time is seconds as float; units appear only where people write times (load profiles,
``--timeout``, ``--slo``, forecasts) and where Triton's own fields keep theirs (``_us`` names, ``*_ns`` counters).
"""

from __future__ import annotations

SECONDS_PER = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
