"""Load generation: arrival processes, traces and load profiles that build a Schedule (``profile.py``), and the real
target that replays it against Triton (``driver.py``: ``TritonTarget``; ``sender.py``; ``payloads.py``), MLPerf-style
scenarios (``scenarios.py``) and the ``replay`` command (``cli.py``). Import the modules themselves."""
