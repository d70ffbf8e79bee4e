"""``scripts/wait_decomposition.py``: how it splits a request into phases on the runners' batch logs, worked by hand
(the script's measurements on the real server are quoted in docs/sim.md and ``benchmarks/results/``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from serving_bench.serve.execution_log import Executions
from serving_bench.serving_config import ModelServing, ServingConfig

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "wait_decomposition.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("wait_decomposition", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _batches(*spans):
    n = len(spans)
    return Executions(np.array([s for s, _ in spans]), np.array([e for _, e in spans]), np.zeros(n),
                      np.ones(n, np.int32), np.ones(n, np.int32), np.zeros(n, np.int32))


def test_phases_of_a_direct_request_and_of_an_ensemble_by_hand():
    """"a" sent at 1 s: its batch runs 0.3-0.5 ms after, answered at 0.7 ms: way in 0.3, execution 0.2, way out 0.2 ms.
    The ensemble "e" (members m1 and m2 in parallel, then the combiner c needing both) sent at 2 s: m1 runs 0.4-0.6 ms
    after, m2 3.0-3.4 ms (its hand-off waited), c 3.6-3.7 ms, answered at 4.0 ms: hand-offs 0.4 / 3.0 / 0.2 ms (c's
    from the later of m1 and m2), executions 0.2 / 0.4 / 0.1 ms, way out 0.3 ms. A long batch from 1.9 to 2.05 s
    holds the ensemble's phases, not a's."""
    script = _load_script()
    config = ServingConfig(tuple(ModelServing(m) for m in ("a", "m1", "m2", "c", "long")),
                           (("e", ("m1", "m2", "c")),), (("e", ((), (), (0, 1))),))
    run = SimpleNamespace(sent={"a": np.array([1.0]), "e": np.array([2.0])},
                          done={"a": np.array([1.0007]), "e": np.array([2.0040])})
    executions = {"a": _batches((1.0003, 1.0005)), "m1": _batches((2.0004, 2.0006)),
                  "m2": _batches((2.0030, 2.0034)), "c": _batches((2.0036, 2.0037)), "long": _batches((1.9, 2.05))}
    phases = script.phases(run, executions, config)
    assert [name for name, _, _ in phases["a"]] == ["way in", "execution", "way out"]
    assert [float(d[0]) for _, _, d in phases["a"]] == pytest.approx([0.0003, 0.0002, 0.0002])
    assert [name for name, _, _ in phases["e"]] == ["hand-off to m1", "m1", "hand-off to m2", "m2", "hand-off to c",
                                                    "c", "way out"]
    assert [float(d[0]) for _, _, d in phases["e"]] == pytest.approx([0.0004, 0.0002, 0.0030, 0.0004, 0.0002,
                                                                      0.0001, 0.0003])
    assert [float(t[0]) for _, t, _ in phases["e"]] == pytest.approx([2.0, 2.0004, 2.0, 2.0030, 2.0034, 2.0036,
                                                                      2.0037])
    long = executions["long"]
    assert list(long.running_at(np.array([1.0, 1.95, 2.0034, 2.06]))) == [False, True, True, False]
