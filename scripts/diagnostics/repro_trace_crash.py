"""Reproduce the bundled tritonserver 2.51 dying under request tracing (``make demo``'s stage 3, issue 11).

    .venv/bin/python scripts/diagnostics/repro_trace_crash.py  # 3 tries traced, then 3 untraced
    .venv/bin/python scripts/diagnostics/repro_trace_crash.py --pattern merged  # faster: usually dies within a minute
    .venv/bin/python scripts/diagnostics/repro_trace_crash.py --tries 2 --untraced-tries 0 --pattern merged \
        --gdb  # with gdb's stacks

Root cause and figures: docs/notes/serve-history.md#request-tracing-in-the-bundled-tritonserver-251-why-profile-does-not-use-it.

What it runs, each piece the team's own (nothing here is a copy of ``profile``):

* the demo's tiny entries (``tiny_cnn`` and ``tiny_mlp`` exported to ONNX Runtime, TorchScript and TVM) and the
  ensemble's combiner ``tiny_ensemble_combiner``, exported as ``serving_bench/demo.py`` does (``--repo``; exported
  there once, reused after);
* one ``TritonServer`` per try serving them, one instance each, with ``profile``'s trace flags
  (``serving_bench.calibrate.session.TRACE_ARGS`` plus a trace file) or without them (the untraced control);
* closed loops through ``profile``'s own ``Session.run`` (the team's closed-loop driver) against one model, by
  default the combiner, where the demo died:

  - ``--pattern batch-sizes`` (default): the per-batch-size phase of ``profile`` that died in ``make demo`` —
    concurrency 1, requests of 1, 2, 4 and 8 rows, ``--run-s`` seconds each, over and over;
  - ``--pattern merged``: the per-request phase c575e90 took off tracing — concurrency 8, requests of one row,
    which the dynamic batcher merges into batches of several requests.

A try ends when the server dies, stops answering, or after ``--bound-s`` seconds. Each try's server log is kept in
``--out``; a crash is summarised from it (glibc's message, the signal, the first server frames of Triton's own
stack dump, resolved with ``nm``). ``--gdb`` attaches gdb to each traced server and keeps the stack of the thread
that received the fatal signal (``gdb.txt``). ``--log-verbose`` adds Triton's ``--log-verbose=1``.

The bundled server's python backend names its shared-memory regions with a prefix of this run
(``--backend-config=python,shm-region-prefix-name=...``) so the regions a dead server leaves in ``/dev/shm`` are
removed after each try (only those no live process maps); so is the trace file (Triton writes every trace of a
surviving server at its exit: ~200 MB after two minutes).

Exit status 0 whatever the servers did ("reproduced" or "not reproduced" is printed); 2 for bad arguments, 1 when
the entries cannot be exported. Every wait is bounded (a hung server is killed); nothing is left running.
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from serving_bench.errors import InputError, ServerError

TINY_MODELS = ("tiny_cnn", "tiny_mlp")
COMBINER = "tiny_ensemble_combiner"
PATTERNS = {  # name -> (rows per request, concurrency) runs, repeated until the try ends
    "batch-sizes": ((1, 1), (2, 1), (4, 1), (8, 1)),
    "merged": ((1, 8),),
}
DEATH_WAIT_S = 30.0  # a dying server prints a symbolised stack dump first (addr2line): seconds
HANG_MARGIN_S = 90.0  # a try still driving this long after --bound-s has a hung server: seconds


@dataclass
class TryResult:
    """One server's try. ``seconds``: from the first request to the end of the try; ``requests``: answered ones."""

    traced: bool
    outcome: str = "survived"  # survived | died | stopped answering | error
    seconds: float = 0.0
    requests: int = 0
    exit_code: int | None = None
    site: list[str] = field(default_factory=list)  # lines naming where it died
    log: Path | None = None
    gdb: Path | None = None
    detail: str = ""

    @property
    def crashed(self) -> bool:
        return self.outcome in ("died", "stopped answering")


# -- the model repository --------------------------------------------------------------------------------------------

def served_entries(models: Sequence[str] | None) -> list[str]:
    """The entries each server loads: ``models`` or the demo's tiny entries and the ensemble's combiner."""
    from serving_bench.demo import FRAMEWORKS

    return list(models) if models else [f"{m}_{f}" for m in TINY_MODELS for f in FRAMEWORKS] + [COMBINER]


