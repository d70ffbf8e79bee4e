"""Every GPU check in one go (run by ``scripts/gpu_check.sh``): the co-location effect of N instances of one model on
one device, and one heterogeneous pair, measured on the real tritonserver with closed-loop load at batch 1.

GPU plan (default where torch sees a CUDA device): resnet50 and bert_base exported to TorchScript in fp16, served by
the torch CUDA runner on KIND_GPU instances. Runs:

1. one server with both models, one instance each: resnet50 alone, bert_base alone, then both at once (the pair);
2. one server per instance count N in 2, 4, 8 (N = 1 is run 1): resnet50 alone;
3. CUDA graphs (batch size 1 captured) at N = 1 and 8: resnet50 alone.

Each run keeps ``2 N`` requests in flight per model (every instance busy with one more queued), for ``duration_s``
after a warm-up. Dynamic batching is switched off so every executed batch is the request's batch 1: the figures are
the instances' co-location, not batching. Telemetry (NVML utilisation, memory, power; CPU) is sampled during each run.

CPU plan (``--cpu``, or no GPU): the same steps with tiny_cnn and tiny_mlp in fp32 on KIND_CPU instances, instance
counts 1 and 2, no CUDA graphs: it checks the script end to end on a machine without a GPU; its figures say nothing
about a GPU.

Writes ``gpu_check_<date>_<machine>.json`` and ``.md`` into ``--out`` (default ``benchmarks/results``). Steps that
would not fit in ``--budget-s`` are listed as skipped with that reason rather than run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Plan:
    """What to measure. Times in seconds."""

    mode: str
    pair: tuple[str, str]  # (swept model, partner)
    precision: str
    sweep: tuple[int, ...]
    graphs_at: tuple[int, ...]
    duration_s: float
    warmup_s: float
    max_batch_size: int = 8
    seq_len: int = 128
    senders: int = 1  # client processes driving the closed loop (one Python process tops out at a few 1000 req/s)
    step_estimate_s: float = 30.0  # server start + run, to decide what still fits the budget


PLANS = {
    "gpu": Plan("gpu", ("resnet50", "bert_base"), "fp16", (1, 2, 4, 8), (1, 8), duration_s=8.0, warmup_s=2.0,
                step_estimate_s=45.0, senders=4),
    "cpu": Plan("cpu", ("tiny_cnn", "tiny_mlp"), "fp32", (1, 2), (), duration_s=3.0, warmup_s=1.0,
                step_estimate_s=15.0),
}
QUICK = {"duration_s": 1.0, "warmup_s": 0.3}
MAX_RATE_RPS = 20_000  # upper bound on one model's closed-loop rate, to size the request list


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "unknown"


def machine_facts(gpu: bool) -> dict:
    """Host, Python, torch, and the GPU (name, driver, memory) or CPU model."""
    import torch

    facts = {"python": platform.python_version(), "torch": torch.__version__, "cores": os.cpu_count(),
             "platform": platform.platform(), "load_average_1m": round(os.getloadavg()[0], 2)}
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or "cpu"
    facts["cpu"] = cpu
    if gpu:
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                     gpu_memory_bytes=int(props.total_memory), sms=int(props.multi_processor_count),
                     cuda=torch.version.cuda)
        try:
            import pynvml

            pynvml.nvmlInit()
            facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
        except Exception as err:  # noqa: BLE001 - a fact we can do without
            facts["driver"] = f"unknown ({type(err).__name__})"
        facts["machine"] = slug(facts["gpu"])
    else:
        facts["machine"] = f"cpu{os.cpu_count()}-{slug(cpu)}"
    return facts


def export_repo(plan: Plan, repo: Path) -> list[str]:
    """Export the plan's two models to TorchScript (exporter API, parity checked) and switch dynamic batching off."""
    from serving_bench.export.api import export_models
    from serving_bench.serving_config import ServingConfig

    records = export_models(list(plan.pair), ["torchscript"], repo, max_batch_size=plan.max_batch_size,
                            precision=plan.precision, seq_len=plan.seq_len if "bert_base" in plan.pair else None,
                            log=lambda line: print(f"  {line}", flush=True))
    failed = [f"{r['name']}: {r.get('reason')}" for r in records if r["status"] != "exported"]
    if failed:
        raise SystemExit(f"export failed: {'; '.join(failed)}")
    config = ServingConfig.from_repo(repo)
    for model in config.models:
        changes = {"dynamic_batching": False}
        if plan.mode == "cpu":  # the exporter writes KIND_GPU where a GPU exists; the CPU plan stays on the CPU
            changes["instances"] = (("cpu", model.instance_count),)
        config = config.with_model(model.replace(**changes))
    config.apply_to_repo(repo)
    return [f"{m}_torchscript" for m in plan.pair]


