"""The campaign's runs without Triton (``scripts/gpu_campaign.py``, docs/gpu.md "The GPU campaign"): exported entries
run in threads of one process, as a native backend runs its instances (one CUDA context, each thread its own
stream), closed loop, each thread one request at a time.

Modes: ``eager`` (the TorchScript artifact, the runner's own loader), ``graphs`` (the runner's CUDA graphs, one set
per thread, captured before the threads start) and ``compiled`` (the zoo's module through ``torch.compile``, run in a
child process that a time box can end: ``python scripts/gpu_threads.py --compiled ...`` writes one JSON line per run).

A run gives per entry the answered requests per second in its window, the p50, p99 and mean latency of the requests
started in it (ms; send to answer, host clock), and the GPU's activity (:mod:`gpu_activity`); its raw latencies
(ms) go to the campaign's ``raw.npz``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_activity import Activity  # noqa: E402

SEED = 0


@dataclass(frozen=True)
class Entry:
    """An exported entry: ``name`` (``<model>_<framework>``), its zoo ``model``, ``framework`` and precision."""

    name: str
    model: str
    framework: str
    precision: str
    seq_len: int = 128

    def spec(self):
        from serving_bench.models import get_model

        options = {"seq_len": self.seq_len} if self.model == "bert_base" else {}
        return get_model(self.model, **options).with_precision(self.precision)

    def inputs(self, batch: int) -> dict[str, np.ndarray]:
        return self.spec().make_inputs(batch, SEED)


@dataclass(frozen=True)
class Windows:
    """A run's warm-up and measured window (s); ``ks`` the thread counts of one entry at batch 1; ``sizes`` the batch
    sizes of one thread; ``pairs`` whether the entries run two by two."""

    warmup_s: float
    window_s: float
    ks: tuple[int, ...]
    sizes: tuple[int, ...]
    pairs: bool = True


def eager_predictor(repo: Path, entry: Entry, device: str) -> Callable:
    """The artifact loaded by the runner's own loader (``export.frameworks.load_predictor``)."""
    from serving_bench.export.frameworks import load_predictor

    spec = entry.spec()
    return load_predictor(entry.framework, repo / entry.name / "1", [t.name for t in spec.inputs],
                          spec.output_names, device=device, threads=1 if device == "cpu" else None)


def graph_predictor(repo: Path, entry: Entry, device: str, sizes: tuple[int, ...]) -> Callable:
    """The runner's CUDA graphs of the TorchScript artifact, captured at ``sizes``."""
    import torch  # heavy: ~1 s to import

    from serving_bench.serve.runners.cuda_graphs import CudaGraphPredictor

    spec = entry.spec()
    module = torch.jit.load(str(repo / entry.name / "1" / "model.pt"), map_location=device).eval()
    return CudaGraphPredictor(module, device, [t.name for t in spec.inputs], spec.output_names, entry.inputs(1),
                              sizes)


def compiled_predictor(entry: Entry, device: str, sizes: tuple[int, ...], backend: str = "inductor") -> Callable:
    """The zoo's module (the exported weights: same seed) through ``torch.compile`` (``backend``), compiled at
    ``sizes`` now."""
    import torch  # heavy: ~1 s to import

    spec = entry.spec()
    module = torch.compile(spec.create(SEED).to(device), dynamic=False, backend=backend)
    names = [t.name for t in spec.inputs]

    def predict(inputs: dict) -> dict:
        with torch.inference_mode():
            out = module(*[torch.from_numpy(inputs[n]).to(device) for n in names])
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        return {n: t.cpu().numpy() for n, t in zip(spec.output_names, out)}

    for b in sizes:
        predict(entry.inputs(b))
    return predict


class Predictors:
    """The predictors of one mode, made once and reused across runs: per entry one shared by its threads (eager,
    compiled) or one per thread (graphs: each its own buffers), the first captured at every batch size."""

    def __init__(self, repo: Path, mode: str, device: str, sizes: tuple[int, ...], make_compiled=None):
        self.repo, self.mode, self.device, self.sizes = repo, mode, device, sizes
        self.made: dict[str, list[Callable]] = {}
        self.make_compiled = make_compiled or compiled_predictor

    def get(self, entry: Entry, count: int) -> list[Callable]:
        have = self.made.setdefault(entry.name, [])
        while len(have) < (count if self.mode == "graphs" else 1):
            if self.mode == "graphs":
                have.append(graph_predictor(self.repo, entry, self.device, self.sizes if not have else (1,)))
            elif self.mode == "compiled":
                have.append(self.make_compiled(entry, self.device, self.sizes))
            else:
                have.append(eager_predictor(self.repo, entry, self.device))
        return have[:count] if self.mode == "graphs" else have * count


