"""The steps of ``scripts/gpu_campaign.py`` (its docstring lists them, most wanted first) and the dataset's tables.

Every step is a function of the :class:`~gpu_campaign.Campaign` under way; it records each run as it ends
(``campaign.record``), so a step that fails halfway keeps the runs before the failure.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import gpu_triton as tri
from gpu_threads import Entry, Predictors, Windows, eager_predictor, measure, plan_runs

SCRIPTS = Path(__file__).resolve().parent
COMPILE_MARGIN_S = 10.0  # the compiled child's time box ends this long before the budget does
COLD_SECONDS = 4.5  # an entry's cold-start run (calibrate.alone: 5 blocks of 24 quiet times, 0.5 to 128 ms on average)


def run_all(c, tmp: Path, device: str) -> None:
    """Every step in order (the module docstring of ``gpu_campaign``)."""
    plan = c.plan
    repo = tmp / "repo"
    entries = [Entry(f"{m}_{f}", m, f, plan.precision, plan.seq_len) for m, f in plan.entries]
    if not c.step("export", lambda: export(c, repo, entries), 20.0):
        return
    entries = [e for e in entries if c.entries.get(e.name, {}).get("status") == "exported"]  # the others noted
    thread_windows = Windows(plan.thread_warmup_s, plan.thread_window_s, plan.thread_ks, plan.thread_sizes)
    thread_s = len(plan_runs(entries, thread_windows)) * (plan.thread_warmup_s + plan.thread_window_s + 0.3) + 10.0
    for mode in plan.modes:
        c.step(f"threads {mode}", lambda mode=mode: threads(c, repo, entries, mode, device, thread_windows),
               thread_s)
    sessions = [TritonSession(c, repo, entries, mode) for mode in plan.modes]
    try:
        for session, name, body, runs in triton_parts(sessions):
            c.step(f"triton {session.mode}: {name}", body, c.plan.server_estimate_s + runs * session.run_s)
    finally:
        for session in sessions:
            session.close()
    if plan.compiled:
        c.step("threads compiled", lambda: compiled(c, repo, entries, device), 45.0 + COMPILE_MARGIN_S)


def export(c, repo: Path, entries: list[Entry]) -> None:
    """Export the entries (the exporter's API, parity checked) and the ensemble; dynamic batching off everywhere (so
    an executed batch is a request); on the CPU plan every instance on the CPU."""
    from serving_bench.export.api import export_models
    from serving_bench.export.frameworks import ExportOptions
    from gpu_check import serve_unbatched

    plan = c.plan
    by_framework: dict[str, list[str]] = {}
    for e in entries:
        by_framework.setdefault(e.framework, []).append(e.model)
    frameworks = list(by_framework)
    ensemble = f"{plan.ensemble[0]}={','.join(plan.ensemble[1])}"
    for framework in frameworks:
        options = ExportOptions(max_batch_size=plan.max_batch_size, precision=plan.precision,
                                seq_len=plan.seq_len if "bert_base" in by_framework[framework] else None)
        records = export_models(by_framework[framework], [framework], repo, options=options,
                                log=lambda line: c.say(f"  {line}"),
                                ensembles=[ensemble] if framework == frameworks[-1] else [])
        for r in records:  # an entry that failed (its parity, say) is noted and left out; the others go on
            c.entries[r["name"]] = {k: r[k] for k in ("model", "framework", "precision", "status", "parity",
                                                      "members", "reason") if k in r}
            if r["status"] != "exported":
                c.notes.append(f"export of {r['name']} {r['status']}: {r.get('reason')}; its runs are left out")
    if not any(c.entries.get(e.name, {}).get("status") == "exported" for e in entries):
        raise RuntimeError("no entry exported")
    served = serve_unbatched(repo, plan.mode)
    c.serving = {"models": {m.name: dataclasses.asdict(m) for m in served.models},
                 "ensembles": {e: list(members) for e, members in served.ensembles},
                 "ensemble_deps": {e: [list(d) for d in deps] for e, deps in served.ensemble_deps}}


def threads(c, repo: Path, entries: list[Entry], mode: str, device: str, windows: Windows) -> None:
    """The thread runs of one mode (:func:`gpu_threads.measure`); graphs are first compared with eager."""
    if mode == "graphs" and not device.startswith("cuda"):
        raise RuntimeError("CUDA graphs need a CUDA device")
    predictors = Predictors(repo, mode, device, windows.sizes)
    if mode != "eager":
        from serving_bench.export.parity import relative_error

        for e in entries:
            inputs = e.inputs(2)
            ours, eager = predictors.get(e, 1)[0](inputs), eager_predictor(repo, e, device)(inputs)
            c.entries[e.name][f"{mode}_vs_eager"] = max(relative_error(ours[n], eager[n]) for n in eager)
    measure(entries, predictors, windows, device, c.say, c.record)
    del predictors
    _release(device)


def _release(device: str) -> None:
    if device.startswith("cuda"):
        import torch  # heavy: ~1 s to import

        torch.cuda.empty_cache()


def triton_parts(sessions: list):
    """(session, name, body, runs) of every Triton part, most wanted first, the modes taking turns (each keeps its
    server: idle, it costs the GPU nothing): solo, co-located, open loops and cold starts at one instance, then
    each k (the reloads: the slowest part)."""
    names = ["solo", "co-located", "open loops", "cold starts", *(f"k={k}" for k in sessions[0].c.plan.triton_ks)]
    for name in names:
        for session in sessions:
            yield (session, name, *session.part(name))


class TritonSession:
    """One server per mode, the runners' execution logs on, its entries at ``k`` instances each (1 at the start;
    :meth:`at` reloads them)."""

    def __init__(self, c, repo: Path, entries: list[Entry], mode: str):
        self.c, self.repo, self.entries, self.mode = c, repo, [e.name for e in entries], mode
        self.swept = [e for e in self.entries if e in c.plan.swept] or self.entries  # reloaded at k instances
        exported = c.entries.get(c.plan.ensemble[0], {}).get("status") == "exported"
        self.ensemble = c.plan.ensemble[0] if exported else None  # None: it (or a member) did not export
        self.server = None
        self.k = 1  # instances per entry now
        self.trio_rates: dict[str, float] = {}
        self.back_to_back: dict[str, float] = {}  # each entry's p50 one at a time at batch 1 (s)
        plan = c.plan
        self.window = tri.Window(plan.triton_warmup_s, plan.triton_window_s)
        self.run_s = self.window.total_s + plan.run_overhead_s

    def part(self, name: str) -> tuple:
        """(body, runs it takes) of the part ``name``."""
        plan, n = self.c.plan, len(self.entries)
        if name.startswith("k="):
            k = int(name[2:])
            return lambda: self.sweep(k), len(self.swept) + 1
        colds = min(n, plan.cold_entries)
        return {"solo": (self.solo, n * (len(plan.triton_sizes) + 1) + 1),
                "co-located": (self.colocated, n * (n - 1) // 2 + 2),
                "open loops": (self.open_loops, len(plan.loads) * plan.open_s / self.run_s + 1),
                "cold starts": (self.cold, colds * (COLD_SECONDS + plan.run_overhead_s) / self.run_s)}[name]

    def live(self):
        """The server, started (again, with one instance per entry) where it is not running."""
        from serving_bench.serve.server import TritonServer

        if self.server is not None:
            try:
                self.server.check_alive()
                return self.server
            except Exception:  # noqa: BLE001 - dead: a new one below (its failure was recorded)
                self.close()
        sizes = ",".join(str(b) for b in sorted(set(self.c.plan.triton_sizes)))
        server = TritonServer(self.repo, models=[*self.entries, *([self.ensemble] if self.ensemble else [])],
                              instances={e: 1 for e in self.entries}, execution_log=True,
                              cuda_graphs=sizes if self.mode == "graphs" else None)
        began = time.perf_counter()
        server.start()
        self.server, self.k = server, 1
        self.c.say(f"  server ({self.mode}) ready in {time.perf_counter() - began:.1f} s")
        return server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def closed(self, loads: dict, label: str, instances: int = 1, role: str = "case") -> dict:
        """A closed loop (``role``: ``profile`` for the runs a solo profile is made of, else ``case``)."""
        run, raw = tri.closed(self.live(), loads, self.window, f"{label} ({self.mode})", mode=self.mode,
                              instances={m: instances for m in loads}, role=role)
        self.c.say(tri.say_run(run))
        self.c.record(run, raw)
        return run

    def solo(self) -> None:
        """Each entry alone one request at a time per batch size, and with 2 in flight; the ensemble alone."""
        self.at(1)
        for e in self.entries:
            for b in self.c.plan.triton_sizes:
                run = self.closed({e: (b, 1)}, f"{e} b{b} one at a time", role="profile")
                if b == 1:
                    self.back_to_back[e] = (run["models"][e]["p50_ms"] or 0.0) / 1e3
            self.closed({e: (1, 2)}, f"{e} x1")
        if self.ensemble:
            self.closed({self.ensemble: (1, 1)}, f"{self.ensemble} one at a time", role="profile")

    def colocated(self) -> None:
        """Every pair, all together and the ensemble, 2 requests in flight each."""
        self.at(1)
        for i, a in enumerate(self.entries):
            for b in self.entries[i + 1:]:
                self.closed({a: (1, 2), b: (1, 2)}, f"pair {a} + {b}")
        trio = self.closed({e: (1, 2) for e in self.entries}, "all together")
        self.trio_rates = {m: v["throughput_rps"] for m, v in trio["models"].items()}
        if self.ensemble:
            self.closed({self.ensemble: (1, 2)}, f"{self.ensemble} x1")

    def at(self, k: int):
        """The server with ``k`` instances of each swept entry (reloaded where it has another count; the others
        keep one)."""
        server = self.live()
        if self.k != k:
            seconds = tri.reload_instances(server, self.swept, k)
            self.k = k
            self.c.say(f"  reloaded {', '.join(self.swept)} with {k} instances each in {seconds:.1f} s")
        return server

    def open_loops(self) -> None:
        """All entries at Poisson times of each load's share of the rates they reached all together."""
        if not self.trio_rates or not all(self.trio_rates.values()):
            raise RuntimeError("no closed loop of all entries together answered: no rates to replay")
        self.at(1)
        for i, load in enumerate(self.c.plan.loads):
            rates = {m: load * r for m, r in self.trio_rates.items()}
            run, raw = tri.open_loop(self.live(), rates, self.c.plan.open_s, i, f"open loop at {load:g} of all "
                                     f"together's rates ({self.mode})", mode=self.mode, load=load,
                                     instances={m: 1 for m in rates}, role="case")
            self.c.say(tri.say_run(run))
            self.c.record(run, raw)

    def cold(self) -> None:
        """Each entry's cold starts as ``profile`` measures them (``calibrate.alone.cold``): one-row requests, each a
        random quiet time (exponential, of rising means, seeded) after the previous one's back-to-back latency."""
        # inside the step: an import that fails on a host (numpy 1 beside a scipy built for numpy 2) fails it alone
        from serving_bench.calibrate.alone import COLD_BLOCK, COLD_QUIET_S

        self.at(1)
        for i, e in enumerate(self.entries[:self.c.plan.cold_entries]):
            quiet = np.random.default_rng([0, i]).exponential(np.repeat(COLD_QUIET_S, COLD_BLOCK))
            times = np.cumsum(self.back_to_back.get(e, 0.0) + quiet)
            run, raw = tri.at_times(self.live(), e, times, f"{e} cold starts ({self.mode})", mode=self.mode,
                                    instances={e: 1}, role="cold")
            self.c.say(tri.say_run(run))
            self.c.record(run, raw)

    def sweep(self, k: int) -> None:
        """Every swept entry reloaded with ``k`` instances, each alone with ``2 k`` in flight."""
        self.at(k)
        for e in self.swept:
            self.closed({e: (1, 2 * k)}, f"{e} x{k}", instances=k)


