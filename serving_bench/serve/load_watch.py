"""A model load that hangs while the server starts: a model whose instances began initializing (Triton logs
``ModelInstanceInitialize``) and that neither loaded nor failed, while the server's log stays unchanged and its
processes (the server, its python-backend stubs) use next to no CPU. A load that progresses uses CPU (imports, the
runtime, the weights); one that waits on a lock does not. Triton 2.51's python backend has such hangs on record
(upstream issues 5211 and 4537: a stub launch or initialization that never answers), and one met this project's
parallel test run (docs/notes/tests.md). :class:`TritonServer` starts a new server when one is found."""

from __future__ import annotations

import re
import time
from typing import Callable

import psutil

INITIALIZING = re.compile(r"ModelInstanceInitialize: (\S+?)_\d+_\d+\b")  # an instance is "<model>_<group>_<index>"
FINISHED = re.compile(r"(?:successfully loaded|failed to load) '([^']+)'")
IDLE_S = 45.0  # how long the log and the processes must stay still
CPU_S = 0.5  # the CPU seconds the whole process tree may use in that time and still count as still


def pending_models(log_text: str) -> set[str]:
    """The models whose instances began initializing and that have neither loaded nor failed, by the server log."""
    return set(INITIALIZING.findall(log_text)) - set(FINISHED.findall(log_text))


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and every process under it; 0 where it is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


class LoadWatch:
    """Call :meth:`hung` while waiting for a server to become ready; it answers the models whose load hangs (empty
    while none does). Looks at most every ``every_s`` seconds; ``idle_s`` and ``cpu_s`` (None: :data:`IDLE_S`,
    :data:`CPU_S`) say what counts as still."""

    def __init__(self, idle_s: float | None = None, cpu_s: float | None = None, every_s: float = 1.0):
        self.idle_s = IDLE_S if idle_s is None else idle_s
        self.cpu_s = CPU_S if cpu_s is None else cpu_s
        self.every_s = every_s
        self._checked = float("-inf")
        self._still_since: tuple[float, int, float] | None = None  # (when, log size, tree CPU) as stillness began

    def hung(self, pid: int, read_log: Callable[[], str]) -> set[str]:
        """The models whose load hangs in server ``pid``; ``read_log()`` gives its log since its launch (read only
        when this looks, at most every ``every_s`` seconds)."""
        now = time.monotonic()
        if now - self._checked < self.every_s:
            return set()
        self._checked = now
        log_text = read_log()
        pending = pending_models(log_text)
        if not pending:
            self._still_since = None
            return set()
        cpu = tree_cpu_s(pid)
        start = self._still_since
        if start is None or len(log_text) != start[1] or cpu - start[2] > self.cpu_s:
            self._still_since = (now, len(log_text), cpu)  # it moved: stillness starts again
            return set()
        return pending if now - start[0] >= self.idle_s else set()