def run_threads(work: list[tuple[Entry, Callable, dict]], windows: Windows, device: str) -> tuple[dict, dict]:
    """One thread per ``(entry, predictor, inputs)``, each sending the next request when its answer is back, for
    the warm-up and the window; (per entry its figures and the GPU's activity, per entry its raw latencies)."""
    cuda = device.startswith("cuda")
    times: list[list[tuple[float, float]]] = [[] for _ in work]
    warm, start = threading.Barrier(len(work) + 1), threading.Barrier(len(work) + 1)
    first = threading.Lock()  # the threads' first calls one at a time (a compiled module may compile again in one)
    end_s = [0.0]

    failed: list[BaseException] = []

    def loop(i: int) -> None:
        entry, predict, inputs = work[i]
        try:
            stream = None
            if cuda:
                import torch  # heavy: ~1 s to import

                stream = torch.cuda.Stream(device=device)
            out = times[i]
            with _stream(stream):
                with first:  # this thread's first call (its library handles, a compiled module's guards) unmeasured
                    predict(inputs)
                warm.wait()
                start.wait()
                while True:
                    t0 = time.perf_counter()
                    if t0 >= end_s[0]:
                        break
                    predict(inputs)
                    out.append((t0, time.perf_counter()))
        except BaseException as err:  # noqa: BLE001 - the run stops and raises it (no thread left waiting)
            if not isinstance(err, threading.BrokenBarrierError):
                failed.append(err)
            warm.abort()
            start.abort()

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(work))]
    for t in threads:
        t.start()
    with Activity() as gpu:
        lo = hi = time.perf_counter()
        try:
            warm.wait()  # every thread made its first call: the clock starts now
            lo = time.perf_counter() + windows.warmup_s
            hi = end_s[0] = lo + windows.window_s
            start.wait()
        except threading.BrokenBarrierError:
            pass  # a thread failed: its error is raised below
        for t in threads:
            t.join()
        if failed:
            raise failed[0]
        activity = gpu.summary(lo, hi)
    figures, raw = {}, {}
    for name in dict.fromkeys(e.name for e, _, _ in work):
        rows = np.array([t for i, (e, _, _) in enumerate(work) if e.name == name for t in times[i]]).reshape(-1, 2)
        began = rows[(rows[:, 0] >= lo) & (rows[:, 0] < hi)]
        latency_ms = (began[:, 1] - began[:, 0]) * 1e3
        answered = int(((rows[:, 1] >= lo) & (rows[:, 1] < hi)).sum())
        figures[name] = {"throughput_rps": round(answered / windows.window_s, 2), "requests": int(len(began)),
                         **_quantiles(latency_ms)}
        raw[name] = latency_ms.astype(np.float32)
    return {"models": figures, "gpu": activity}, raw


class _stream:
    """``with _stream(s)``: the torch stream ``s`` current in this thread (None: nothing)."""

    def __init__(self, stream):
        self.stream, self.context = stream, None

    def __enter__(self):
        if self.stream is not None:
            import torch  # heavy: ~1 s to import

            self.context = torch.cuda.stream(self.stream)
            self.context.__enter__()

    def __exit__(self, *exc):
        if self.context is not None:
            self.context.__exit__(*exc)


def _quantiles(latency_ms: np.ndarray) -> dict:
    if not len(latency_ms):
        return {"p50_ms": None, "p99_ms": None, "mean_ms": None}
    p50, p99 = np.percentile(latency_ms, [50, 99])
    return {"p50_ms": round(float(p50), 4), "p99_ms": round(float(p99), 4),
            "mean_ms": round(float(latency_ms.mean()), 4)}


def plan_runs(entries: list[Entry], windows: Windows) -> list[tuple[str, dict[str, int], int]]:
    """(label, entry -> threads, batch) of every run: each entry alone at each batch size, at each thread count of
    ``windows.ks`` at batch 1, then the pairs at batch 1 (one thread each)."""
    runs = [(f"{e.name} b{b}", {e.name: 1}, b) for e in entries for b in windows.sizes]
    runs += [(f"{e.name} x{k}", {e.name: k}, 1) for e in entries for k in windows.ks if k > 1]
    if windows.pairs:
        runs += [(f"pair {a.name} + {b.name}", {a.name: 1, b.name: 1}, 1)
                 for i, a in enumerate(entries) for b in entries[i + 1:]]
    return runs