def ensure_repo(repo: Path) -> None:
    """Export the demo's tiny entries and its ensemble into ``repo`` (as ``serving_bench/demo.py`` does) unless
    every one is there already."""
    from serving_bench.demo import ENSEMBLE, FRAMEWORKS, MAX_BATCH
    from serving_bench.export.api import export_models
    from serving_bench.export.frameworks import ExportOptions
    from serving_bench.export.repository import load_manifest

    wanted = served_entries(None) + [ENSEMBLE.split("=")[0]]
    try:
        entries = load_manifest(repo)["entries"]
    except (InputError, OSError, KeyError):
        entries = {}
    if all(entries.get(n, {}).get("status") == "exported" for n in wanted):
        return
    print(f"exporting the demo's tiny entries and {ENSEMBLE} into {repo} ...", flush=True)
    batch = MAX_BATCH[TINY_MODELS[0]]
    records = export_models(list(TINY_MODELS), list(FRAMEWORKS), repo, options=ExportOptions(max_batch_size=batch),
                            overwrite=True, ensembles=[ENSEMBLE], log=lambda line: print("  " + line, flush=True))
    failed = [r for r in records if r["status"] == "failed"]
    if failed:
        raise SystemExit("export failed: " + ", ".join(f"{r['name']} ({r.get('reason')})" for r in failed))


# -- reading a dead server's log -------------------------------------------------------------------------------------

_FRAME = re.compile(r"^\s*(\d+)# (?:(0x[0-9A-Fa-f]+)|(\S+)) in (\S+)\s*$")
# what a dying server (glibc, libstdc++, Triton's signal handler) writes to its log
_FATAL = ("terminate called", "what():", "Assertion", "corrupted", "free():", "malloc(): ", "double free",
          "Signal (")


class Symbols:
    """Function names of a non-stripped executable by address offset (``nm --defined-only -C``)."""

    def __init__(self, binary: Path):
        self.starts: list[int] = []
        self.names: list[str] = []
        self.anchor: int | None = None  # offset of ErrorSignalHandler, the frame 0 of Triton's dumps
        nm = shutil.which("nm")
        if nm is None:
            return
        out = subprocess.run([nm, "--defined-only", "-C", str(binary)], capture_output=True, text=True,
                             timeout=120).stdout
        rows = []
        for line in out.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1] in "tTwW" and parts[0].strip():
                rows.append((int(parts[0], 16), parts[2]))
        rows.sort()
        self.starts = [r[0] for r in rows]
        self.names = [r[1] for r in rows]
        for offset, name in rows:
            if "ErrorSignalHandler" in name and "cold" not in name:
                self.anchor = offset

    def name(self, offset: int) -> str | None:
        i = bisect.bisect_right(self.starts, offset) - 1
        return f"{self.names[i]} + {offset - self.starts[i]}" if i >= 0 else None