def closed_schedule(models: list[str], duration_s: float, seed: int = 0):
    """Enough batch-1 requests per model for ``duration_s`` of closed-loop load (arrival times unused)."""
    from serving_bench.run.schedule import Schedule

    per_model = int(MAX_RATE_RPS * duration_s)
    n = per_model * len(models)
    rng = np.random.default_rng(seed)
    return Schedule(arrival_s=np.zeros(n), model=np.repeat(np.arange(len(models)), per_model), models=tuple(models),
                    sample=rng.integers(0, 16, size=n), batch=np.ones(n),
                    meta={"duration_s": duration_s, "seed": seed, "mode": "closed"})


def measure(server, models: list[str], concurrency: dict[str, int], plan: Plan, label: str, **facts) -> dict:
    """One closed-loop run against ``server``: per model throughput, p50/p99 (ms) and counts, plus telemetry."""
    from serving_bench.load.driver import TritonTarget
    from serving_bench.run.target import ClosedLoop
    from serving_bench.run.metrics import summarize
    from serving_bench.telemetry import Telemetry

    total_s = plan.warmup_s + plan.duration_s
    target = TritonTarget(server, mode=ClosedLoop(concurrency=concurrency, duration_s=total_s),
                          senders=min(plan.senders, max(1, sum(concurrency.values()))))
    start = time.perf_counter()
    with Telemetry(server.endpoints.metrics_url, interval_s=0.5, pid=server.pid) as telemetry:
        records = target.run(closed_schedule(models, total_s))
    summary = summarize(records, warmup_s=plan.warmup_s, duration_s=total_s)
    tel = telemetry.summary(start_s=plan.warmup_s)
    run = {"label": label, **facts, "models": {}, "concurrency": concurrency, "duration_s": plan.duration_s,
           "warmup_s": plan.warmup_s, "partial": summary["partial"], "stop_reason": records.info.stop_reason,
           "gpu": {k: tel.get("gpu", {}).get(k) for k in ("available", "reason", "util_mean_pct", "util_peak_pct",
                                                          "mem_used_peak_bytes", "power_peak_w")},
           "cpu": tel.get("cpu", {}), "wall_s": round(time.perf_counter() - start, 2)}
    for name in models:
        s = summary["models"][name]
        ms = lambda v: None if v is None else round(v * 1e3, 3)  # noqa: E731
        run["models"][name] = {"throughput_rps": round(s["throughput_rps"], 2), "p50_ms": ms(s["p50_s"]),
                               "p99_ms": ms(s["p99_s"]), "ok": s["counts"]["ok"], "failed": s["counts"]["failed"],
                               "timeout": s["counts"]["timeout"],
                               "server_queue_ms": ms(tel["models"].get(name, {}).get("queue_s_mean")),
                               "server_compute_ms": ms(tel["models"].get(name, {}).get("compute_s_mean"))}
    line = "; ".join(f"{n}: {m['throughput_rps']:.1f} req/s, p50 {m['p50_ms']} ms, p99 {m['p99_ms']} ms"
                     for n, m in run["models"].items())
    print(f"  {label}: {line}", flush=True)
    return run


