"""The diagnostic scripts: how ``scripts/diagnostics/wait_decomposition.py`` splits a request into phases on the
runners' batch logs, what ``scripts/diagnostics/wait_by_instances.py`` expects and what
``scripts/diagnostics/load_phases.py`` reads from the kernel and the simulator, worked by hand, and their bad arguments
(their measurements on the real server are quoted in docs/notes/ and ``benchmarks/results/``)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from serving_bench.profiles.law import Law
from serving_bench.serve.execution_log import Executions
from serving_bench.serving_config import ModelServing, ServingConfig

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "diagnostics"


def _load(name: str):
    """The script ``scripts/diagnostics/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
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
    script = _load("wait_decomposition")
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


def test_wait_by_instances_expects_the_law_at_the_judged_count_by_hand():
    """``scripts/diagnostics/wait_by_instances.py``: p 0.4 at 12 instances in all and 0.1 at 6, a wait up to 4 ms (3 in
    4 of them over 1 ms), quiet time 2 ms. Two requests sent after 2 ms of quiet and one after none: at 9 instances p =
    0.25, so 2 x 0.25 x 0.75 x (1 - 1/e) = 0.237 expected waits; at 24, flat at 0.4: 0.379."""
    script = _load("wait_by_instances")
    law = Law(wait_p=0.4, wait_s=0.004, wait_quiet_s=0.002, wait_instances=12, wait_p_fewer=0.1,
              wait_instances_fewer=6)
    quiet = np.array([0.002, 0.002, 0.0])
    assert script.expected_waits(law, 9, quiet) == pytest.approx(2 * 0.25 * 0.75 * (1 - np.exp(-1)))
    assert script.expected_waits(law, 24, quiet) == pytest.approx(2 * 0.4 * 0.75 * (1 - np.exp(-1)))


@pytest.mark.parametrize("script, argv, says", [
    ("wait_by_instances", ["--repeats", "1"], "--repeats: expected 2 or more"),
    ("load_phases", ["--data", "/nonexistent/data.json"], "--data / --loads"),
    ("load_phases", ["--data", str(Path(__file__)), "--loads", "0.5"], "--data / --loads"),
    ("demo_tails", ["--replay", "/nonexistent/replay"], "--replay / --profile / --repo"),
    ("wait_length_check", ["--demo", "/nonexistent"], "/nonexistent/profile.json: a demo's profile expected"),
    ("repro_preemption_cost", ["--model", "/nonexistent/model.onnx"], "--model: /nonexistent/model.onnx is not a"),
    ("tvm_trials", ["--trials", "64,0"], "--trials / --repeats: expected positive integers"),
    ("tvm_trials", ["--trials", "many"], "--trials / --repeats: expected positive integers"),
])
def test_the_diagnostic_scripts_refuse_bad_arguments_in_one_line(script, argv, says, capsys, monkeypatch):
    monkeypatch.setenv("SERVING_BENCH_SIM_PURE", "")  # load_phases sets it for itself: restored after the test
    module = _load(script)
    monkeypatch.setattr(sys, "argv", [script, *argv])
    with pytest.raises(SystemExit) as stop:
        module.main()
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_speed_windows_lag1_autocorrelation_by_hand():
    """Alternating windows 1, 2, 1, 2: deviations -0.5, 0.5, -0.5, 0.5; three neighbour products of -0.25 over a sum
    of squares of 1: -0.75. A steady climb 1, 2, 3, 4: (0.75 - 0.25 + 0.75) / 5 = 0.25."""
    script = _load("repro_speed_windows")
    assert script.lag1(np.array([1.0, 2.0, 1.0, 2.0])) == pytest.approx(-0.75)
    assert script.lag1(np.array([1.0, 2.0, 3.0, 4.0])) == pytest.approx(0.25)