def crash_site(log_text: str, binary: Path | None = None, symbols: Symbols | None = None, frames: int = 9
               ) -> list[str]:
    """The lines that say how a server died: glibc's or libstdc++'s last words, the ``Signal (N) received.``
    line, and the first ``frames`` frames of Triton's stack dump below the signal handler (addresses inside the
    ``tritonserver`` executable resolved with ``symbols``; it is a PIE, so the load address is taken from frame
    0, which is Triton's ``ErrorSignalHandler``). Empty when the log holds none of them (SIGILL has no dump)."""
    lines = log_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Signal (")), None)
    tail = lines[-40:] if start is None else lines[max(0, start - 3):start]
    out = [line.strip()[:200] for line in tail if any(key in line for key in _FATAL)]
    if start is None:
        return out
    out.append(lines[start].strip())
    dump = [m for m in map(_FRAME.match, lines[start + 1:]) if m]
    if symbols is None and binary is not None:
        symbols = Symbols(binary)
    base = None
    if dump and dump[0].group(2) and symbols is not None and symbols.anchor is not None:
        base = (int(dump[0].group(2), 16) - symbols.anchor) & ~0xFFF
    shown = 0
    for m in dump[1:]:
        number, address, name, where = m.groups()
        if name is None and where.endswith("/tritonserver") and base is not None:
            name = symbols.name(int(address, 16) - base - 1)  # a return address: the call is just before
        out.append(f"#{number} {(name or address)[:140]} in {Path(where).name}")
        shown += 1
        if shown >= frames:
            break
    return out


# -- gdb ----------------------------------------------------------------------------------------------------------

def attach_gdb(pid: int, out: Path, timeout_s: float = 120.0) -> subprocess.Popen | None:
    """Attach gdb (batch mode) to the server ``pid``; when a fatal signal stops it, gdb writes the signal, the
    faulting instructions and the stack of the thread that received it to ``out``, then detaches (the signal is
    delivered, the server dies as it would have). Returns once gdb has let the server continue, or None (no gdb,
    or it did not get there within ``timeout_s``; then it is stopped)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("note: gdb not found (apt-get install gdb); running without it", flush=True)
        return None
    quiet = "SIGPIPE SIGTERM SIGCHLD SIGUSR1 SIGUSR2 SIGALRM SIGWINCH"
    commands = ["set pagination off", "set print thread-events off", "set width 0",
                f"handle {quiet} nostop noprint pass", "echo gdb: continuing\\n", "continue",
                "info program", "x/2i $pc", "bt 40", "info registers rip rdi rsi", "detach"]
    handle = open(out, "w")
    proc = subprocess.Popen([gdb, "-q", "-nx", "-batch", "-p", str(pid)] + [a for c in commands for a in ("-ex", c)],
                            stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    handle.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if "gdb: continuing" in out.read_text(errors="replace"):  # batch mode does not say "Continuing."
            time.sleep(0.5)
            return proc
        time.sleep(0.2)
    stop_process(proc)
    print(f"note: gdb did not attach within {timeout_s:.0f} s (see {out}); running without it", flush=True)
    return None


def stop_process(proc: subprocess.Popen | None, timeout_s: float = 30.0) -> None:
    """End a process this script started (its own session): SIGTERM, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue


# -- shared memory ------------------------------------------------------------------------------------------------

def remove_regions(prefix: str) -> int:
    """Remove ``/dev/shm/<prefix>*`` regions (this run's python-backend regions) that no live process maps."""
    shm = Path("/dev/shm")
    regions = sorted(shm.glob(prefix + "*"))
    if not regions:
        return 0
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text(errors="replace")
        except OSError:
            continue
        mapped.update(r.name for r in regions if r.name in text)
    removed = 0
    for region in regions:
        if region.name not in mapped:
            region.unlink(missing_ok=True)
            removed += 1
    return removed


# -- one try ------------------------------------------------------------------------------------------------------

class Watchdog(threading.Thread):
    """Kills the server (its whole process group) when it hangs, so that the driver's calls fail instead of waiting:
    ``DEATH_WAIT_S`` after its log first shows a fatal message (Triton's signal handler symbolises its stack with
    addr2line and can deadlock on a corrupted heap), or at ``deadline`` (``time.monotonic``). ``reason`` says why it
    killed, or is None."""

    def __init__(self, process: subprocess.Popen, log: Path, deadline: float):
        super().__init__(daemon=True)
        self.process, self.log, self.deadline = process, log, deadline
        self.reason: str | None = None
        self.fatal_at: float | None = None
        self.done = threading.Event()
        self._offset = 0
        self._tail = ""

    def _saw_fatal(self) -> bool:
        try:
            with open(self.log, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read(1 << 22).decode(errors="replace")
                self._offset = handle.tell()
        except OSError:
            return False
        text = self._tail + chunk
        self._tail = text[-200:]
        return any(key in text for key in _FATAL)

    def run(self) -> None:
        while not self.done.wait(0.5) and self.process.poll() is None:
            now = time.monotonic()
            if self.fatal_at is None and self._saw_fatal():
                self.fatal_at = now
            if self.fatal_at is not None and now - self.fatal_at > DEATH_WAIT_S:
                self.reason = "hung in its signal handler after a fatal message; killed"
            elif now > self.deadline:
                self.reason = "still busy past the try's deadline; killed"
            if self.reason is not None:
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                return


def one_try(repo: Path, models: Sequence[str], target: str, pattern: str, traced: bool, bound_s: float,
            run_s: float, out: Path, shm_prefix: str, use_gdb: bool, log_verbose: bool,
            symbols: Symbols | None) -> TryResult:
    """Serve ``models`` (traced or not) and drive ``target`` with ``pattern`` until the server dies, stops
    answering, or ``bound_s`` seconds pass."""
    from serving_bench.calibrate.session import TRACE_ARGS, Session
    from serving_bench.serve.server import ServerOptions, TritonServer

    out.mkdir(parents=True, exist_ok=True)
    result = TryResult(traced, log=out / "server.log")
    trace_file = out / "trace.json"
    extra = [f"--backend-config=python,shm-region-prefix-name={shm_prefix}"]
    if traced:
        extra += list(TRACE_ARGS) + ["--trace-config", f"triton,file={trace_file}"]
    if log_verbose:
        extra.append("--log-verbose=1")
    server = TritonServer(repo, models=list(models), instances={m: 1 for m in models}, threads_per_instance=1,
                          options=ServerOptions(extra_args=tuple(extra), log_path=result.log))
    debugger = watchdog = None
    try:
        server.start()
        if use_gdb and traced:
            result.gdb = out / "gdb.txt"
            debugger = attach_gdb(server.pid, result.gdb)
        watchdog = Watchdog(server.process, result.log, time.monotonic() + bound_s + HANG_MARGIN_S)
        watchdog.start()
        session = Session(server.endpoints)  # load only: no execution logs or trace attached to the runs
        start = time.perf_counter()
        error: Exception | None = None
        try:
            while time.perf_counter() - start < bound_s and server.process.poll() is None:
                for rows, concurrency in PATTERNS[pattern]:
                    run = session.run({target: (rows, concurrency)}, run_s)
                    result.requests += len(run.latency[target])
                    if server.process.poll() is not None:
                        break
        except Exception as err:  # noqa: BLE001 - the driver's view of a dead server; diagnosed below
            error = err
        result.seconds = time.perf_counter() - start
        deadline = time.monotonic() + (DEATH_WAIT_S + 5.0 if error is not None else 0.0)
        while server.process.poll() is None and watchdog.reason is None and time.monotonic() < deadline:
            time.sleep(0.1)
        watchdog.done.set()
        watchdog.join(timeout=10.0)
        code = server.process.poll()
        if watchdog.reason is not None:
            result.outcome = "died" if watchdog.fatal_at is not None else "stopped answering"
            result.detail = watchdog.reason
        elif code is not None:
            result.outcome, result.exit_code = "died", code
        elif error is not None:
            result.outcome = classify_alive(server, result.log)
            result.detail = f"{type(error).__name__}: {str(error)[:300]}"
    except ServerError as err:  # did not start
        result.outcome, result.detail = "error", str(err)[:300]
    finally:
        if watchdog is not None:
            watchdog.done.set()
        server.stop()
        stop_process(debugger)
        remove_regions(shm_prefix)
        trace_file.unlink(missing_ok=True)  # nothing reads it; ~200 MB after a try that survives
    if result.crashed:
        try:
            result.site = crash_site(result.log.read_text(errors="replace"), symbols=symbols)
        except OSError:
            pass
    return result


def classify_alive(server, log: Path) -> str:
    """Outcome of a try whose closed loop failed while the server process still runs: ``died`` when its log
    already holds a fatal message (it hangs in its own signal handler: Triton's handler symbolises its stack with
    addr2line, which can deadlock on a corrupted heap), ``stopped answering`` when gRPC does not answer a liveness
    call within 5 s, else ``error`` (the failure was not the server's)."""
    import tritonclient.grpc as grpcclient

    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    if any(key in text for key in _FATAL):
        return "died"
    client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
    try:
        return "error" if client.is_server_live(client_timeout=5.0) else "stopped answering"
    except Exception:  # noqa: BLE001 - any failure to answer is the finding
        return "stopped answering"
    finally:
        client.close()


def describe(result: TryResult) -> str:
    """One line per try."""
    what = result.outcome
    if result.exit_code is not None and result.exit_code < 0:
        try:
            what += f" ({signal.Signals(-result.exit_code).name}, exit code {result.exit_code})"
        except ValueError:
            what += f" (exit code {result.exit_code})"
    elif result.exit_code is not None:
        what += f" (exit code {result.exit_code})"
    elif result.detail and result.outcome != "error":
        what += f" ({result.detail})"
    return f"{what} after {result.seconds:.1f} s and {result.requests:,} answered requests"


def summary_line(label: str, results: Sequence[TryResult]) -> str:
    crashed = [r for r in results if r.crashed]
    after = ", ".join(f"{r.seconds:.0f} s" for r in crashed)
    total = sum(r.requests for r in results)
    return (f"{label}: crashed in {len(crashed)} of {len(results)} tries"
            + (f" (after {after})" if crashed else "") + f"; {total:,} requests answered in all")


def main(argv: Sequence[str] | None = None) -> int:
    from serving_bench.calibrate.session import TRACE_ARGS
    from serving_bench.files import cache_dir
    from serving_bench.serve.install import find_tritonserver

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", default=str(cache_dir() / "repro-trace-crash" / "repo"),
                        help="model repository with the demo's tiny entries (exported there if missing)")
    parser.add_argument("--models", help="comma-separated entries to serve (default: the 6 tiny entries and "
                                         f"{COMBINER})")
    parser.add_argument("--model", default=COMBINER, help=f"the entry driven (default {COMBINER})")
    parser.add_argument("--pattern", choices=sorted(PATTERNS), default="batch-sizes",
                        help="batch-sizes: the per-batch-size phase that died (concurrency 1, 1/2/4/8 rows); "
                             "merged: concurrency 8 of 1-row requests (the per-request phase)")
    parser.add_argument("--tries", type=int, default=3, help="traced tries (default 3)")
    parser.add_argument("--untraced-tries", type=int, default=None,
                        help="untraced tries, each running the full bound (default: as many as --tries)")
    parser.add_argument("--bound-s", type=float, default=120.0, help="seconds per try at most (default 120)")
    parser.add_argument("--run-s", type=float, default=3.0,
                        help="seconds per closed-loop run (default 3, the demo's --profile-seconds)")
    parser.add_argument("--gdb", action="store_true", help="attach gdb to each traced server (gdb.txt per try)")
    parser.add_argument("--log-verbose", action="store_true", help="run the servers with --log-verbose=1")
    parser.add_argument("--out", default="results/repro_trace_crash", help="logs per try (default %(default)s)")
    args = parser.parse_args(argv)
    untraced_tries = args.tries if args.untraced_tries is None else args.untraced_tries
    if args.tries < 0 or untraced_tries < 0 or args.bound_s <= 0 or args.run_s <= 0:
        parser.error("tries must be >= 0 and seconds > 0")
    models = served_entries(args.models.split(",") if args.models else None)
    if args.model not in models:
        parser.error(f"--model {args.model} is not among the served entries {', '.join(models)}")

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    repo = Path(args.repo)
    ensure_repo(repo)
    install = find_tritonserver()
    symbols = Symbols(install.server_bin)
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    shm_prefix = f"serving_bench_repro_{os.getpid()}_"
    print(f"serving {', '.join(models)} from {repo}; driving {args.model} with pattern {args.pattern} "
          f"{PATTERNS[args.pattern]} (rows, concurrency), {args.run_s:g} s per run, at most {args.bound_s:g} s per "
          f"try; logs in {out}; shared memory {shm_prefix}*", flush=True)
    results: dict[bool, list[TryResult]] = {True: [], False: []}
    for traced, count in ((True, args.tries), (False, untraced_tries)):
        for k in range(count):
            label = "traced" if traced else "untraced"
            print(f"{label} try {k + 1}/{count} ...", flush=True)
            result = one_try(repo, models, args.model, args.pattern, traced, args.bound_s, args.run_s,
                             out / f"{label}-{k + 1}", shm_prefix, args.gdb, args.log_verbose, symbols)
            results[traced].append(result)
            print(f"  {describe(result)}" + (f" [{result.detail}]" if result.outcome == "error" else ""), flush=True)
            for line in result.site:
                print(f"    {line}", flush=True)
            if result.crashed:
                print(f"    server log: {result.log}" + (f"; gdb: {result.gdb}" if result.gdb else ""), flush=True)

    print()
    if args.tries:
        print(summary_line(f"with tracing ({' '.join(TRACE_ARGS)})", results[True]))
    if untraced_tries:
        print(summary_line("without tracing", results[False]))
    if any(r.crashed for r in results[True] + results[False]):
        print("reproduced" + (" -- WITHOUT tracing too" if any(r.crashed for r in results[False]) else ""))
    else:
        print("not reproduced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
