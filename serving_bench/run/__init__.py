"""The spine of serving-bench: Schedule -> Target -> Records -> Summary, one typed path for both targets.

* :mod:`~serving_bench.run.schedule` — :class:`Schedule`, every request of a run decided up front (plain data);
* :mod:`~serving_bench.run.target` — the :class:`Target` protocol (``run(schedule, mode) -> Records``) and the load
  modes :class:`OpenLoop` / :class:`ClosedLoop`; implemented by ``load.driver.TritonTarget`` (real Triton) and
  ``sim.target.SimTarget`` (the simulator);
* :mod:`~serving_bench.run.records` — :class:`Records`: the per-request table and the run's facts (:class:`RunInfo`)
  side by side, saved together;
* :mod:`~serving_bench.run.metrics` — Records -> Summary, one function for both targets;
* :mod:`~serving_bench.run.results` — the one results folder writer (``replay``, ``simulate``, ``validate``).

Nothing here imports the stages around it (load, serve, sim, profiles, tune): they import the spine.
"""
