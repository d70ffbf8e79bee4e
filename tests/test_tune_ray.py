"""The Ray executor on a local Ray started on this machine gives the same results as the local executor."""

from __future__ import annotations

import pytest

from serving_bench.tune.run import TuneOptions, run_tune
from tune_fixtures import write_load, write_profile

ray = pytest.importorskip("ray", reason="ray is pinned in setup.cfg; install it with `make test`")


@pytest.fixture(scope="module")
def local_ray():
    """One small local Ray for the module (starting one costs ~10 s on 2 cores)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


def _strip(doc: dict) -> list:
    """The observations' content without wall-clock fields."""
    out = []
    for t in doc["top"]:
        r = {k: v for k, v in t["result"].items() if k != "eval_s"}
        out.append((t["key"], t["config"], r))
    return out


def test_ray_executor_matches_local(local_ray, tmp_path):
    profile = write_profile(tmp_path / "p.json", {"m": (4.0, 1.0, 8), "n": (2.0, 0.5, 8)})
    load = write_load(tmp_path / "load.yaml", {"m": 120, "n": 200}, {"m": 40, "n": 30}, duration_s=4.0)
    common = dict(load=str(load), profile=str(profile), instances=(1, 2), max_batch_sizes=(4, 8),
                  queue_delays_us=(0,), models=("m", "n"), verify_top=0, quiet=True, report=False, batch=4,
                  max_evals=6, replications=0)
    local = run_tune(TuneOptions(out=str(tmp_path / "local"), executor="local", **common))
    remote = run_tune(TuneOptions(out=str(tmp_path / "ray"), executor="ray", **common))
    assert local["search"]["evaluated"] == remote["search"]["evaluated"] == 6
    assert remote["search"]["executor"] == "ray"
    assert _strip(local) == _strip(remote)
    assert ray.is_initialized()  # the executor left the Ray it did not start running