class ServedParity:
    """Served outputs against the fp32 torch module (the exporter's parity measure and tolerance), through the whole
    served path (runner on the instance's device, CUDA graphs when on). Reference outputs are computed once."""

    def __init__(self, plan: Plan, seed: int = 0):
        self.plan, self.seed = plan, seed
        self.cache: dict[str, tuple] = {}

    def reference(self, model: str):
        if model not in self.cache:
            from serving_bench.export.parity import torch_outputs
            from serving_bench.models import get_model

            spec = get_model(model, **({"seq_len": self.plan.seq_len} if model == "bert_base" else {}))
            inputs = spec.make_inputs(2, self.seed)
            self.cache[model] = (spec.with_precision(self.plan.precision), inputs,
                                 torch_outputs(spec.create(self.seed), spec, inputs))
        return self.cache[model]

    def check(self, server, entries: list[str]) -> dict[str, float]:
        """Relative error per entry (one batch of 2 through the server); above ``tolerance`` the run is marked failed
        at the end, but the check goes on."""
        import tritonclient.grpc as grpcclient

        from serving_bench.export.parity import relative_error
        from serving_bench.export.repository import NUMPY_TO_TRITON
        from tritonclient.grpc import model_config_pb2 as mc

        errors = {}
        client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
        try:
            for entry in entries:
                spec, inputs32, reference = self.reference(entry.rsplit("_", 1)[0])
                tensors = []
                for t in spec.inputs:
                    data = inputs32[t.name].astype(t.dtype)
                    tensor = grpcclient.InferInput(t.name, list(data.shape),
                                                   mc.DataType.Name(NUMPY_TO_TRITON[t.dtype])[len("TYPE_"):])
                    tensor.set_data_from_numpy(data)
                    tensors.append(tensor)
                with server.guard():
                    result = client.infer(entry, tensors)
                errors[entry] = max(relative_error(result.as_numpy(n), reference[n]) for n in spec.output_names)
        finally:
            client.close()
        return errors


def run_checks(plan: Plan, repo: Path, budget_s: float, started: float, url: str | None,
               saved: Callable[[list, list], None] = lambda runs, skipped: None) -> tuple[list, list]:
    """Run the plan's steps; ``saved(runs, skipped)`` is called after each, so a run cut short keeps its figures."""
    from serving_bench.serve.server import connect

    swept, partner = [f"{m}_torchscript" for m in plan.pair]
    runs, skipped = [], []
    parity = ServedParity(plan)

    def record(run: dict) -> None:
        runs.append(run)
        saved(runs, skipped)

    def fits(step: str) -> bool:
        left = budget_s - (time.perf_counter() - started)
        if left < plan.step_estimate_s:
            skipped.append({"step": step, "reason": f"time budget: {left:.0f} s left of {budget_s:.0f} s"})
            print(f"  skipped {step}: time budget", flush=True)
            return False
        return True

    def server(models, instances, cuda_graphs=None):
        return connect(repo, url=url, models=models, instances=instances, cuda_graphs=cuda_graphs)

    # 1. both models, one instance each: each alone, then the pair
    if fits("pair"):
        with server([swept, partner], {swept: 1, partner: 1}) as srv:
            errors = parity.check(srv, [swept, partner])
            print(f"  served outputs vs torch: {errors}", flush=True)
            record(measure(srv, [swept], {swept: 2}, plan, f"{swept} x1", instances=1, cuda_graphs=False,
                           parity_error=errors[swept]))
            record(measure(srv, [partner], {partner: 2}, plan, f"{partner} x1", instances=1, cuda_graphs=False,
                           parity_error=errors[partner]))
            record(measure(srv, [swept, partner], {swept: 2, partner: 2}, plan, f"pair {swept} + {partner}",
                           instances=1, cuda_graphs=False))
    if url:  # an external server's instance counts are its own: nothing more to vary
        return runs, skipped
    # 2. the instance sweep
    for n in plan.sweep[1:]:
        if fits(f"{swept} x{n}"):
            with server([swept], {swept: n}) as srv:
                record(measure(srv, [swept], {swept: 2 * n}, plan, f"{swept} x{n}", instances=n,
                               cuda_graphs=False, parity_error=parity.check(srv, [swept])[swept]))
    # 3. CUDA graphs (GPU only)
    for n in plan.graphs_at:
        if fits(f"{swept} x{n} cuda graphs"):
            with server([swept], {swept: n}, cuda_graphs="1") as srv:
                record(measure(srv, [swept], {swept: 2 * n}, plan, f"{swept} x{n} cuda graphs", instances=n,
                               cuda_graphs=True, parity_error=parity.check(srv, [swept])[swept]))
    return runs, skipped


