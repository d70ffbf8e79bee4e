"""Trace parsing (request CSV, Azure Functions 2019), its errors, mapping, scaling and the converter."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from serving_bench.errors import InputError
from tune_fixtures import write_profile
from serving_bench.load.fields import Where
from serving_bench.load.trace_files import TraceOrderWarning, read_azure, read_request_csv
from serving_bench.load.traces import Trace, convert, map_functions, scale_counts

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT / "load_profiles" / "traces" / "azure_functions_synthetic.csv"
REQUESTS = ROOT / "load_profiles" / "traces" / "requests_sample.csv"


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_request_csv_reads_models_batches_and_shifts_to_zero(tmp_path):
    path = _write(tmp_path, "t.csv", "timestamp_s,model,batch\n10.5,a,1\n10.75,b,4\n11.0,a,2\n")
    trace = read_request_csv(path)
    np.testing.assert_allclose(trace.times_s, [0.0, 0.25, 0.5])
    assert trace.models == ("a", "b")
    assert list(trace.model) == [0, 1, 0] and list(trace.batch) == [1, 4, 2]
    no_batch = read_request_csv(_write(tmp_path, "u.csv", "model,timestamp_s\nx,1\nx,2\n"))
    assert list(no_batch.batch) == [1, 1] and no_batch.models == ("x",)


def test_committed_sample_trace_parses():
    trace = read_request_csv(REQUESTS)
    assert len(trace.times_s) > 1000 and set(trace.models) == {"sleep_python", "tiny_cnn_onnxruntime",
                                                              "tiny_mlp_torchscript"}
    azure = read_azure(AZURE)
    assert azure.counts.shape == (12, 1440) and azure.counts.min() >= 0


def test_the_order_warning_is_one_line_for_a_user(tmp_path):
    """Through the command line the warning is one line — no Python source line after it."""
    _write(tmp_path, "t.csv", "timestamp_s,model\n0.0,m\n0.5,m\n0.2,m\n1.0,m\n")
    _write(tmp_path, "l.yaml", "name: t\nduration: 2s\narrival: {process: trace, path: t.csv}\n")
    profile = write_profile(tmp_path / "p.json", {"m": (1.0, 0.0, 1)})
    done = subprocess.run([sys.executable, "-m", "serving_bench.cli", "simulate", str(tmp_path / "l.yaml"),
                           "--profile", str(profile), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"warning: {tmp_path / 't.csv'}: line 4: timestamp_s goes backwards (1 "
                                        "places); sorted the requests by time"], done.stderr


@pytest.mark.parametrize("text, where", [
    ("", "t.csv: line 1: empty file"),
    ("time,model\n1,a\n", "t.csv: line 1: header lacks 'timestamp_s'"),
    ("timestamp_s,model,prio\n1,a,2\n", "t.csv: line 1: prio: unknown column"),
    ("timestamp_s,model\n1,a\nsoon,b\n", "t.csv: line 3: timestamp_s: expected a number of seconds, got 'soon'"),
    ("timestamp_s,model\n1,a\n2,\n", "t.csv: line 3: model: expected a model name"),
    ("timestamp_s,model,batch\n1,a,1\n2,a,0\n", "t.csv: line 3: batch: expected an integer >= 1, got '0'"),
    ("timestamp_s,model\n1,a,9\n", "t.csv: line 2: expected 2 fields"),
    ("timestamp_s,model\n", "t.csv: line 2: no requests"),
])
def test_request_csv_errors_name_file_line_and_field(tmp_path, text, where):
    path = _write(tmp_path, "t.csv", text)
    with pytest.raises(InputError) as err:
        read_request_csv(path)
    assert str(path.parent) in err.value.line() and where in err.value.line()


def test_non_monotonic_timestamps_are_sorted_with_a_warning_or_rejected_when_strict(tmp_path):
    path = _write(tmp_path, "t.csv", "timestamp_s,model\n1.0,a\n3.0,b\n2.0,c\n4.0,a\n")
    with pytest.warns(TraceOrderWarning, match=r"line 4: timestamp_s goes backwards"):
        trace = read_request_csv(path)
    np.testing.assert_allclose(trace.times_s, [0, 1, 2, 3])
    assert [trace.models[k] for k in trace.model] == ["a", "c", "b", "a"]
    with pytest.raises(InputError, match=r"t.csv: line 4: timestamp_s: timestamps must not go backwards"):
        read_request_csv(path, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_request_csv(_write(tmp_path, "ok.csv", "timestamp_s,model\n1,a\n1,b\n2,a\n"))  # ties are fine


@pytest.mark.parametrize("text, where", [
    ("a,b,c\n", "line 1: expected the Azure Functions header"),
    ("HashOwner,HashApp,HashFunction,Trigger,1,3\n", "line 1: column 6: expected minute '2'"),
    ("HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,f,http,3,x\n", "line 2: minute 2: expected a count"),
    ("HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,f,http,3\n", "line 2: expected 6 fields"),
    ("HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,f,http,3,-1\n", "line 2: minute 2: expected a count"),
])
def test_azure_errors_name_file_line_and_minute(tmp_path, text, where):
    path = _write(tmp_path, "az.csv", text)
    with pytest.raises(InputError) as err:
        read_azure(path)
    assert err.value.line().startswith(str(path)) and where in err.value.line()


def test_function_mapping_round_robin_and_popularity():
    counts = np.array([[100], [50], [30], [20], [5], [1]])
    assert list(map_functions(counts, [1, 1], "round_robin")) == [0, 1, 0, 1, 0, 1]
    owner = map_functions(counts, [3, 1], "popularity")
    per_model = np.bincount(owner, weights=counts[:, 0], minlength=2)
    assert per_model[0] / per_model.sum() == pytest.approx(0.75, abs=0.1)
    assert owner[0] == 0  # the busiest function goes to the model with the largest share


def test_scaling_keeps_expected_totals_and_time_scale_compresses():
    counts = np.full((4, 1000), 3)
    scaled = scale_counts(counts, 0.37, np.random.default_rng(0))
    assert abs(scaled.sum() - counts.sum() * 0.37) < 4 * np.sqrt(counts.sum() * 0.37)
    trace = Trace.from_mapping({"process": "trace", "format": "azure", "path": str(AZURE), "time_scale": 0.01,
                                "start_minute": 61, "minutes": 30, "spread": "even"}, Where("p.yaml", "arrival"))
    assert trace.span_s() == pytest.approx(30 * 0.6)
    times, model, names, batch = trace.requests(["a", "b"], [1, 1], np.random.default_rng(0))
    raw = read_azure(AZURE).counts[:, 60:90]
    assert len(times) == raw.sum() and times.max() < 18.0 and names == ("a", "b") and batch is None
    # "even" spreading: each minute's arrivals of one model are evenly spaced inside its 0.6 s slot
    first_minute = times[(times < 0.6) & (model == 0)]
    np.testing.assert_allclose(np.diff(first_minute), 0.6 / len(first_minute), rtol=1e-9)


def test_trace_config_errors(tmp_path):
    w = Where(str(tmp_path / "p.yaml"), "arrival")
    with pytest.raises(InputError, match=r"p.yaml: arrival.path: no such trace file"):
        Trace.from_mapping({"process": "trace", "path": "missing.csv"}, w)
    with pytest.raises(InputError, match=r"arrival.mapping: expected one of round_robin, popularity"):
        Trace.from_mapping({"process": "trace", "path": str(AZURE), "format": "azure", "mapping": "zipf"}, w)
    with pytest.raises(InputError, match=r"arrival.rate_scale: expected <= 1 for a request CSV"):
        Trace.from_mapping({"process": "trace", "path": str(REQUESTS), "rate_scale": 2}, w)


def test_convert_azure_to_request_csv_round_trips(tmp_path):
    out = convert(AZURE, tmp_path / "out.csv", models=["m1", "m2", "m3"], shares=[2, 1, 1], format="azure",
                  mapping="popularity", time_scale=0.01, start_minute=1, minutes=5, seed=4)
    trace = read_request_csv(out)
    assert set(trace.models) == {"m1", "m2", "m3"} and trace.times_s.max() < 3.0
    again = convert(AZURE, tmp_path / "again.csv", models=["m1", "m2", "m3"], shares=[2, 1, 1], format="azure",
                    mapping="popularity", time_scale=0.01, start_minute=1, minutes=5, seed=4)
    assert out.read_text() == again.read_text()  # seeded


def test_converter_command(tmp_path, capsys):
    from serving_bench.load.traces import main
    assert main(["convert", str(AZURE), str(tmp_path / "c.csv"), "--models", "a,b", "--time-scale", "0.01",
                 "--minutes", "2"]) == 0
    assert read_request_csv(tmp_path / "c.csv").models
    assert main(["convert", str(tmp_path / "c.csv"), str(tmp_path / "d.csv"), "--models", "a"]) == 2
    assert "line 1: expected the Azure Functions header" in capsys.readouterr().out


def test_a_scaled_trace_is_compressed_and_tiled(tmp_path):
    """``Trace.scaled(f)`` (the ``scale`` growth rule): the trace f times as fast, laid end to end over the run, the
    last copy cut; each copy is the trace itself, shifted."""
    path = _write(tmp_path, "t.csv", "timestamp_s,model,batch\n0,a,1\n1,b,2\n2.5,a,3\n3.9,b,1\n")
    trace = Trace(path=str(path))
    times, model, names, batch = trace.scaled(2.5).requests((), (), np.random.default_rng(0), 4.0)
    span = 3.9 + 1e-9
    expected = np.concatenate([np.array([0, 1, 2.5, 3.9]) / 2.5 + k * span / 2.5 for k in range(3)])
    keep = expected < 4.0
    np.testing.assert_allclose(times, expected[keep])
    assert list(np.asarray(names)[model]) == (["a", "b", "a", "b"] * 3)[:keep.sum()]
    assert list(batch) == ([1, 2, 3, 1] * 3)[:keep.sum()]
    azure = Trace(path=str(AZURE), format="azure", minutes=10, time_scale=0.1)  # 10 minutes of 6 s
    rng = np.random.default_rng(1)
    one = azure.requests(("x", "y"), (1, 1), rng, 60.0)[0]
    three = azure.scaled(3).requests(("x", "y"), (1, 1), np.random.default_rng(1), 60.0)[0]
    assert len(three) == 3 * len(one) and three.max() < 60.0 and np.all(np.diff(three) >= 0)
    np.testing.assert_allclose(three[:len(one)], one / 3)
    assert azure.scaled(3).expected_rate(60.0) == pytest.approx(3 * azure.expected_rate(60.0))
