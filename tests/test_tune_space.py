"""Tune building blocks that need no simulator: SLO parsing, the search space, generators, the checkpoint."""

from __future__ import annotations

import json

import pytest

from serving_bench.errors import InputError
from serving_bench.serving_config import ModelServing, ServingConfig
from serving_bench.tune.checkpoint import Checkpoint
from serving_bench.tune.generators import GridGenerator, OptunaGenerator, choose_generator
from serving_bench.tune.load import Load, merge, only_models
from serving_bench.tune.slo import parse_slos
from serving_bench.tune.space import SearchSpace, knobs_for, preferred_sizes


def base3() -> ServingConfig:
    return ServingConfig(tuple(ModelServing(n, max_batch_size=32, dynamic_batching=True) for n in "abc"))


def test_parse_slos_units_and_repeats():
    assert parse_slos("a=p99:20ms,a=p50:500us,b=mean:0.1s,c=p99.9:7ms") == {
        "a": {"p99": 0.02, "p50": 0.0005}, "b": {"mean": 0.1}, "c": {"p99.9": 0.007}}


@pytest.mark.parametrize("text", ["a=p99", "a:p99:20ms", "a=p42:20ms", "a=p99:-1ms", "a=p99:20min", "a=p99:20", "", "=p99:1ms"])
def test_parse_slos_errors_are_one_line_with_the_form(text):
    with pytest.raises(InputError) as err:
        parse_slos(text)
    line = err.value.line()
    assert "\n" not in line and line.startswith("--slo") and "MODEL=STAT:VALUE" in line


def test_grid_enumerates_canonical_placements_once():
    space = SearchSpace(base3(), knobs_for("abc", instances=(1, 2), max_batch_size=(0, 8), max_queue_delay_us=(0, 100)),
                        gpus=2)
    points = list(space.grid())
    keys = [space.key(p) for p in points]
    assert len(keys) == len(set(keys)) == space.size()
    # per model: instances 2 x (mbs 0: delay normalised away: 1, mbs 8: 2 delays) = 6; placements of 3 models on <= 2
    # GPUs up to renaming: 4
    assert space.size() == 6 ** 3 * 4
    # relabelling GPUs gives the same point
    p = dict(points[-1])
    swapped = {k: (1 - v if k.endswith(".gpu") else v) for k, v in p.items()}
    assert space.key(swapped) == space.key(p)
    config = space.config(p)
    assert {d for m in config.models for d, _ in m.instances} <= {"gpu0", "gpu1"}
    assert space.gpus_used(p) == len({d for m in config.models for d, _ in m.instances})


def test_config_carries_knobs_and_preferred_rules():
    space = SearchSpace(base3(), knobs_for("a", instances=(3,), max_batch_size=(16,), max_queue_delay_us=(250,),
                                           preferred=("pow2",)))
    (p,) = list(space.grid())
    a = space.config(p)["a"]
    assert (a.instance_count, a.max_batch_size, a.max_queue_delay_us, a.dynamic_batching) == (3, 16, 250, True)
    assert a.preferred_batch_sizes == (1, 2, 4, 8, 16) == preferred_sizes("pow2", 16)
    assert space.config(p)["b"] == base3()["b"]  # untuned models keep their base serving


def test_generators_propose_each_point_once_and_skip_replayed():
    space = SearchSpace(base3(), knobs_for("ab", instances=(1, 2), max_batch_size=(1, 8), max_queue_delay_us=(0,)))
    grid = GridGenerator(space)
    first = grid.propose(3)
    grid.replay(first[0], 1.0)
    rest = []
    while batch := grid.propose(4):
        rest += batch
    seen = [space.key(p) for p in first[1:] + rest]
    assert len(seen) == len(set(seen)) == space.size() - 1
    opt = OptunaGenerator(space, seed=3)
    keys = set()
    for _ in range(6):
        for p in opt.propose(2):
            assert space.key(p) not in keys
            keys.add(space.key(p))
            opt.observe(p, float(p["a.instances"]))
    assert len(keys) <= space.size()
    assert choose_generator("auto", space).name == "grid"
    with pytest.raises(InputError):
        choose_generator("annealing", space)


def test_checkpoint_resume_ignores_a_cut_line_and_refuses_another_search(tmp_path):
    path = tmp_path / "obs.jsonl"
    ck = Checkpoint(path, {"space": 1})
    ck.start()
    ck.append("k1", {"x": 1}, {"v": 1})
    ck.append("k2", {"x": 2}, {"v": 2})
    with open(path, "a") as fh:
        fh.write('{"kind": "observation", "key": "k3", "par')  # killed mid-write
    again = Checkpoint(path, {"space": 1})
    assert [r["key"] for r in again.load()] == ["k1", "k2"]
    again.start()
    again.append("k3", {"x": 3}, {"v": 3})
    assert [r["key"] for r in again.load()] == ["k1", "k2", "k3"]
    assert all(json.loads(line) for line in path.read_text().splitlines())
    with pytest.raises(InputError, match="different search"):
        Checkpoint(path, {"space": 2}).load()