def measure(entries: list[Entry], predictors: Predictors, windows: Windows, device: str, say: Callable[[str], None],
            record: Callable[[dict, dict], None], deadline_s: float = float("inf")) -> None:
    """Every run of :func:`plan_runs` with ``predictors`` (one mode), each passed to ``record(run, raw)`` as it ends;
    runs that would end after ``deadline_s`` (``perf_counter``) are not started."""
    by_name = {e.name: e for e in entries}
    for label, threads, batch in plan_runs(entries, windows):
        if time.perf_counter() + windows.warmup_s + windows.window_s > deadline_s:
            say(f"  threads {predictors.mode}: stopped before {label} (time box)")
            return
        work = []
        for name, count in threads.items():
            entry = by_name[name]
            inputs = entry.inputs(batch)
            work += [(entry, p, inputs) for p in predictors.get(entry, count)]
        figures, raw = run_threads(work, windows, device)
        run = {"kind": "threads", "label": f"{label} ({predictors.mode}, threads)", "mode": predictors.mode,
               "batch": batch,
               "threads": threads, "warmup_s": windows.warmup_s, "window_s": windows.window_s, **figures}
        say(f"  {run['label']}: " + "; ".join(f"{n} {m['throughput_rps']:.1f} req/s p50 {m['p50_ms']} p99 "
                                               f"{m['p99_ms']} ms" for n, m in run["models"].items())
            + _busy(run["gpu"]))
        record(run, raw)


def _busy(gpu: dict) -> str:
    parts = [f"{k.split('_')[0]} {gpu[k]:.0f} %" for k in ("busy_pct", "sm_active_pct") if gpu.get(k) is not None]
    return f" (GPU {', '.join(parts)})" if parts else ""


def compiled_child(args: argparse.Namespace) -> int:
    """``--compiled``: compile each entry in turn (its time counted), then run its runs; one JSON line per run
    (``{"run": ..., "raw": {entry: [ms, ...]}}``) and per compile (``{"compiled": entry, "seconds": ...}``)."""
    entries = [Entry(**e) for e in json.loads(args.entries)]
    windows = Windows(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(args.windows).items()})
    deadline = time.perf_counter() + args.seconds
    out = open(args.out, "a", buffering=1)

    def write(item: dict) -> None:
        out.write(json.dumps(item) + "\n")

    from serving_bench.export.parity import relative_error

    predictors = Predictors(Path(args.repo), "compiled", args.device, windows.sizes,
                            lambda e, device, sizes: compiled_predictor(e, device, sizes, args.backend))
    ready: list[Entry] = []
    for entry in entries:
        began = time.perf_counter()
        [predict] = predictors.get(entry, 1)
        seconds = time.perf_counter() - began
        inputs = entry.inputs(windows.sizes[0])
        ours, eager = predict(inputs), eager_predictor(Path(args.repo), entry, args.device)(inputs)
        write({"compiled": entry.name, "seconds": round(seconds, 1),
               "vs_eager": max(relative_error(ours[n], eager[n]) for n in eager)})
        ready.append(entry)
        alone = replace(windows, pairs=False)
        measure([entry], predictors, alone, args.device, lambda line: print(line, flush=True),
                lambda run, raw: write({"run": run, "raw": {k: v.tolist() for k, v in raw.items()}}), deadline)
    if windows.pairs and len(ready) > 1:
        pairs = [(a, b) for i, a in enumerate(ready) for b in ready[i + 1:]]
        for a, b in pairs:
            measure([a, b], predictors, replace(windows, sizes=(), ks=()), args.device,
                    lambda line: print(line, flush=True),
                    lambda run, raw: write({"run": run, "raw": {k: v.tolist() for k, v in raw.items()}}), deadline)
    out.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compiled", action="store_true", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--entries", required=True, help="JSON list of Entry fields")
    parser.add_argument("--windows", required=True, help="JSON of Windows fields")
    parser.add_argument("--device", required=True)
    parser.add_argument("--seconds", type=float, required=True, help="no run starts that would end after this")
    parser.add_argument("--out", required=True, help="JSON lines are appended here")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 2) // 2)))
    return compiled_child(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
