"""The native sender: a small C++ program (``native/sender.cc``, built on first use or by ``scripts/build_sender.sh``) that does the
sending and stamping, while Python keeps everything else — the schedule, the payloads (serialized here, sent there
as bytes), the outcome arrays, the judging of failures and their texts (:mod:`serving_bench.load.outcomes`),
progress, liveness, stops and the records.

Why (measured: ``docs/load.md#drivers``): the Python sender spends 220–300 µs of CPU per request, most of it in grpcio's
Cython layer and in two threads handing the GIL to each other; on two shared cores that caps the open-loop rate
below perf_analyzer's. The native one sends the same bytes with gRPC C++'s generic stub from one timing thread and
stamps outcomes from one completion thread, without a GIL.

:class:`NativeSender` is one such process, driven like a sender process (``start``, ``is_alive``, ``join``,
``kill``; the driver's ``messages``, ``go``, ``t0_value`` and ``stop``). Its share goes through its stdin (the
protocol is described at the top of ``sender.cc``); its messages come back on its stdout and are read by a thread of
this process, which judges each failure as it arrives and tells the sender to stop when the judge says so (a dead
model instance: cancel at once). It runs in a process group of its own and ignores SIGINT and SIGTERM: the parent
handles them and says ``stop``; if the parent dies, its stdin closes and it cancels what is in flight and exits.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from serving_bench.errors import ServerError
from serving_bench.files import atomic_write_json, cache_dir
from serving_bench.load.infer_channel import STATUS_CODES
from serving_bench.load.outcomes import (ERROR, IN_FLIGHT, OK, Arrays, FailureJudge, dropped_error,
                                         unreachable_error)
from serving_bench.load.sender import Share, describe_failure

PROTOCOL = 1  # sender.cc: kProtocol; a binary that answers another number is stale
NATIVE_DIR = Path(__file__).with_name("native")
SOURCE = NATIVE_DIR / "sender.cc"
BINARY = NATIVE_DIR / "serving-bench-sender"  # a build output (git-ignored)
SENDERS = ("native", "python")
APT = "apt-get install g++ pkg-config libgrpc++-dev"


def build_note() -> Path:
    """Where a failed build is remembered (:func:`remembered_failure`): in the cache folder, never in the installed
    package."""
    return cache_dir() / "native-sender-build.json"


def _build_key() -> str:
    """What a build's outcome depends on that a user may change: the source and the compiler asked for."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return f"{digest} {os.environ.get('CXX', 'g++')}"


def remembered_failure() -> str | None:
    """Why the last build of this same source with this same compiler failed, where it did (None: not tried, or
    built). ``scripts/build_sender.sh`` tries again (after installing what was missing)."""
    try:
        note = json.loads(build_note().read_text())
    except (OSError, ValueError):
        return None
    return str(note.get("why")) if isinstance(note, dict) and note.get("key") == _build_key() else None


def build(force: bool = False) -> str | None:
    """Compile :data:`SOURCE` into :data:`BINARY` unless it is newer already (``force``: always). Returns ``None``
    when built, else why not (one line, also remembered in :func:`build_note`). ``CXX`` names the compiler (default
    ``g++``); the flags come from ``pkg-config grpc++`` (Debian's libgrpc++-dev). Takes ~6 s on two cores."""
    if not force and BINARY.is_file() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return None
    cxx = os.environ.get("CXX", "g++")
    try:
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "grpc++"], capture_output=True, text=True,
                               timeout=30)
    except OSError:
        return _build_failed(f"pkg-config is missing ({APT})")
    if flags.returncode != 0:
        return _build_failed(f"gRPC C++ is missing: pkg-config grpc++ failed ({APT})")
    tmp = BINARY.with_name(f"{BINARY.name}.tmp{os.getpid()}")
    try:
        compiled = subprocess.run([*shlex.split(cxx), "-std=c++17", "-O2", "-pthread", "-o", str(tmp), str(SOURCE),
                                   *shlex.split(flags.stdout)], capture_output=True, text=True, timeout=600)
    except OSError:
        return _build_failed(f"the C++ compiler {cxx!r} is missing ({APT})")
    if compiled.returncode != 0:
        tmp.unlink(missing_ok=True)
        first = next((line for line in compiled.stderr.splitlines() if "error" in line), compiled.stderr.strip())
        return _build_failed(f"{cxx} failed: {first[:200]}")
    tmp.replace(BINARY)  # atomic: a concurrent build or run sees the old binary or the new one
    build_note().unlink(missing_ok=True)
    return None


def _build_failed(why: str) -> str:
    try:
        atomic_write_json(build_note(), {"key": _build_key(), "why": why})
    except OSError:
        pass  # not remembered: the next run tries again
    return why


