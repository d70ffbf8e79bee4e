"""The peers we compare against, run for real: perf_analyzer 2.50 (``perf_analyzer``)."""
