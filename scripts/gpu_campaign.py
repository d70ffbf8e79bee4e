"""The GPU campaign (run by ``scripts/gpu_campaign.sh``; docs/gpu.md "The GPU campaign"): on one lent GPU, in at most
``--budget-s`` seconds, measure the dataset the GPU interference model is chosen and judged on
(``benchmarks/gpu_fidelity.py``), and save it under ``<out>/<date>_<gpu>/``.

GPU plan: resnet50, bert_base (sequence length 128) and mobilenet_v3_large exported to TorchScript in fp16, and the
ensemble ``vision_ensemble`` = resnet50 + mobilenet_v3_large. Steps, most wanted first (each one's failure is recorded
with its error and the server log's tail, and the next step runs; a step that would not fit the budget is listed as
skipped):

1. export (parity checked by the exporter);
2. ``threads <mode>`` for modes eager and graphs (:mod:`gpu_threads`): the entries in threads of one process, as a
   native backend runs instances (one CUDA context, a stream each): each alone per batch size 1, 4, 16; at
   batch 1 with 2, 4 and 8 threads; every pair; GPU busy and SM activity sampled (:mod:`gpu_activity`); the graphs'
   and the compiled modules' outputs compared with eager's;
3. ``triton <mode>: ...`` for eager and CUDA graphs (:mod:`gpu_triton`; one server per mode, one instance per entry,
   the runners' execution logs on): ``solo`` — each entry alone one request at a time at batch 1 and 8 (what a
   profile measures: service, way in and way out per request) and at batch 1 with 2 in flight (the instance never
   idle); ``co-located`` — every pair, all three, the ensemble; ``open loops`` — all three together at Poisson times
   of 0.5, 0.8 and 0.9 of the rates all three reached in their closed loop; ``cold starts`` — resnet50's and
   bert_base's one-row requests at random quiet times, as ``profile`` measures them (what a start after idle time
   costs); ``k=2``, ``k=4``, ``k=8`` — every entry reloaded with k instances, each alone with 2 k in flight (last:
   the reloads are the slowest part, and no reload back is needed). The two modes' servers stay up side by side and
   take turns part by part, so a budget cut short loses the least wanted parts of both;
4. ``threads compiled``: ``torch.compile`` of each zoo module in a child process, time-boxed by what is left of the
   budget; each entry that compiled in time is run as in step 2 (batch 1 and 8, 2/4/8 threads), then the pairs.

Files (at most 8, each well under 16 MiB; what a device run's ``$OUT`` carries back): ``dataset.json`` (the plan,
machine, steps, every run's figures), ``raw.npz`` (per run and entry the raw latencies and, for Triton runs, every
request's times and executed batch), ``dataset.md`` (the tables), ``campaign.log`` (what was printed). Each is
rewritten after every step, so a campaign cut short keeps what it measured (``complete`` false).

CPU plan (``--cpu``, or no GPU): the same steps with tiny_cnn and tiny_mlp on TorchScript and tiny_cnn on ONNX
Runtime (ensemble tiny_cnn TorchScript + ONNX Runtime), fp32 on KIND_CPU instances, short windows, k = 2 only and
for the ONNX Runtime entry alone (its stubs load fastest), no CUDA graphs, and ``torch.compile`` with dynamo's ``eager`` backend for tiny_cnn alone (inductor's compile takes over
a minute there), cold starts of tiny_cnn alone: it checks the campaign end to end on a machine without a GPU; its
figures say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_campaign_steps as steps  # noqa: E402
from gpu_check import machine_facts, server_log_tail  # noqa: E402

FORMAT = "serving-bench gpu campaign 1"


@dataclass(frozen=True)
class Plan:
    """What to measure. Times in seconds."""

    mode: str
    entries: tuple[tuple[str, str], ...]  # (zoo model, framework)
    precision: str
    ensemble: tuple[str, tuple[str, ...]]  # (name, member entries)
    modes: tuple[str, ...]  # eager, graphs: the thread and Triton runs of each
    max_batch_size: int
    thread_sizes: tuple[int, ...]
    thread_ks: tuple[int, ...]
    thread_warmup_s: float
    thread_window_s: float
    triton_sizes: tuple[int, ...]  # the one-at-a-time solo runs' batch sizes
    triton_ks: tuple[int, ...]
    triton_warmup_s: float
    triton_window_s: float
    open_s: float
    loads: tuple[float, ...]
    compiled: tuple[str, ...]  # the zoo models compiled, in order
    compiled_sizes: tuple[int, ...]
    compile_backend: str
    cold_entries: int = 3  # the entries whose cold starts are measured (the first ones)
    swept: tuple[str, ...] = ()  # the entries reloaded at k instances (empty: every entry)
    seq_len: int = 128
    server_estimate_s: float = 15.0  # a server's start (or a reload), to decide what fits the budget
    run_overhead_s: float = 0.8  # what a run costs beyond its window (senders, statistics, writing)


PLANS = {
    "gpu": Plan("gpu", (("resnet50", "torchscript"), ("bert_base", "torchscript"),
                        ("mobilenet_v3_large", "torchscript")), "fp16",
                ("vision_ensemble", ("resnet50_torchscript", "mobilenet_v3_large_torchscript")), ("eager", "graphs"),
                16, (1, 4, 16), (2, 4, 8), 0.2, 0.6, (1, 8), (2, 4, 8), 0.3, 1.6, 2.5, (0.5, 0.8, 0.9),
                ("resnet50", "mobilenet_v3_large", "bert_base"), (1, 8), "inductor", cold_entries=2,
                server_estimate_s=25.0),
    "cpu": Plan("cpu", (("tiny_cnn", "torchscript"), ("tiny_mlp", "torchscript"), ("tiny_cnn", "onnxruntime")),
                "fp32", ("tiny_ensemble", ("tiny_cnn_torchscript", "tiny_cnn_onnxruntime")), ("eager",),
                8, (1, 4), (2,), 0.05, 0.2, (1, 4), (2,), 0.1, 0.4, 0.6, (0.5, 0.8, 0.9), ("tiny_cnn",), (1,),
                "eager", cold_entries=1, swept=("tiny_cnn_onnxruntime",), server_estimate_s=8.0, run_overhead_s=1.0),
}


class Campaign:
    """The dataset under way: runs, raw arrays, steps; written whole to ``folder`` after every step."""

    def __init__(self, plan: Plan, folder: Path, facts: dict, command: str, budget_s: float):
        self.plan, self.folder, self.facts, self.command, self.budget_s = plan, folder, facts, command, budget_s
        self.started = time.perf_counter()
        self.runs: list[dict] = []
        self.raw: dict[str, np.ndarray] = {}
        self.steps: list[dict] = []
        self.entries: dict[str, dict] = {}
        self.serving: dict = {}  # how each entry is served (ModelServing as a dict), the ensembles and their steps
        self.notes: list[str] = []
        folder.mkdir(parents=True, exist_ok=True)
        self.log_file = open(folder / "campaign.log", "a", buffering=1)

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log_file.write(line + "\n")

    def left_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.started)

    def record(self, run: dict, raw: dict) -> None:
        """Keep a run (its raw arrays under ``r<index>/``)."""
        index = len(self.runs)
        run = {"index": index, **run}
        self.runs.append(run)
        for key, values in raw.items():
            self.raw[f"r{index}/{key}"] = np.asarray(values)

    def step(self, name: str, body: Callable[[], None], estimate_s: float) -> bool:
        """Run ``body`` unless it would not fit what is left of the budget; a failure is recorded and the campaign
        goes on. True where it ran to its end."""
        left = self.left_s()
        if left < estimate_s:
            self.steps.append({"step": name, "status": "skipped",
                               "reason": f"time budget: {left:.0f} s left of {self.budget_s:.0f} s, "
                                         f"the step needs about {estimate_s:.0f} s"})
            self.say(f"skipped {name}: time budget ({left:.0f} s left, about {estimate_s:.0f} s needed)")
            self.save()
            return False
        self.say(f"{name} ({left:.0f} s left)")
        began = time.perf_counter()
        entry: dict = {"step": name, "status": "done"}
        try:
            body()
        except Exception as err:  # noqa: BLE001 - recorded, and the campaign goes on with the next step
            entry.update(status="failed", error=f"{type(err).__name__}: {err}", server_log_tail=server_log_tail(err))
            self.say(f"  FAILED {name}: {type(err).__name__}: {err}")
        entry["seconds"] = round(time.perf_counter() - began, 1)
        self.steps.append(entry)
        self.save()
        return entry["status"] == "done"

    def result(self, complete: bool) -> dict:
        return {"format": FORMAT, "date": self.facts["date"], "machine": self.facts, "command": self.command,
                "plan": dataclasses.asdict(self.plan), "budget_s": self.budget_s, "entries": self.entries,
                "serving": self.serving,
                "steps": self.steps, "runs": self.runs, "notes": self.notes, "complete": complete,
                "elapsed_s": round(time.perf_counter() - self.started, 1)}

    def save(self, complete: bool = False) -> None:
        """``dataset.json``, ``raw.npz`` and ``dataset.md``, each replaced whole."""
        result = self.result(complete)
        _replace(self.folder / "dataset.json", lambda p: p.write_text(json.dumps(result, indent=1, sort_keys=True)))
        _replace(self.folder / "raw.npz", lambda p: np.savez_compressed(p, **self.raw))
        _replace(self.folder / "dataset.md", lambda p: p.write_text(steps.markdown(result)))


def _replace(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    write(tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU plan (tiny models, KIND_CPU instances)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu"),
                        help="the dataset goes to OUT/<date>_<machine>/")
    parser.add_argument("--budget-s", type=float, default=400.0, help="start no step that would end after this")
    args = parser.parse_args(argv)

    import torch  # heavy: ~1 s to import

    gpu = torch.cuda.is_available() and not args.cpu
    plan = PLANS["gpu" if gpu else "cpu"]
    if not gpu and not args.cpu:
        print("no CUDA GPU visible to torch: running the CPU plan (no GPU figures)", flush=True)
    facts = {"date": datetime.date.today().isoformat(), **machine_facts(gpu)}
    folder = Path(args.out) / f"{facts['date']}_{facts['machine']}"
    command = " ".join(["scripts/gpu_campaign.sh", *(argv if argv is not None else sys.argv[1:])])
    campaign = Campaign(plan, folder, facts, command, args.budget_s)
    campaign.say(f"gpu_campaign: {plan.mode} plan on {facts.get('gpu') or facts['cpu']} into {folder}")
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-campaign-") as tmp:
            steps.run_all(campaign, Path(tmp), "cuda:0" if gpu else "cpu")
    except KeyboardInterrupt:  # the shell's hard stop (or Ctrl-C): keep what was measured, marked incomplete
        campaign.say("interrupted: the dataset keeps the runs so far (complete: false)")
        campaign.save()
        return 130
    campaign.save(complete=True)
    done = [s for s in campaign.steps if s["status"] == "done"]
    campaign.say(f"wrote {folder} ({len(campaign.runs)} runs; steps: {len(done)} done, "
                 f"{sum(s['status'] == 'failed' for s in campaign.steps)} failed, "
                 f"{sum(s['status'] == 'skipped' for s in campaign.steps)} skipped; "
                 f"{time.perf_counter() - campaign.started:.0f} s)")
    return 1 if any(s["status"] == "failed" for s in campaign.steps) else 0


if __name__ == "__main__":
    sys.exit(main())
