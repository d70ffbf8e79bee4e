"""The compiled simulator engine (:mod:`serving_bench.sim.compiled`): the compiled modules are what runs, a missing or
stale build is refused with a one-line hint, and the pure Python source (``SERVING_BENCH_SIM_PURE=1``, in a
subprocess) gives records identical to the compiled engine's on the engines' test schedules."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from serving_bench.profiles import Curve, IdleEffect, Profile
from serving_bench.run.schedule import Schedule
from serving_bench.serving_config import ModelServing, ServingConfig
from serving_bench.sim import ENGINE_BUILD, SimTarget, compiled

import test_sim as T

TESTS = Path(__file__).resolve().parent


def _h200_colocated(max_batch: int, delay_us: int, load: float, n: int, seed: int):
    """sim_speed's scenario in small: the four H200 models on one GPU, 2 instances each, Poisson at ``load``."""
    from serving_bench.profiles.importers import import_h200_eager

    models = ("resnet50_fp16", "mobilenet_v3_large_fp16", "efficientnet_b0_fp16", "bert_base_fp16")
    profile = import_h200_eager()
    config = ServingConfig(tuple(ModelServing(m, max_batch_size=max_batch, dynamic_batching=max_batch > 1,
                                              max_queue_delay_us=delay_us, instances=(("gpu0", 2),)) for m in models))
    rate = load * len(models) * sum(max_batch / profile.models[m].devices["gpu0"].batches[max_batch].median
                                    for m in models) / len(models) / 4 * 2
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    sched = Schedule(t, rng.integers(0, len(models), n), models, np.zeros(n), np.ones(n), {"duration_s": float(t[-1])})
    return SimTarget(profile, config, seed=seed).run(sched)


def _curves():
    """Measured curves overriding the law: a model alone (time-sliced) and a pair."""
    data = T.sleep_profile(device="gpu0", kind="gpu", names=("a", "b"), sizes=(1, 4),
                           colocation=[Curve(1, (1.0, 2.0), (1.0, 1.4))]).to_json()
    data["pairs"] = [{"device": "gpu0", "models": ["a", "b"], "batch": 4, "k": [1, 2, 3], "speedup": [1.0, 1.5, 1.8]}]
    profile = Profile.from_json(data, "p.json")
    config = ServingConfig(tuple(ModelServing(n, max_batch_size=4, dynamic_batching=True, max_queue_delay_us=300,
                                              instances=(("gpu0", 2),)) for n in ("a", "b")))
    return SimTarget(profile, config, seed=5).run(T.poisson(600, 3000, seed=8, models=("a", "b")))


def _hosted(mode, psi: float | None = None):
    data = T._hosted_profile(request_demand=0.8).to_json()
    if psi is not None:  # the fitted hand-off share (main's interference fit)
        data["devices"]["cpu"]["law"] = {"name": "pool", "psi": psi}
    data["models"]["sleep_python"]["dispatch"] = {"samples_s": [0.0003, 0.0008, 0.002]}
    data["models"]["sleep_python"]["overhead"] = {"samples_s": [0.0002, 0.0005, 0.003]}
    config = T.one(max_batch_size=8, dynamic_batching=True, max_queue_delay_us=400, instances=(("cpu", 2),))
    return SimTarget(Profile.from_json(data, "p.json"), config, seed=2).run(T.poisson(400, 2000, seed=11), mode)


def _mixed(seed: int, engine: str = "fast"):
    """test_sim's engine-identity schedules: queue delay, preferred sizes, timeouts, queue limits, gaps, cold starts,
    simultaneous arrivals, requests of several items, delay 0."""
    rng = np.random.default_rng(seed)
    n = 1500
    t = np.cumsum(rng.exponential(1 / rng.uniform(300, 1500), n))
    if seed % 2:
        t = np.round(t, 3)
    sched = Schedule(t, rng.integers(0, 2, n), ("a", "b"), np.zeros(n),
                     rng.integers(1, 3, n) if seed == 3 else np.ones(n), {"duration_s": float(t[-1])})
    config = T._mixed_config()
    if seed == 2:
        config = ServingConfig(tuple(m.replace(max_queue_delay_us=0, max_queue_size=0) for m in config.models))
    idle = IdleEffect((0.0005, 0.01), (0.0, 0.001), (0.001, 0.01), (0.0, 0.0005),
                      service_memory=0.125 if seed == 3 else 1.0) if seed % 2 else None
    profile = T._noisy_profile(gap=0.0003 if seed >= 2 else 0.0, idle=idle)
    return SimTarget(profile, config, seed=seed, engine=engine).run(sched)


def _ensembles_closed():
    profile = T._noisy_profile(("pre", "left", "right", "join", "b"))
    config = ServingConfig(tuple(ModelServing(n, max_batch_size=8, dynamic_batching=True, max_queue_delay_us=300)
                                 for n in ("pre", "left", "right", "join"))
                           + (ModelServing("b", max_batch_size=8, dynamic_batching=True, max_queue_size=2),),
                           (("pipe", ("pre", "left", "right", "join")),))
    target = SimTarget(profile, config, ensemble_deps={"pipe": ((), (0,), (0,), (1, 2))}, seed=3)
    return target.run(T.poisson(100, 8000, seed=9, models=("pipe", "left", "b")),
                      T._Closed({"pipe": 3, "left": 2, "b": 5}, 0.5))