def compiled(c, repo: Path, entries: list[Entry], device: str) -> None:
    """``torch.compile`` of the plan's models in a child process time-boxed by the budget (:mod:`gpu_threads`);
    each entry that compiled in time is run (batch sizes, thread counts), then the pairs."""
    plan = c.plan
    chosen = [e for m in plan.compiled for e in entries if e.model == m and e.framework == "torchscript"]
    windows = Windows(plan.thread_warmup_s, plan.thread_window_s, plan.thread_ks, plan.compiled_sizes)
    seconds = max(c.left_s() - COMPILE_MARGIN_S, 1.0)
    out = c.folder / ".compiled.jsonl"
    out.unlink(missing_ok=True)
    command = [sys.executable, str(SCRIPTS / "gpu_threads.py"), "--compiled", "--repo", str(repo), "--entries",
               json.dumps([dataclasses.asdict(e) for e in chosen]), "--windows",
               json.dumps(dataclasses.asdict(windows)), "--device", device, "--seconds", str(seconds), "--out",
               str(out), "--backend", plan.compile_backend]
    c.say(f"  compiling {', '.join(e.name for e in chosen)} ({plan.compile_backend}) in a child, {seconds:.0f} s box")
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        lines, _ = child.communicate(timeout=seconds + 5.0)
        ended = f"exit {child.returncode}"
    except subprocess.TimeoutExpired:
        child.kill()
        lines, _ = child.communicate()
        ended = "stopped at its time box"
    for line in (lines or "").splitlines()[-60:]:
        c.say(f"  | {line}")
    compiled_names = _read_compiled(c, out)
    out.unlink(missing_ok=True)
    late = [e.name for e in chosen if e.name not in compiled_names]
    c.notes.append(f"threads compiled ({plan.compile_backend}): {', '.join(compiled_names) or 'none'} compiled in "
                   f"the time box; the child {ended}" + (f"; not compiled in time: {', '.join(late)}" if late else ""))
    if not compiled_names:
        raise RuntimeError(f"no entry compiled within {seconds:.0f} s ({ended})")