def markdown(result: dict) -> str:
    facts = result["machine"]
    lines = [f"# GPU check, {result['date']}, {facts.get('gpu') or facts['cpu']} ({result['plan']['mode']} plan)", "",
             f"Command: `{result['command']}`. Closed loop at batch 1, {result['plan']['duration_s']} s per run after "
             f"{result['plan']['warmup_s']} s warm-up, 2 x instances requests in flight per model, dynamic batching "
             f"off. Latency from send to answer (client side). 'served vs torch': relative error of one served batch "
             f"against the fp32 torch module (the exporter's parity measure).", "",
             "| run | model | instances | CUDA graphs | req/s | p50 ms | p99 ms | server queue ms | server compute ms "
             "| GPU util mean % | GPU mem peak GB | served vs torch |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in result["runs"]:
        gpu = run["gpu"]
        util = "n/a" if gpu.get("util_mean_pct") is None else f"{gpu['util_mean_pct']:.0f}"
        mem = "n/a" if gpu.get("mem_used_peak_bytes") is None else f"{gpu['mem_used_peak_bytes'] / 1e9:.1f}"
        parity = "-" if run.get("parity_error") is None else f"{run['parity_error']:.1e}"
        for name, m in run["models"].items():
            lines.append(f"| {run['label']} | {name} | {run['instances']} | {'yes' if run['cuda_graphs'] else 'no'} "
                         f"| {m['throughput_rps']:.1f} | {m['p50_ms']} | {m['p99_ms']} | {m['server_queue_ms']} | "
                         f"{m['server_compute_ms']} | {util} | {mem} | {parity} |")
    if not result.get("complete", True):
        lines += ["", "INCOMPLETE: the check was cut short after the runs above."]
    if result["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{s['step']} ({s['reason']})" for s in result["skipped"])]
    if result["plan"]["mode"] == "cpu":
        lines += ["", "CPU plan: tiny models on KIND_CPU instances, a check that the script works end to end; these "
                      "figures say nothing about a GPU."]
    lines += ["", f"Machine: {json.dumps(facts, sort_keys=True)}", f"Total wall time: {result['elapsed_s']:.0f} s", ""]
    return "\n".join(lines)


def write_result(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"gpu_check_{result['date']}_{result['machine']['machine']}"
    paths = []
    for suffix, text in ((".json", json.dumps(result, indent=2, sort_keys=True) + "\n"), (".md", markdown(result))):
        path = out / f"{stem}{suffix}"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the reduced CPU plan (tiny models, KIND_CPU instances)")
    parser.add_argument("--quick", action="store_true", help="shorter runs (for tests)")
    parser.add_argument("--out", default="benchmarks/results", help="folder for the result files")
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop starting new steps after this (s)")
    parser.add_argument("--url", help="measure an external Triton (gRPC host:port) that serves the exported models")
    parser.add_argument("--repo", help="export into this folder (default: a temporary one)")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    import torch

    gpu = torch.cuda.is_available() and not args.cpu
    plan = PLANS["gpu" if gpu else "cpu"]
    if args.quick:
        plan = dataclasses.replace(plan, **QUICK)
    if not gpu and not args.cpu:
        print("no CUDA GPU visible to torch: running the reduced CPU plan (no GPU figures)", flush=True)
    facts = machine_facts(gpu)
    print(f"gpu_check: {plan.mode} plan on {facts.get('gpu') or facts['cpu']}", flush=True)
    command = " ".join(["scripts/gpu_check.sh", *(argv if argv is not None else sys.argv[1:])])

    def result_of(runs: list, skipped: list, complete: bool) -> dict:
        return {"date": datetime.date.today().isoformat(), "machine": facts, "plan": dataclasses.asdict(plan),
                "command": command, "url": args.url, "runs": list(runs), "skipped": list(skipped),
                "complete": complete, "elapsed_s": round(time.perf_counter() - started, 1)}

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        repo = Path(args.repo) if args.repo else Path(tmp) / "repo"
        print(f"export {', '.join(plan.pair)} ({plan.precision}, TorchScript) into {repo}", flush=True)
        export_repo(plan, repo)
        runs, skipped = run_checks(plan, repo, args.budget_s, started, args.url,
                                   saved=lambda r, s: write_result(result_of(r, s, False), Path(args.out)))
    result = result_of(runs, skipped, True)
    for path in write_result(result, Path(args.out)):
        print(f"wrote {path}")
    from serving_bench.export.parity import TOLERANCE

    failed = [f"{r['label']}: {n}" for r in runs for n, m in r["models"].items() if m["failed"] or m["ok"] == 0]
    failed += [f"{r['label']}: served outputs differ from torch by {r['parity_error']:.3g} (tolerance "
               f"{TOLERANCE[plan.precision]:g})" for r in runs
               if r.get("parity_error") is not None and not r["parity_error"] <= TOLERANCE[plan.precision]]
    if failed:
        print(f"requests failed in: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