def test_load_scaling_keeps_time_span_and_multiplies_requests():
    import numpy as np

    from serving_bench.run.schedule import Schedule

    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 100, 2000))
    base = Schedule(t, rng.integers(0, 2, 2000), ("a", "b"), np.zeros(2000), np.ones(2000), {"duration_s": 100.0})
    load = Load(base, seed=1)
    for scale in (0.5, 1.0, 2.0, 3.5):
        s = load.at(scale)
        assert abs(len(s) / len(base) - scale) < 0.05
        assert s.arrival_s.min() >= 0 and s.arrival_s.max() < 100 and s.duration_s == 100.0
        assert s.equals(load.at(scale))  # deterministic
    assert only_models(base, ["b"]).models == ("b",)
    assert len(merge([only_models(base, ["a"]), only_models(base, ["b"])])) == len(base)


def test_a_fixed_schedule_scaled_is_compressed_and_tiled():
    """Growth ``scale`` of a schedule with no load profile behind it: sent s times as fast over the same duration,
    the schedule laid end to end (copy k shifted by k D / s), cut at D; the shape of its gaps is kept."""
    import numpy as np

    from serving_bench.run.schedule import Schedule

    rng = np.random.default_rng(0)
    t = np.cumsum(rng.gamma(0.25, 0.2, 3000))  # gamma gaps, cv 2, mean 0.05 s
    t = t[t < 100]
    n = len(t)
    base = Schedule(t, rng.integers(0, 2, n), ("a", "b"), rng.integers(0, 9, n), np.ones(n), {"duration_s": 100.0})
    load = Load(base, seed=1, growth="scale")
    fast = load.at(2.5)
    assert fast.duration_s == 100.0 and fast.arrival_s.max() < 100 and fast.meta["growth"] == "scale"
    np.testing.assert_allclose(fast.arrival_s[:n], t / 2.5)
    assert np.array_equal(fast.model[:n], base.model) and np.array_equal(fast.sample[n:2 * n], base.sample)
    assert len(fast) == 2 * n + int((t < 50).sum())
    gaps = np.diff(fast.arrival_s)
    assert abs(gaps.std() / gaps.mean() - np.diff(t).std() / np.diff(t).mean()) < 0.1
    assert load.at(2.5) is fast
    assert np.array_equal(Load(base, growth="superpose").at(1.0).arrival_s, load.at(1.0).arrival_s)
    with pytest.raises(ValueError, match="growth"):
        Load(base, growth="double")


def test_ensemble_members_never_batch_less_than_their_ensemble(sleep_repo, tmp_path):
    """Triton refuses an ensemble whose max_batch_size exceeds a member's: members get it as a floor."""
    import shutil

    from serving_bench.export.ensemble import EnsembleSpec, write_ensemble
    from serving_bench.export.repository import CONFIG_NAME, read_config
    from serving_bench.tune import adapters

    repo = tmp_path / "repo"
    shutil.copytree(sleep_repo, repo)
    configs = {m: read_config(repo / m / CONFIG_NAME) for m in ("sleep_python", "sleep_zero")}
    write_ensemble(repo, EnsembleSpec.parse("both=sleep_python,sleep_zero"), configs)
    base = ServingConfig.from_repo(repo, ["both"])
    floors = adapters.ensemble_batch_floors(repo, base)
    assert floors["sleep_python"] == floors["sleep_zero"] == read_config(repo / "both" / CONFIG_NAME).max_batch_size
    (knobs,) = knobs_for(["sleep_python"], max_batch_size=(1, 8, 32), base=base, floors=floors)
    assert min(knobs.max_batch_size) >= floors["sleep_python"]


def test_a_screen_samples_every_part_of_the_loads_time():
    import numpy as np

    from serving_bench.run.schedule import Schedule
    from serving_bench.tune.load import SCREEN_ABOVE, SCREEN_WINDOWS, screen, screen_fraction, screen_spans

    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 120, 12000))
    base = Schedule(t, rng.integers(0, 2, 12000), ("a", "b"), np.zeros(12000), np.ones(12000),
                    {"duration_s": 120.0})
    load = Load(base, seed=1)
    spans = screen_spans(120.0, 0.1)
    assert len(spans) == SCREEN_WINDOWS and spans[0] == pytest.approx((4.5, 5.5))
    assert spans[-1][1] == pytest.approx(115.5)
    part = screen(load, 0.1)
    s = part.base
    assert s.duration_s == pytest.approx(12.0) and 0 <= s.arrival_s.min() and s.arrival_s.max() < 12.0
    assert abs(len(s) - 1200) < 120 and part.offered_rps == load.offered_rps == 100.0
    inside = sum(((t >= a) & (t < b)).sum() for a, b in spans)
    assert len(s) == inside  # every request of every window, none else
    assert abs(len(part.at(2.0)) / len(s) - 2) < 0.1 and part.at(2.0).duration_s == pytest.approx(12.0)
    assert screen_fraction(load) == 1.0 and screen_fraction(load, 0.25) == 0.25
    big = Load(Schedule(np.linspace(0, 10, SCREEN_ABOVE + 1), np.zeros(SCREEN_ABOVE + 1), ("a",),
                        np.zeros(SCREEN_ABOVE + 1), np.ones(SCREEN_ABOVE + 1)))
    assert screen_fraction(big) < 0.3
