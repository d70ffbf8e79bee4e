"""Tuning and capacity planning on the simulator (propose/observe search), verified on real Triton.

Modules: ``slo`` (parse ``--slo``), ``space`` (the knobs as a discrete search space over ``ServingConfig``),
``generators`` (grid, optuna), ``executors`` (local, ray), ``checkpoint`` (JSON lines of observations),
``load`` (the profile's load at a scale), ``objective`` (one evaluation on ``SimTarget``), ``search`` (the loop),
``verify`` (top-K on Triton), ``cli`` (``serving-bench tune``) and ``plan`` (``serving-bench plan``).
"""
