"""``tune --variants``, ``--memory-gb`` and ``--objective energy`` on the real simulator (constructed profiles whose
figures have closed forms), the space pruned before the search, the budget and the estimate, the report's comparison,
and one verification of chosen variants on real Triton.

Service of an executed batch of ``b`` rows: ``base_ms + per_item_ms * b`` (tune_fixtures)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from serving_bench.cli import main as cli_main
from serving_bench.errors import InputError
from serving_bench.profiles.schema import Profile
from serving_bench.sim.profile_config import config_from_profile
from serving_bench.tune.run import TuneOptions, run_tune
from serving_bench.tune.space import ModelKnobs
from serving_bench.tune.prune import fillable
from serving_bench.tune.variants import config_memory
from tune_fixtures import profile_json, write_load

MB = 1_000_000
CPU_S = {"measure": "cpu_seconds_proxy", "per_request": {"1": 0.002, "8": 0.008}, "cpu_s": {"1": 0.002, "8": 0.008}}


def variant_profile(path, variants: dict, memory: dict | None = None, energy: dict | None = None):
    """A profile of variant entries ``<zoo>_<framework>``: ``variants`` entry -> (base_ms, per_item_ms); each with a
    memory (RSS, USS) in MB (default 300, 100) and an energy table (default :data:`CPU_S`)."""
    data = profile_json({e: (base, per, 8) for e, (base, per) in variants.items()})
    for entry, mp in data["models"].items():
        zoo, framework = entry.split("_", 1)
        rss, uss = (memory or {}).get(entry, (300, 100))
        mp.update(model=zoo, variant=framework, framework=framework)
        mp["devices"]["cpu"].update(memory_bytes=rss * MB, memory_unique_bytes=uss * MB,
                                    energy=(energy or {}).get(entry, CPU_S))
    path.write_text(json.dumps(data))
    return path


def opts(tmp_path, profile, load, **kw) -> TuneOptions:
    base = dict(load=str(load), profile=str(profile), out=str(tmp_path / "out"), verify_top=0, quiet=True,
                report=False, replications=0, instances=(1, 2), max_batch_sizes=(1, 8), queue_delays_us=(0,),
                variants="auto")
    base.update(kw)
    return TuneOptions(**base)


@pytest.fixture
def crossed(tmp_path):
    """a: ONNX Runtime 2 ms + 1 ms/item, TorchScript 6 + 2; b: the other way round. The slower of each is smaller
    (60 MB less per instance), so neither dominates: the search decides."""
    profile = variant_profile(tmp_path / "p.json", {"a_onnxruntime": (2, 1), "a_torchscript": (6, 2),
                                                   "b_onnxruntime": (6, 2), "b_torchscript": (2, 1)},
                              memory={"a_torchscript": (240, 40), "b_onnxruntime": (240, 40)})
    load = write_load(tmp_path / "l.yaml", {"a_onnxruntime": 100, "b_onnxruntime": 100},
                      {"a_onnxruntime": 30, "b_onnxruntime": 30})
    return profile, load


def test_a_profile_records_each_variant_with_its_memory_and_energy(tmp_path, crossed):
    """The new fields round-trip; k instances are predicted to hold k * USS + (RSS - USS)."""
    profile = Profile.load(crossed[0])
    md = profile.models["a_torchscript"].devices["cpu"]
    assert (profile.models["a_torchscript"].model, profile.models["a_torchscript"].variant) == ("a", "torchscript")
    assert md.memory_for(1) == 240 * MB and md.memory_for(3) == 3 * 40 * MB + 200 * MB
    assert md.energy.unit == "CPU-s" and md.energy.at(4) == pytest.approx(0.002 + 3 / 7 * 0.006)
    profile.save(tmp_path / "again.json")
    assert Profile.load(tmp_path / "again.json").to_json() == profile.to_json()
    data = json.loads(crossed[0].read_text())
    data["models"]["a_torchscript"]["devices"]["cpu"]["energy"]["per_request"] = {}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(Exception, match="energy.per_request"):
        Profile.load(tmp_path / "bad.json")


def test_memory_is_read_at_the_configurations_max_batch_size(tmp_path, crossed):
    """An instance's memory after batches of up to b rows (memory_by_batch): a configuration's max_batch_size takes
    the reading of the smallest measured size at or above it (the largest when none is)."""
    data = json.loads(crossed[0].read_text())
    cpu = data["models"]["a_onnxruntime"]["devices"]["cpu"]
    cpu["memory_by_batch"] = {"1": [200 * MB, 60 * MB], "8": [300 * MB, 100 * MB]}
    (tmp_path / "b.json").write_text(json.dumps(data))
    profile = Profile.load(tmp_path / "b.json")
    md = profile.models["a_onnxruntime"].devices["cpu"]
    assert md.memory_at(1) == (200 * MB, 60 * MB) and md.memory_at(4) == md.memory_at(32) == (300 * MB, 100 * MB)
    assert md.memory_for(2, 1) == 2 * 60 * MB + 140 * MB and md.memory_for(2) == 2 * 100 * MB + 200 * MB
    profile.save(tmp_path / "again.json")
    assert Profile.load(tmp_path / "again.json").to_json() == profile.to_json()
    config = config_from_profile(profile, ["a_onnxruntime"])
    served = config.with_model(config["a_onnxruntime"].replace(max_batch_size=1, instances=(("cpu", 3),)))
    assert config_memory(profile, served)[0] == {"cpu": 3 * 60 * MB + 140 * MB}
    cpu["memory_by_batch"] = {"1": [200 * MB]}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="memory_by_batch.1"):
        Profile.load(tmp_path / "bad.json")


def test_the_tuner_picks_different_frameworks_for_two_models_when_their_profiles_say_so(tmp_path, crossed):
    doc = run_tune(opts(tmp_path, *crossed))
    assert doc["satisfiable"]
    picked = {slot: block["pick"] for slot, block in doc["variants"].items()}
    assert picked == {"a_onnxruntime": "a_onnxruntime", "b_onnxruntime": "b_torchscript"}
    assert doc["best"]["params"]["b_onnxruntime.variant"] == "b_torchscript"
    assert doc["search"]["space"]["knobs"]["a_onnxruntime"]["variant"] == ["a_onnxruntime", "a_torchscript"]
    text = "\n".join(doc["recommendation"])
    assert "b_onnxruntime as b_torchscript:" in doc["recommendation"][0]
    assert "Variant of b_onnxruntime: b_torchscript (torchscript)" in text and "Runners-up — b_onnxruntime:" in text
    # the pick is a different framework per model, and the runner-up carried less
    rows = {c["entry"]: c for c in doc["variants"]["b_onnxruntime"]["candidates"]}
    assert rows["b_torchscript"]["picked"] and not rows["b_onnxruntime"]["picked"]
    assert rows["b_torchscript"]["batches"][7]["latency_s"] == pytest.approx(0.010)
    instances = sum(c["instances"] for c in doc["best"]["config"].values())
    assert doc["best"]["result"]["memory_bytes"]["cpu"] == instances * 100 * MB + 2 * 200 * MB  # 2 frameworks' libs


def test_the_picks_capacity_interval_is_searched_on_its_chosen_variants(tmp_path, crossed):
    """The replications behind the pick's interval simulate the variants it serves with, not the slots' own
    entries (b's own ONNX Runtime entry is three times slower than the TorchScript one it is served by)."""
    doc = run_tune(opts(tmp_path, *crossed, replications=4))
    result = doc["best"]["result"]
    assert doc["variants"]["b_onnxruntime"]["pick"] == "b_torchscript"
    assert result["capacity_interval"]["high_scale"] >= 0.8 * result["capacity_scale"]


def test_the_report_shows_each_models_variants_with_the_pick_marked(tmp_path, crossed):
    """The study's comparison: per model, variant x batch size -> latency, throughput, memory, energy (here the
    CPU-seconds proxy, named as one), the pick's row marked at its batch size; from ``serving-bench report`` too."""
    doc = run_tune(opts(tmp_path, *crossed))
    assert cli_main(["report", str(tmp_path / "out")]) == 0
    html = (tmp_path / "out" / "report.html").read_text()
    section = html[html.index('<section id="variants">'):]
    section = section[:section.index("</section>")]
    assert "b_onnxruntime (on cpu; pick: b_torchscript)" in section
    assert "memory per instance (MB)" in section and "cpu_seconds_proxy — not energy" in section
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", section)]
    rows = [r for r in rows if r]
    assert len(rows) == 4 * 8  # two models x two variants x batch sizes 1..8
    picks = [r for r in rows if r[-1].startswith("◀ pick")]
    best = doc["best"]["params"]
    assert sorted(r[0] for r in picks) == ["a_onnxruntime", "b_torchscript"]
    for entry, _, _, batch, latency, _, throughput, memory, energy, mark in picks:
        slot = entry.replace("torchscript", "onnxruntime")
        assert int(batch) == best[f"{slot}.max_batch_size"]
        assert float(latency) == pytest.approx(2 + int(batch))  # 2 ms + 1 ms an item
        assert float(throughput) == pytest.approx(int(batch) / (2 + int(batch)) * 1e3, abs=0.1)
        assert memory == "300" and energy.endswith("CPU-s")
        instances = best[f"{slot}.instances"]
        assert mark == f"◀ pick ({instances} instance{'s' if instances > 1 else ''})"
    assert sum(r[-1] == "picked variant" for r in rows) == 2 * 7
    slow = next(r for r in rows if r[0] == "b_onnxruntime" and r[3] == "8")
    assert (slow[4], slow[7], slow[-1]) == ("22.00", "240", "")


def test_without_variants_each_model_keeps_its_entry(tmp_path, crossed):
    doc = run_tune(opts(tmp_path, *crossed, variants=None))
    assert doc["variants"] is None and "variant" not in doc["search"]["space"]["knobs"]["b_onnxruntime"]
    assert " as " not in doc["recommendation"][0]


def test_a_listed_variant_not_in_the_profile_is_named_and_none_measured_is_refused(tmp_path, crossed, capsys):
    load, profile = str(crossed[1]), str(crossed[0])
    argv = ["tune", load, "--profile", profile, "--instances", "1", "--max-batch-sizes", "1,8", "--queue-delays-us",
            "0", "--verify-top", "0", "--replications", "0"]
    assert cli_main([*argv, "--variants", "torchscript,tvm:trials=64", "--out", str(tmp_path / "o1")]) == 0
    out = capsys.readouterr().out
    assert "a_onnxruntime: variant tvm:trials=64 (a_tvm_trials-64) is not in the profile: tune chooses only among " \
           "measured variants" in out
    doc = json.loads((tmp_path / "o1" / "tune.json").read_text())
    assert doc["best"]["params"].get("a_onnxruntime.variant") is None  # one candidate each: no choice to make
    assert "a_onnxruntime as a_torchscript" in doc["recommendation"][0]
    assert cli_main([*argv, "--variants", "tvm", "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--variants" in err[0] and "no variant of a" in err[0]
    assert not (tmp_path / "o2" / "tune.json").exists()


def test_the_memory_budget_drops_instance_counts_and_picks_one_framework_when_two_do_not_fit(tmp_path, crossed,
                                                                                            capsys):
    """Per instance 100 MB of its own (40 for the smaller variants) and 200 MB of libraries per framework once.
    At 0.5 GB two instances of a model never fit beside the other model (2 x 40 + 200 + 240 > 500), and the fastest
    pair (a on ONNX Runtime, b on TorchScript: 100 + 100 + 2 x 200 = 600 MB) does not either: the pick serves both
    on one framework (340 MB). At 0.3 GB nothing fits, and the recommendation says so."""
    doc = run_tune(opts(tmp_path, *crossed, memory_gb=0.5, quiet=False))
    assert doc["memory_budget_bytes"] == {"cpu": 500 * MB}
    assert doc["search"]["space"]["knobs"]["a_onnxruntime"]["instances"] == [1]
    assert "a_onnxruntime: instance counts 2 dropped: predicted over the memory budget of cpu" in capsys.readouterr().out
    assert doc["best"]["result"]["memory_bytes"]["cpu"] == 340 * MB
    picked = {block["pick"].split("_", 1)[1] for block in doc["variants"].values()}
    assert len(picked) == 1
    tight = run_tune(opts(tmp_path, *crossed, memory_gb=0.3, out=str(tmp_path / "tight")))
    assert not tight["satisfiable"] and tight["best"]["result"]["memory_exceeded"]
    assert "No configuration searched fits the memory budget" in tight["recommendation"][0]


def test_the_energy_objective_trades_capacity_for_energy(tmp_path):
    """m's TorchScript is faster but costs twice the CPU per request: throughput picks it, energy the other."""
    double = {"measure": "cpu_seconds_proxy", "per_request": {"1": 0.004, "8": 0.016}}
    profile = variant_profile(tmp_path / "p.json", {"m_onnxruntime": (4, 1), "m_torchscript": (2, 1)},
                              energy={"m_torchscript": double})
    load = write_load(tmp_path / "l.yaml", {"m_onnxruntime": 200}, {"m_onnxruntime": 40})
    fast = run_tune(opts(tmp_path, profile, load, out=str(tmp_path / "t")))
    lean = run_tune(opts(tmp_path, profile, load, objective="energy", out=str(tmp_path / "e")))
    assert fast["variants"]["m_onnxruntime"]["pick"] == "m_torchscript"
    assert lean["variants"]["m_onnxruntime"]["pick"] == "m_onnxruntime"
    assert lean["best"]["result"]["energy"]["per_request"] < fast["best"]["result"]["energy"]["per_request"]
    assert "CPU-s a request at the load (cpu_seconds_proxy)" in "\n".join(lean["recommendation"])


def test_energy_without_energy_in_the_profile_is_one_line(tmp_path, capsys):
    (tmp_path / "p.json").write_text(json.dumps(profile_json({"m": (4, 1, 8)})))
    load = write_load(tmp_path / "l.yaml", {"m": 50}, {"m": 40})
    assert cli_main(["tune", str(load), "--profile", str(tmp_path / "p.json"), "--objective", "energy",
                     "--verify-top", "0", "--out", str(tmp_path / "o")]) == 2
    assert "--objective: energy: the profile has no energy" in capsys.readouterr().err


def test_dominated_variants_and_unfillable_batch_sizes_are_pruned_and_the_time_estimated(tmp_path, capsys):
    """a's TorchScript is slower at every size, no smaller and no cheaper: dropped before the search. At 1.5 req/s
    (24 at the top of the search) 0.8 requests arrive in a batch of 32's time, a burst hardly more than 5: a batch
    of 32 never fills, max_batch_size 32 is dropped, 8 kept."""
    profile = variant_profile(tmp_path / "p.json", {"a_onnxruntime": (2, 1), "a_torchscript": (6, 2)})
    data = json.loads(profile.read_text())
    for mp in data["models"].values():
        mp["devices"]["cpu"]["batches"].update({str(b): {"constant_s": (2 + b) / 1e3} for b in range(9, 33)})
    profile.write_text(json.dumps(data))
    load = write_load(tmp_path / "l.yaml", {"a_onnxruntime": 2}, {"a_onnxruntime": 100})
    doc = run_tune(opts(tmp_path, profile, load, max_batch_sizes=(1, 8, 32), quiet=False))
    out = capsys.readouterr().out
    assert "variant a_torchscript dropped: dominated by a_onnxruntime" in out
    assert "max_batch_size 32 dropped" in out
    knobs = doc["search"]["space"]["knobs"]["a_onnxruntime"]
    assert knobs["max_batch_size"] == [1, 8] and "variant" not in knobs
    assert doc["search"]["budget_s"] == 180.0 and "dominated" in " ".join(doc["search"]["pruned"])
    assert "estimate: one configuration took" in out and "the budget of 3 min (--budget-minutes) covers" in out
    assert [c["searched"] for c in doc["variants"]["a_onnxruntime"]["candidates"]] == [True, False]


def test_batch_sizes_worth_searching_follow_the_arrivals_in_one_batchs_time():
    knob = ModelKnobs("a", max_batch_size=(1, 4, 8, 32), max_queue_delay_us=(0, 2000))
    profile = Profile.from_json(profile_json({"a": (10, 0, 32)}))  # 10 ms a batch, whatever its size
    assert fillable(knob, profile, ["a"], "cpu", 30.0) == (1, 4)  # 30 rows/s * 12 ms = 0.36 rows, a burst 3.8
    assert fillable(knob, profile, ["a"], "cpu", 300.0) == (1, 4, 8, 32)  # 3.6 rows, a burst 12.2
    assert fillable(knob, profile, ["a"], "cpu", 3000.0) == (1, 4, 8, 32)  # 36 rows
    assert fillable(ModelKnobs("a", max_batch_size=(0,)), profile, ["a"], "cpu", 3000.0) == (0,)


@pytest.mark.server
def test_chosen_variants_are_served_from_the_tuned_repository_on_triton(tmp_path, tiny_repo):
    """tiny_cnn's requests (named tiny_cnn_onnxruntime in the load) go to tiny_cnn_torchscript where the profile
    says it is the faster: the tuned repository holds it and not the unchosen entry, and the verification's
    figures come back under the load's name."""
    repo, _ = tiny_repo
    profile = variant_profile(tmp_path / "p.json", {"tiny_cnn_onnxruntime": (3, 1), "tiny_cnn_torchscript": (1, 0.5)})
    data = json.loads(profile.read_text())
    for mp in data["models"].values():
        mp["model"], mp["variant"] = "tiny_cnn", mp["variant"].split("_", 1)[1]
        mp["devices"]["cpu"]["batches"] = {k: v for k, v in mp["devices"]["cpu"]["batches"].items() if int(k) <= 4}
    profile.write_text(json.dumps(data))
    load = write_load(tmp_path / "l.yaml", {"tiny_cnn_onnxruntime": 20}, {"tiny_cnn_onnxruntime": 500},
                      duration_s=3.0)
    doc = run_tune(opts(tmp_path, profile, load, repo=str(repo), models=("tiny_cnn_onnxruntime",), verify_top=1,
                        max_batch_sizes=(1, 4), max_scale=2.0))
    assert doc["variants"]["tiny_cnn_onnxruntime"]["pick"] == "tiny_cnn_torchscript"
    tuned = tmp_path / "out" / "tuned_repo"
    assert (tuned / "tiny_cnn_torchscript" / "config.pbtxt").is_file()
    assert not (tuned / "tiny_cnn_onnxruntime").exists()
    check = doc["verification"][0]
    assert check["slo_met"] and check["measured"]["tiny_cnn_onnxruntime"]["throughput_rps"] > 0
    replayed = json.loads((Path(check["replays"][0]["folder"]) / "summary.json").read_text())
    assert list(replayed["models"]) == ["tiny_cnn_torchscript"]
