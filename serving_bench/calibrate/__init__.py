"""Calibration: measuring a profile on real Triton (sessions on the server, the estimators that turn runs into
profile figures, the ``profile`` command) and fitting the devices' sharing law to co-located runs through the
simulator. What a profile *is* lives in :mod:`serving_bench.profiles`."""