def _read_compiled(c, path: Path) -> list[str]:
    """Record the child's runs and compile times; the entries that compiled."""
    names = []
    if not path.is_file():
        return names
    for line in path.read_text().splitlines():
        item = json.loads(line)
        if "compiled" in item:
            names.append(item["compiled"])
            c.entries[item["compiled"]].update(compile_s=item["seconds"], compiled_vs_eager=item.get("vs_eager"))
        elif "run" in item:
            c.record(item["run"], {k: np.asarray(v, np.float32) for k, v in item["raw"].items()})
    return names


def markdown(result: dict) -> str:
    """The dataset's tables: steps, then every run's figures per entry."""
    facts = result["machine"]
    lines = [f"# GPU campaign, {result['date']}, {facts.get('gpu') or facts['cpu']} ({result['plan']['mode']} plan)",
             "", f"Command: `{result['command']}`; budget {result['budget_s']:.0f} s, {result['elapsed_s']:.0f} s "
             f"used{'' if result['complete'] else ' (INCOMPLETE: cut short after the runs below)'}.", "",
             "| step | status | s | note |", "|---|---|---|---|"]
    for s in result["steps"]:
        lines.append(f"| {s['step']} | {s['status']} | {s.get('seconds', '')} | "
                     f"{s.get('error') or s.get('reason') or ''} |")
    lines += ["", "| run | entry | req/s | p50 ms | p99 ms | batch p50 ms | GPU busy % | SMs active % |",
              "|---|---|---|---|---|---|---|---|"]
    for run in result["runs"]:
        gpu = run.get("gpu") or {}
        for name, m in run["models"].items():
            lines.append(f"| {run['label']} | {name} | {m['throughput_rps']} | {m['p50_ms']} | {m['p99_ms']} | "
                         f"{m.get('batch_p50_ms', '')} | {_pct(gpu.get('busy_pct'))} | "
                         f"{_pct(gpu.get('sm_active_pct'))} |")
    reasons = {r for run in result["runs"] for r in ((run.get("gpu") or {}).get("reason"),
                                                      (run.get("gpu") or {}).get("gpm_reason")) if r}
    lines += [""] + [f"GPU activity: {r}." for r in sorted(reasons)] + [f"Note: {n}" for n in result["notes"]]
    if result["plan"]["mode"] == "cpu":
        lines.append("CPU plan: tiny models on the CPU, a check that the campaign works end to end; these figures "
                     "say nothing about a GPU.")
    lines += ["", f"Machine: {json.dumps(facts, sort_keys=True)}", ""]
    return "\n".join(lines)


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.0f}"