@dataclass(frozen=True)
class NativeCheck:
    """Whether the native sender runs here: ``problem`` (``None``, or why not, one line) and ``realtime`` (its timing
    and completion threads may run at realtime priority: root or CAP_SYS_NICE)."""

    problem: str | None
    realtime: bool = False


@functools.cache
def native_check() -> NativeCheck:
    """Build the binary if it is missing or older than its source, then run it once (``--protocol``): loadable,
    the protocol this module speaks, realtime permitted?"""
    if not BINARY.is_file() or BINARY.stat().st_mtime < SOURCE.stat().st_mtime:
        why = remembered_failure()
        if why:  # said once, when it failed: not tried (nor announced) again on every run
            return NativeCheck(f"the native sender could not be built: {why} (an earlier try; "
                               "scripts/build_sender.sh tries again)")
        print("serving-bench: building the native sender (once, ~6 s)", file=sys.stderr)
        why = build()
        if why:
            return NativeCheck(f"the native sender could not be built: {why}")
    try:
        answer = subprocess.run([str(BINARY), "--protocol"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as err:
        return NativeCheck(f"the native sender does not run: {err}")
    if answer.returncode != 0:
        tail = " ".join(answer.stderr.split())[-200:]
        return NativeCheck(f"the native sender does not run (exit code {answer.returncode}: {tail})")
    words = answer.stdout.split()
    if words[:1] != [str(PROTOCOL)]:
        return NativeCheck("the native sender is stale (another protocol); scripts/build_sender.sh --force rebuilds "
                           "it")
    return NativeCheck(None, realtime=words[1:2] == ["realtime"])


def choose_sender(requested: str | None) -> tuple[str, str]:
    """The sender to use and a one-line note saying which and why. ``requested``: ``"native"``, ``"python"``,
    ``"auto"`` or ``None`` (both: native where it builds and runs, python otherwise). Raises ``ValueError`` for an
    unknown name or a native sender that cannot run here (the message says why)."""
    requested = None if requested == "auto" else requested
    if requested not in (None, *SENDERS):
        raise ValueError(f"unknown sender {requested!r}; expected one of {', '.join(SENDERS)}")
    if requested == "python":
        return "python", "sender: python (asked for)"
    check = native_check()
    if check.problem:
        if requested == "native":
            raise ValueError(check.problem)
        return "python", f"sender: python ({check.problem})"
    return "native", ("sender: native, realtime priority for its timing" if check.realtime else
                      "sender: native, normal priority (realtime not permitted here: on a busy machine sends can "
                      "leave late)")


def share_header(share: Share, shm_name: str, n: int) -> tuple[bytes, list[bytes]]:
    """What a native sender reads on its stdin: the header and arrays (one bytes object), then the payloads."""
    rows = share.rows.astype(np.int64)
    models = int(max(share.model.max(initial=-1), max(share.concurrency, default=-1))) + 1
    concurrency = np.zeros(models, np.int32)
    for m, c in share.concurrency.items():
        concurrency[m] = c
    fields = {"url": share.url, "shm": shm_name, "n": n, "mode": share.mode,
              "cap": -1 if share.max_in_flight is None else share.max_in_flight, "on_cap": share.on_cap,
              "timeout_s": repr(share.timeout_s), "grace_s": repr(share.grace_s),
              "duration_s": repr(float(share.closed_duration_s)), "status_ok": OK, "status_error": ERROR,
              "status_in_flight": IN_FLIGHT, "rows": len(rows), "models": models, "warmup": len(share.warmup),
              "payloads": len(share.payloads)}
    text = f"serving-bench-share {PROTOCOL}\n" + "".join(f"{k}={v}\n" for k, v in fields.items()) + "\n"
    arrays = [rows, share.arrival_s[rows].astype(np.float64), share.payload[rows].astype(np.int32),
              share.model[rows].astype(np.int32), concurrency, np.asarray(share.warmup, np.int32),
              np.array([len(p) for p in share.payloads], np.int64)]
    return text.encode() + b"".join(a.tobytes() for a in arrays), share.payloads


class NativeSender:
    """One native sender process for ``share``, writing into ``arrays`` (the parent's view of the shared outcome
    arrays named ``shm_name``; the judge of failures writes there too) and reporting to the driver through ``messages`` (``("ready", None)``, ``("done", (errors, reason,
    cpu_s))``, ``("failed", text)``); it starts at ``t0_value.value`` once ``go`` is set and stops when ``stop`` is
    set."""

    def __init__(self, share: Share, arrays: Arrays, shm_name: str, messages: Any, go: threading.Event,
                 t0_value: Any, stop: threading.Event):
        self.share, self.arrays, self.shm_name = share, arrays, shm_name
        self.messages, self.go, self.t0_value, self.stop = messages, go, t0_value, stop
        self.process: subprocess.Popen | None = None
        self.judge = FailureJudge(share.timeout_s)
        self.errors: dict[int, str] = {}
        self.reason: str | None = None  # the first stop this side decided (the judge's, or the parent's)
        self.realtime = False  # its threads got realtime priority (known once it is ready)
        self.ended = threading.Event()
        self._write_lock = threading.Lock()
        self._stderr: IO[bytes] = tempfile.TemporaryFile()
        self._threads: list[threading.Thread] = []

    # -- the interface of a sender process ----------------------------------------------------------------------
    @property
    def ident(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        self.process = subprocess.Popen([str(BINARY)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._stderr, start_new_session=True)  # Ctrl-C to our group: not to it
        self._threads = [threading.Thread(target=self._read, name="serving-bench-native-reader", daemon=True),
                         threading.Thread(target=self._command, name="serving-bench-native-commands", daemon=True)]
        for t in self._threads:
            t.start()

    def is_alive(self) -> bool:
        return not self.ended.is_set()

    def join(self, timeout: float | None = None) -> None:
        self.ended.wait(timeout)
        if self.process is not None and self.ended.is_set():
            try:
                self.process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    # -- inside ---------------------------------------------------------------------------------------------------
    def _send(self, line: str) -> None:
        with self._write_lock:
            try:
                self.process.stdin.write(line.encode() + b"\n")
                self.process.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):  # it has exited: its end of the story comes from _read
                pass

    def _command(self) -> None:
        """Relay the driver's start and stop to the process."""
        while not self.go.wait(0.05):
            if self.ended.is_set():
                return
        if self.stop.is_set():
            self._stopped()
            return
        self._send(f"go {self.t0_value.value!r}")
        while not self.stop.wait(0.05):
            if self.ended.is_set():
                return
        self._stopped()

    def _stopped(self) -> None:
        self.reason = self.reason or "stopped"
        self._send("stop")

    def _read(self) -> None:
        """Feed the share, then turn the process's messages into the driver's, until it exits."""
        proc = self.process
        finished = False
        try:
            header, payloads = share_header(self.share, self.shm_name, len(self.arrays.status))
            with self._write_lock:
                try:
                    proc.stdin.write(header)
                    for p in payloads:
                        proc.stdin.write(p)
                    proc.stdin.flush()
                except BrokenPipeError:
                    pass  # it died before reading its share: the end of its stdout says so
            out = proc.stdout
            while True:
                line = out.readline()
                if not line:
                    break
                kind, *fields = line.split()
                if kind == b"R":
                    self.realtime = fields == [b"1"]
                    self.messages.put(("ready", None))
                elif kind == b"F":
                    row, code, oks, size = (int(f) for f in fields)
                    self._failed(row, code, oks, out.read(size).decode(errors="replace"))
                elif kind == b"D":
                    self.errors[int(fields[0])] = dropped_error(self.share.max_in_flight)
                elif kind == b"U":
                    code, size = (int(f) for f in fields)
                    details = out.read(size).decode(errors="replace")
                    name = STATUS_CODES[code].name if code in STATUS_CODES else str(code)
                    self.messages.put(("failed", describe_failure(
                        ServerError(unreachable_error(self.share.url, f"{name}: {details}")))))
                    finished = True
                elif kind == b"E":
                    cpu, size = float(fields[0]), int(fields[1])
                    reason = out.read(size).decode(errors="replace")
                    self.messages.put(("done", (self.errors, self.reason or reason or None, cpu)))
                    finished = True
                else:
                    raise RuntimeError(f"unexpected message {line[:80]!r}")
        except BaseException as err:  # never leave the driver waiting: report what broke
            if not finished:
                self.messages.put(("failed", f"the native sender's reader failed: {describe_failure(err)}"))
                finished = True
            self.kill()
        finally:
            if not finished:
                code = proc.wait()
                self.messages.put(("failed", f"the native sender exited (exit code {code}) without finishing: "
                                             f"{self._stderr_tail()}"))
            self._stderr.close()
            self.arrays = None  # a view of the parent's shared memory must not outlive the run (it could not close)
            self.ended.set()

    def _failed(self, row: int, code: int, oks: int, details: str) -> None:
        if oks:
            self.judge.answered_ok()
        failure = self.judge.judge(code, details)
        failure.record(self.arrays, self.errors, row)
        if failure.stop and (self.reason is None or failure.at_once):  # as the Python sender's _stop
            self.reason = self.reason or failure.stop
            self._send("cancel" if failure.at_once else "stop")

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        text = " ".join(self._stderr.read().decode(errors="replace").split())
        return text[-300:] or "no message"


if __name__ == "__main__":  # scripts/build_sender.sh
    problem = build(force="--force" in sys.argv[1:])
    if problem:
        sys.exit(f"serving-bench: the native sender was not built: {problem}")
