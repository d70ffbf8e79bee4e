"""serving-bench: export, serve, replay, measure and simulate DNN inference on real Triton Inference Server.

Times inside the program are seconds as float unless a name says otherwise (``_ms``, ``_us``).
"""

__version__ = "0.1.0"
