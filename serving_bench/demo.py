"""``serving-bench demo --out results/demo`` (``make demo``): the main job end to end on the embedded server.

Stages, each a call into the package that owns it (nothing here measures, simulates or searches by itself):

1. export ``tiny_cnn``, ``tiny_mlp`` and ``resnet50`` to ONNX Runtime, TorchScript and TVM, plus an ensemble
   (``serving_bench.export.api.export_models``);
2. serve them co-located on real tritonserver and replay ``load_profiles/demo.yaml`` (Poisson plus a burst) against
   single models and the ensemble, with telemetry (``TritonServer``, ``TritonTarget``, ``Telemetry``), after the
   machine settled from the export (``settle_after_export``) — once more when its sends to an entry ran late
   (:data:`LATE_LIMIT_S`);
3. profile the served models on the same server (``serving_bench.profiles``) — once more when the hypervisor took
   CPU time while it was measured and its law misses its own calibration runs (``telemetry.cpu.StealClock``);
4. simulate the same schedule (``SimTarget``) and 5. validate: simulated vs measured, each predicted figure with its
   90 % interval over replications, and their coverage (the share of measured figures inside);
6. tune on the simulator and verify the best configuration on Triton (``serving_bench.tune``);
7. write the report (``serving_bench.report``) and print its path.

Progress is printed per stage with elapsed time. A stage that fails is reported with its reason, the stages that need
it are reported as not run, and the demo exits non-zero; nothing is silently skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from serving_bench.errors import InputError, ServerError
from serving_bench.export.api import SETTLE_AFTER_EXPORT_S, export_models, settle_after_export
from serving_bench.export.frameworks import ExportOptions
from serving_bench.export.repository import load_manifest
from serving_bench.files import atomic_write_text
from serving_bench.report.cli import write_report
from serving_bench.run.metrics import simulated_inside
from serving_bench.run.results import hold_results, run_summary, write_results
from serving_bench.serve.server import TritonServer
from serving_bench.serving_config import ServingConfig
from serving_bench.telemetry import Telemetry
from serving_bench.telemetry.cpu import StealClock
from serving_bench.tune import adapters
from serving_bench.tune.recommend import interval_text
from serving_bench.tune.run import TuneOptions, run_tune

ROOT = Path(__file__).resolve().parents[1]
DEMO_PROFILE = ROOT / "load_profiles" / "demo.yaml"
EXPORT_MODELS = ("tiny_cnn", "tiny_mlp", "resnet50")
FRAMEWORKS = ("onnxruntime", "torchscript", "tvm")
ENSEMBLE = "tiny_ensemble=tiny_cnn_onnxruntime,tiny_cnn_torchscript"
# resnet50 compiled by TVM without tuning takes seconds per inference on 2 cores (DESIGN.md): exported and checked,
# but left out of the replay so the demo stays near 10 minutes. The demo profile names the replayed entries.
# resnet50 batches at most 2 rows: on 2 busy cores one batch-4 inference takes ~0.8 s, too slow to profile in seconds.
MAX_BATCH = {"tiny_cnn": 8, "tiny_mlp": 8, "resnet50": 2}


# A replay whose sends to any entry ran later than this at p99 measured a busy or stalled machine (its sender could
# not keep the schedule): the demo replays once more, as the comparison with the simulator needs the server's
# figures, not the machine's. Per entry, as the validation compares each entry's p99: a half-second stall that holds
# 0.7 % of all requests passes an overall check yet sets the p99 of every small entry (docs/accuracy.md#what-is-noise,
# "Host stalls set the demo's p99").
LATE_LIMIT_S = 1e-3


def latest_entry(summary: dict) -> tuple[str, float]:
    """The entry whose requests were sent latest at p99 in a replay's summary (``run_summary``), and that lateness
    (seconds; an entry without sends counts as 0)."""
    late = {m: s.get("lateness_p99_s") or 0.0 for m, s in summary["models"].items()}
    entry = max(late, key=late.get)
    return entry, late[entry]


def tune_line(doc: dict) -> str:
    """The tune stage's line: what the simulator predicted of the pick, then what Triton measured (the verification's
    replays), so a prediction is never reported as met on the simulator's word alone."""
    first = (doc.get("verification") or [None])[0]
    capacity = first["capacity"] if first else {"predicted_scale": 0.0}
    predicted = (f"meets its SLOs up to {capacity['predicted_scale']:.2f}x the load" if doc["satisfiable"]
                 else "misses its SLOs")
    if first is None:
        return f"on the simulator the pick {predicted}; not verified on Triton"
    held = capacity["held_at_capacity"]
    measured = f"{'met' if first['slo_met'] else 'missed'} them at 1x" + (
        "" if held is None else f" and {'held' if held else 'missed'} them at the predicted capacity")
    interval = capacity.get("interval")
    placed = "; the measured capacity is " + interval_text(interval, "the pick's") if interval else ""
    return (f"on the simulator the pick {predicted}; on Triton it {measured}"
            + ("" if capacity["agrees"] else " (the replays disagree with the prediction: see the report)") + placed)