def test_load_phases_reads_each_process_time_on_a_core_from_the_kernel(tmp_path, monkeypatch):
    """A process standing for the server (sleeping) with a child that runs ``m/1/model.py`` as a stub would: the
    child is named by its model and had at least the 0.3 s it computed on a core; the sleeping parent almost none."""
    monkeypatch.setenv("SERVING_BENCH_SIM_PURE", "")  # load_phases sets it for itself: restored after the test
    script = _load("load_phases")
    runner = tmp_path / "m" / "1" / "model.py"
    runner.parent.mkdir(parents=True)
    runner.write_text("import time\nt = time.thread_time()\nwhile time.thread_time() - t < 0.3:\n    pass\n"
                      "time.sleep(30)\n")
    server = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time\n"
                               f"subprocess.Popen([sys.executable, {str(runner)!r}])\ntime.sleep(30)\n"],
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            seen = script.schedstats(server.pid)
            if seen.get("m", (0.0,))[0] >= 0.3:
                break
            time.sleep(0.1)
        assert set(seen) == {"tritonserver", "m"}
        assert seen["m"][0] >= 0.3 and seen["m"][2] >= 1
        assert seen["tritonserver"][0] < 0.3
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_load_phases_logs_the_simulated_batches_by_hand():
    """Three one-row requests 100 ms apart to the sleep model (5 + 1 ms a batch, one instance, nothing else
    measured): three batches of 6 ms that start at the sends, and 18 ms of one core (the CPU its jobs received). In
    a process of its own, where the script loads the Python engine it instruments."""
    code = (f"import sys\nsys.path[:0] = [{str(SCRIPTS)!r}, {str(Path(__file__).parent)!r}]\n"
            "import json\nimport load_phases\nimport numpy as np\nfrom test_sim import one, sleep_profile\n"
            "from serving_bench.run.schedule import Schedule\nfrom serving_bench.sim.target import SimTarget\n"
            "schedule = Schedule(np.array([0.0, 0.1, 0.2]), np.zeros(3, int), ('sleep_python',), np.zeros(3), "
            "np.ones(3), {'duration_s': 0.2})\n"
            "_, cpu_s, batches = load_phases.simulated(SimTarget(sleep_profile(), one()), schedule)\n"
            "b = batches['sleep_python']\nprint(json.dumps([b.start_s.tolist(), b.end_s.tolist(), cpu_s]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    start, end, cpu_s = json.loads(out)
    assert start == pytest.approx([0.0, 0.1, 0.2]) and end == pytest.approx([0.006, 0.106, 0.206])
    assert cpu_s == pytest.approx(0.018)


def test_a_model_load_is_stuck_when_a_model_initializing_never_loads_and_the_log_stays_quiet():
    """watch_model_loads.py's judgement on a server log: the log of 2026-12-06's hang (two models initializing,
    one loaded) once it has been quiet for the idle time, not before; a log whose loads all finished never;
    and its bad arguments are one line and exit 2."""
    watch = _load("watch_model_loads")
    hung = ('I1206 16:48:15 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: tiny_mlp_torchscript_0_0"\n'
            'I1206 16:48:15 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: tiny_cnn_torchscript_0_0"\n'
            'I1206 16:48:20 model_lifecycle.cc:839] "successfully loaded \'tiny_cnn_torchscript\'"\n')
    assert watch.stuck(hung, 61.0, 60.0) and not watch.stuck(hung, 59.0, 60.0)
    done = hung + 'I1206 16:48:21 model_lifecycle.cc:839] "successfully loaded \'tiny_mlp_torchscript\'"\n'
    assert not watch.stuck(done, 3600.0, 60.0)
    four = "".join(f'I1206 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: tiny_cnn_onnxruntime_0_{i}"\n'
                   for i in range(4))  # one model's four instances, loaded: a long quiet replay is no hang
    assert not watch.stuck(four + 'I1206 model_lifecycle.cc:839] "successfully loaded \'tiny_cnn_onnxruntime\'"\n',
                           3600.0, 60.0)
    assert not watch.stuck(four + "E1206 model_lifecycle.cc:654] \"failed to load 'tiny_cnn_onnxruntime' version 1\"\n",
                           3600.0, 60.0)
    for argv in (["--idle-s", "0"], ["--out", "/nonexistent-folder"]):
        proc = subprocess.run([sys.executable, str(SCRIPTS / "watch_model_loads.py"), *argv], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and argv[0] in proc.stderr


def test_per_request_slope_reads_its_levels_and_refuses_bad_ones():
    """per_request_slope.py: the in-flight levels as whole numbers from 2 to 32, the profile's slope lines picked
    from its log; bad arguments are one line and exit 2 (its measurement: docs/notes/capacity-fidelity.md)."""
    script = _load("per_request_slope")
    assert script.levels("8,32") == [8, 32]
    for bad in ("1", "8,64", "eight", ""):
        with pytest.raises(ValueError):
            script.levels(bad)
    log = ["m: batch 1: 10 requests", "m: per-request cost inside a batch 35 us of Triton's compute time", "x"]
    assert script.slope_lines(log) == [log[1]]
    for argv in (["--in-flight", "1,8"], ["--seconds", "0"]):
        proc = subprocess.run([sys.executable, str(SCRIPTS / "per_request_slope.py"), *argv], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and argv[0] in proc.stderr
