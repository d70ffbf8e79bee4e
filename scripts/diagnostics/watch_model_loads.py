"""Which call does a model load that never finishes hang in? Watches every running tritonserver started by
serving-bench; once one's log (its stdout) shows a model whose instances began initializing and that neither loaded
nor failed, and the log has not changed for ``--idle-s`` seconds, writes its log's tail and the stacks of the server
and of every process under it (gdb: native threads, then Python's where gdb has its helpers) to
``OUT/stuck_load_<pid>.txt``, once per server. Runs until interrupted (Ctrl-C).

    .venv/bin/python scripts/diagnostics/watch_model_loads.py [--idle-s 20] [--out /tmp]
    # beside, e.g.: make test   (docs/notes/tests.md: 1 of 11 parallel runs met a load that hung; the server gives
    # such a load up after 45 s still (serve/load_watch.py), so keep --idle-s below that)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving_bench.serve.load_watch import pending_models  # noqa: E402

REPO_ARG = re.compile(r"--model-repository=(\S+)/repo\b")


def stuck(log_text: str, unchanged_s: float, idle_s: float) -> bool:
    """Whether a server log says a model load hangs: a model is pending (:func:`pending_models`: an instance
    initializing, neither loaded nor failed) and the log has not changed for at least ``idle_s`` seconds
    (``unchanged_s``: since its last write)."""
    return bool(pending_models(log_text)) and unchanged_s >= idle_s


def dump(server: psutil.Process, log: Path, out: Path) -> Path:
    """The log's tail and the stacks of the server and each process under it into ``out/stuck_load_<pid>.txt``."""
    path = out / f"stuck_load_{server.pid}.txt"
    with path.open("w") as f:
        f.write(log.read_text(errors="replace")[-4000:] + "\n")
        for child in [server, *server.children(recursive=True)]:
            f.write(f"\n===== {child.pid} {' '.join(child.cmdline())[:300]}\n")
            f.flush()
            r = subprocess.run(["gdb", "-p", str(child.pid), "-batch", "-ex", "thread apply all bt", "-ex", "py-bt"],
                               capture_output=True, text=True, timeout=120)
            f.write(r.stdout[-30000:] + r.stderr[-2000:])
    return path


def watch(idle_s: float, out: Path, every_s: float = 10.0) -> None:
    seen: set[int] = set()
    while True:
        for proc in psutil.process_iter(["pid", "name", "cmdline"]):
            try:
                found = REPO_ARG.search(" ".join(proc.info["cmdline"] or ()))
                if proc.info["name"] != "tritonserver" or proc.pid in seen or not found:
                    continue
                log = Path(os.readlink(f"/proc/{proc.pid}/fd/1"))  # the server writes its log to its stdout
                if log.is_file() and stuck(log.read_text(errors="replace"), time.time() - log.stat().st_mtime, idle_s):
                    seen.add(proc.pid)
                    print(f"server {proc.pid}: a load stuck for {idle_s:g} s: {dump(proc, log, out)}", flush=True)
            except (psutil.Error, OSError, subprocess.TimeoutExpired):
                continue
        time.sleep(every_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-s", type=float, default=20.0, help="seconds a log must stay unchanged (default 20)")
    parser.add_argument("--out", default="/tmp", help="folder for the dumps (default /tmp)")
    args = parser.parse_args(argv)
    if not args.idle_s > 0:
        print(f"--idle-s: expected a positive number of seconds, got {args.idle_s:g}", file=sys.stderr)
        return 2
    if not Path(args.out).is_dir():
        print(f"--out: {args.out}: not a folder", file=sys.stderr)
        return 2
    if shutil.which("gdb") is None:
        print("gdb: not installed (apt-get install gdb)", file=sys.stderr)
        return 2
    try:
        watch(args.idle_s, Path(args.out))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