CASES = {
    **{f"mixed_{seed}": (lambda seed=seed: _mixed(seed)) for seed in range(4)},
    "mixed_simpy": lambda: _mixed(1, "simpy"),
    "overload": lambda: SimTarget(T._noisy_profile(), T._mixed_config(), seed=4).run(
        T.poisson(5000, 3000, seed=12, models=("a", "b"))),
    "h200_dynamic_0.1": lambda: _h200_colocated(64, 200, 0.1, 4000, 1),
    "h200_dynamic_0.9": lambda: _h200_colocated(64, 200, 0.9, 6000, 2),
    "h200_fifo": lambda: _h200_colocated(1, 0, 0.6, 3000, 3),
    "curves": _curves,
    "hosted_open": lambda: _hosted(None),
    "hosted_closed": lambda: _hosted(T._Closed(6, 1.0)),
    "hosted_psi": lambda: _hosted(None, psi=0.4),
    "core_waits": lambda: SimTarget(T._waiting_profile(wait_p=0.6, wait_s=0.003), ServingConfig((
        ModelServing("long", max_batch_size=1), ModelServing("short", max_batch_size=1, instances=(("cpu", 2),)))),
        seed=4).run(T.poisson(300, 2000, seed=6, models=("long", "short")), T._Closed({"long": 1, "short": 3}, 1.0)),
    "quiet_waits": lambda: SimTarget(T._waiting_profile(wait_p=0.6, wait_s=0.003, wait_quiet_s=0.004,
                                                        wait_quiet_memory=0.125), ServingConfig((
        ModelServing("long", max_batch_size=1), ModelServing("short", max_batch_size=1, instances=(("cpu", 2),)))),
        seed=4).run(T.poisson(300, 2000, seed=6, models=("long", "short"))),
    "ensembles_closed": _ensembles_closed,
    "pickup": lambda: SimTarget(T._pickup_profile(), ServingConfig((
        ModelServing("a", max_batch_size=8, dynamic_batching=True, instances=(("cpu", 3),)),
        ModelServing("hog", max_batch_size=1))), seed=2).run(T.poisson(900, 3000, seed=4, models=("a", "hog"))),
    **{f"drift_{mode}": (lambda mode=mode: SimTarget(T._drifting_profile(hosted=True), T.one(
        max_batch_size=8, dynamic_batching=True, max_queue_delay_us=400, instances=(("cpu", 2),)), seed=3).run(
        T.poisson(1500, 3000, seed=7), None if mode == "open" else T._Closed(6, 1.0))) for mode in ("open", "closed")},
}


def run_cases(out: str) -> None:
    """Every case's table and run facts, pickled to ``out`` (what the pure-source subprocess runs)."""
    with open(out, "wb") as fh:
        pickle.dump({name: (records.table, records.info.to_json()) for name, records in
                     ((name, case()) for name, case in CASES.items())}, fh)


def test_the_compiled_engine_is_what_runs():
    if compiled.pure():
        pytest.skip(f"{compiled.PURE_ENV} is set: the pure Python source runs")
    names = compiled.modules()
    assert names == ["batcher", "core", "device", "fast", "heap", "machine", "serial", "state",
                     "workload"] and ENGINE_BUILD == "compiled"
    for name in names:
        module = importlib.import_module(f"{compiled.PACKAGE}.{name}")
        assert module.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), module.__file__


@pytest.mark.filterwarnings("ignore::serving_bench.sim.spec.QueuePolicyNotModelledWarning")
def test_pure_source_gives_the_compiled_records(tmp_path):
    """The same cases run by the compiled engine here and by the .py source in a subprocess: identical records."""
    if compiled.pure():
        pytest.skip(f"{compiled.PURE_ENV} is set: nothing compiled to compare with")
    out = tmp_path / "pure.pkl"
    script = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import serving_bench.sim as sim, "
              "serving_bench.sim.core as core; assert sim.ENGINE_BUILD == 'pure' and core.__file__.endswith('.py'); "
              f"import test_sim_compiled as t; t.run_cases({str(out)!r})")
    env = dict(os.environ, **{compiled.PURE_ENV: "1", "PYTHONWARNINGS": "ignore"})
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=600)
    pure = pickle.loads(out.read_bytes())
    for name, case in CASES.items():
        records = case()
        expected, info = pure[name]
        assert records.table.equals(expected), name
        assert json.dumps(records.info.to_json(), sort_keys=True, default=str) == \
            json.dumps(info, sort_keys=True, default=str), name


def _fake_build(directory: Path) -> None:
    """A copy of the engine's source with stand-in builds (empty files under the extension's name) and digests."""
    for name in compiled.modules():
        for suffix in (".py", ".pxd"):
            shutil.copy(compiled.HERE / (name + suffix), directory / (name + suffix))
        (directory / (name + importlib.machinery.EXTENSION_SUFFIXES[0])).touch()
    digests = {name: compiled.digest(directory, name) for name in compiled.modules(directory)}
    (directory / compiled.DIGESTS).write_text(json.dumps(digests))


def test_a_missing_or_stale_build_is_refused(tmp_path):
    _fake_build(tmp_path)
    compiled.check(tmp_path)
    with (tmp_path / "heap.py").open("a") as fh:
        fh.write("\n")
    with pytest.raises(ImportError, match=r"^serving_bench\.sim\.heap was compiled from other source than the heap\.py "
                                          r"and heap\.pxd beside it: rebuild it with make build"):
        compiled.check(tmp_path)
    _fake_build(tmp_path)
    (tmp_path / ("fast" + importlib.machinery.EXTENSION_SUFFIXES[0])).unlink()
    with pytest.raises(ImportError, match=r"^serving_bench\.sim\.fast is not compiled: build it with make venv .*"
                                          r"SERVING_BENCH_SIM_PURE=1"):
        compiled.check(tmp_path)