@dataclass
class Stage:
    name: str
    status: str = "pending"  # ok | failed | not run | pending
    seconds: float = 0.0
    detail: str = ""
    steal_share: float = 0.0  # of the machine's CPU time the hypervisor took during the stage (telemetry.cpu)


class Demo:
    def __init__(self, out: Path, repo: Path, load_profile: Path, tune_evals: int, reuse_repo: bool,
                 profile_seconds: float, profile: Path | None = None):
        self.out, self.repo, self.load_profile = out, repo, load_profile
        self.tune_evals = tune_evals
        self.reuse_repo = reuse_repo
        self.profile_seconds = profile_seconds
        self.given_profile = profile
        self.t0 = time.perf_counter()
        self.stages: list[Stage] = []
        self.schedule = None
        self.profile_path: Path | None = None
        self.exported_at = -SETTLE_AFTER_EXPORT_S  # when this run last wrote the repository (perf_counter s)

    # -- plumbing --------------------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f} s] {text}", flush=True)

    def run_stage(self, number: int, total: int, name: str, fn) -> bool:
        stage = Stage(name)
        self.stages.append(stage)
        self.say(f"stage {number}/{total}: {name}")
        start = time.perf_counter()
        steal = StealClock()
        try:
            stage.detail = fn() or ""
            stage.status = "ok"
        except (InputError, ServerError) as err:
            stage.status, stage.detail = "failed", err.line() if isinstance(err, InputError) else str(err)
        except Exception as err:  # noqa: BLE001 - one stage's failure is reported; later stages may still run
            stage.status, stage.detail = "failed", f"{type(err).__name__}: {err}"
            traceback.print_exc()
        stage.seconds = time.perf_counter() - start
        stage.steal_share = steal.share()
        if steal.disturbed:  # a VM's neighbours took CPU: the stage's timings (replay, profile) are not the server's
            stage.detail += (("; " if stage.detail else "") + f"the hypervisor took {stage.steal_share:.1%} of this "
                             "machine's CPU time during it: its timings are not comparable")
        self.say(f"stage {number}/{total}: {name}: {stage.status} in {stage.seconds:.1f} s"
                 + (f" — {stage.detail}" if stage.detail else ""))
        return stage.status == "ok"

    def show_progress(self, p) -> None:
        """One line per progress tick of a replay (engineer C's ``Progress``)."""
        p99 = f", p99 {p.p99_s * 1e3:.1f} ms" if p.p99_s is not None else ""
        self.say(f"  replay {p.elapsed_s:5.1f} s: {p.finished}/{p.scheduled} done, {p.in_flight} in flight, "
                 f"{p.rate_rps:.0f} req/s{p99}, {p.failed} failed")

    # -- stages ----------------------------------------------------------------------------------------------------
    def export(self) -> str:
        wanted = [f"{m}_{f}" for m in EXPORT_MODELS for f in FRAMEWORKS] + [ENSEMBLE.split("=")[0]]
        if self.reuse_repo and self.repo.is_dir():
            entries = load_manifest(self.repo)["entries"]
            present = ServingConfig.from_repo(self.repo, [n for n in wanted if n in entries]) if all(
                n in entries for n in wanted) else None
            if present is not None and all(entries[n].get("status") == "exported" for n in wanted) and all(
                    present[f"{m}_{f}"].max_batch_size == MAX_BATCH[m] for m in EXPORT_MODELS for f in FRAMEWORKS):
                return f"reused the {len(wanted)} exported entries in {self.repo} (--reuse-repo)"
        records = []
        for batch in sorted(set(MAX_BATCH.values()), reverse=True):
            models = [m for m in EXPORT_MODELS if MAX_BATCH[m] == batch]
            records += export_models(models, list(FRAMEWORKS), self.repo, options=ExportOptions(max_batch_size=batch),
                                     overwrite=True, ensembles=[ENSEMBLE] if "tiny_cnn" in models else [],
                                     log=lambda line: self.say("  " + line))
        failed = [r for r in records if r["status"] == "failed"]
        if failed:
            raise RuntimeError("export failed for " + ", ".join(f"{r['name']} ({r['reason']})" for r in failed))
        self.exported_at = time.perf_counter()
        counts = {s: sum(r["status"] == s for r in records) for s in ("exported", "skipped")}
        return f"{counts['exported']} entries exported, {counts['skipped']} skipped, in {self.repo}"

    def replay(self) -> str:
        self.schedule = adapters.ScheduleBuilder(str(self.load_profile))()  # the profile's own seed
        out = self.out / "replay"
        self.say(f"  {len(self.schedule)} requests over {self.schedule.duration_s:.0f} s to "
                 f"{', '.join(self.schedule.models)}")
        for attempt in (1, 2):
            if attempt == 1:
                settle_after_export(self.exported_at, lambda line: self.say("  " + line))
            else:
                self.say(f"  waiting {SETTLE_AFTER_EXPORT_S:.0f} s before replaying again")
                time.sleep(SETTLE_AFTER_EXPORT_S)
            with TritonServer(self.repo, models=list(self.schedule.models)) as server:
                self.say(f"  tritonserver ready at {server.endpoints.grpc_url} serving "
                         f"{', '.join(server.served_models)}")
                with Telemetry(server.endpoints.metrics_url, interval_s=0.5) as telemetry:
                    records = adapters.replay(server, self.schedule, progress=self.show_progress)
            entry, late = latest_entry(run_summary(records))
            if late <= LATE_LIMIT_S:
                break
            self.say(f"  the replay sent {entry}'s requests {late * 1e3:.1f} ms late at p99 (over "
                     f"{LATE_LIMIT_S * 1e3:.0f} ms): something else kept this machine busy, so it measured the machine"
                     + (", not the server; replaying once more" if attempt == 1 else
                        " again: the validation below compares against a disturbed replay"))
        summary = write_results(out, records, self.schedule, telemetry=telemetry)
        return "; ".join(f"{m} p99 {s['p99_s'] * 1e3:.1f} ms" for m, s in summary["models"].items()
                         if s.get("p99_s") is not None)

    def profile(self) -> str:
        if self.given_profile is not None:
            adapters.load_profile(self.given_profile)  # checked before later stages rely on it
            self.profile_path = self.given_profile
            return f"reused {self.given_profile} (--profile)"
        self.profile_path = self.out / "profile.json"
        config = ServingConfig.from_repo(self.repo, list(self.schedule.models))
        served = list(config.names) + [e for e, _ in config.ensembles]  # an ensemble alone too, beside its members
        self.say(f"  measuring {', '.join(served)}")
        # solo runs, then the co-located calibration runs the cores' sharing law is fitted to (two instances per
        # model), no override curves: the simulator predicts co-location from the demands and the law
        for attempt in (1, 2):
            steal = StealClock()
            profile = adapters.measure_profile(self.repo, served, self.profile_path, seconds=self.profile_seconds,
                                               pairs=False, log=lambda line: self.say("  " + line))
            if not (steal.disturbed and adapters.profile_uncertain(profile)):
                break
            self.say(f"  the hypervisor took {steal.share():.1%} of this machine's CPU time while the profile was "
                     "measured and its law misses its own runs: "
                     + (f"measuring it once more after {SETTLE_AFTER_EXPORT_S:.0f} s" if attempt == 1 else
                        "again; the validation below rests on an uncertain profile"))
            if attempt == 1:
                time.sleep(SETTLE_AFTER_EXPORT_S)
        return str(self.profile_path)

    def simulate_and_validate(self) -> str:
        rows = adapters.validate(self.load_profile, self.repo, self.profile_path, self.out / "validate",
                                 replay_dir=self.out / "replay", note=lambda line: self.say(f"  note: {line}"))
        judged = [inside for inside in map(simulated_inside, rows) if inside is not None]
        return (f"{len(rows)} comparison rows in {self.out / 'validate'}; simulated inside the measured 95 % interval "
                f"in {sum(judged)} of {len(judged)} latency rows; {adapters.coverage_line(rows)}")

    def tune(self) -> str:
        config = ServingConfig.from_repo(self.repo, list(self.schedule.models))
        models = tuple(m for m in self.schedule.models if m in config.names)  # the single models the load calls
        doc = run_tune(TuneOptions(load=str(self.load_profile), profile=str(self.profile_path),
                                   out=str(self.out / "tune"), repo=str(self.repo), models=models, instances=(1, 2),
                                   max_batch_sizes=(1, 2, 4, 8), queue_delays_us=(0, 2000),
                                   max_evals=self.tune_evals, verify_top=1, report=False,
                                   restart=True))  # a new demo measured a new profile: an old search is not resumed
        return tune_line(doc)

    def report(self) -> str:
        return str(write_report(self.out, title="serving-bench demo"))

    def run(self) -> int:
        stages = [("export models (ONNX Runtime, TorchScript, TVM) and an ensemble", self.export),
                  ("serve co-located on real Triton and replay the demo profile", self.replay),
                  ("profile the served models on Triton", self.profile),
                  ("simulate the same schedule and validate against the replay", self.simulate_and_validate),
                  ("tune on the simulator, verify the best on Triton", self.tune),
                  ("write the report", self.report)]
        needs = {1: 0, 2: 1, 3: 2, 4: 2}  # stage index -> the stage it needs
        for i, (name, fn) in enumerate(stages):
            dep = needs.get(i)
            if dep is not None and self.stages[dep].status != "ok":
                self.stages.append(Stage(name, "not run", 0.0, f"needs stage {dep + 1}"))
                self.say(f"stage {i + 1}/{len(stages)}: {name}: not run (needs stage {dep + 1})")
                continue
            self.run_stage(i + 1, len(stages), name, fn)
        summary = {s.name: {"status": s.status, "seconds": round(s.seconds, 2), "detail": s.detail,
                            "steal_share": round(s.steal_share, 4)} for s in self.stages}
        atomic_write_text(self.out / "demo.json", json.dumps(summary, indent=1) + "\n")
        self.say("summary: " + ", ".join(f"{s.status}" for s in self.stages))
        report = self.out / "report.html"
        if report.is_file():
            print(f"report: {report.resolve()}")
        return 0 if all(s.status == "ok" for s in self.stages) else 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="results/demo", help="results folder (default results/demo)")
    parser.add_argument("--repo", default="model_repo", help="model repository to export into (default model_repo)")
    parser.add_argument("--load", default=str(DEMO_PROFILE), help="load profile (default load_profiles/demo.yaml)")
    parser.add_argument("--tune-evals", type=int, default=24, help="configurations the tune stage evaluates")
    parser.add_argument("--reuse-repo", action="store_true",
                        help="skip the export when the repository already holds every demo entry")
    parser.add_argument("--profile", help="use this simulator profile instead of measuring one (stage 3)")
    parser.add_argument("--profile-seconds", type=float, default=3.0,
                        help="closed-loop seconds per model and batch size in the profile stage (default 3)")


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out)
    builder = adapters.ScheduleBuilder(str(args.load))
    # held for the run, with room for its results folders: the replay, the simulation and the tune's verification
    with hold_results(out, builder.size(), builder.profile().duration_s, folders=3):
        demo = Demo(out, Path(args.repo), Path(args.load), args.tune_evals, args.reuse_repo, args.profile_seconds,
                    Path(args.profile) if args.profile else None)
        return demo.run()


if __name__ == "__main__":  # pragma: no cover
    _parser = argparse.ArgumentParser(prog="serving-bench demo")
    configure(_parser)
    sys.exit(main(_parser.parse_args()))
