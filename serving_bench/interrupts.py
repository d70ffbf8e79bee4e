"""Ctrl-C (SIGINT) and SIGTERM as a request to stop, not an exception at an arbitrary line.

A ``KeyboardInterrupt`` raised between two lines of a run (while senders start, while records are assembled, while
results are written) loses what was measured. Inside :func:`deferred_interrupts` the signals are recorded instead;
the code inside checks ``signals.reason`` (or gets called back) at the points where stopping is safe, and finishes
what it must: records of everything sent, results written, servers stopped.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, ContextManager, Iterator

NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C or SIGTERM after it finished its bookkeeping: ``records`` holds everything it sent
    (marked partial). Callers that keep partial results catch it; to the others it is the usual KeyboardInterrupt."""

    def __init__(self, records):
        super().__init__(records.info.stop_reason)
        self.records = records


class Signals:
    """What arrived inside the block: ``reason`` (``"interrupted (Ctrl-C)"`` / ``"interrupted (SIGTERM)"``, or None)."""

    def __init__(self, on_signal: Callable[[str], None] | None):
        self.reason: str | None = None
        self.on_signal = on_signal

    def __call__(self, signum, _frame) -> None:
        self.reason = self.reason or f"interrupted ({NAMES.get(signum, signum)})"
        if self.on_signal is not None:
            self.on_signal(self.reason)


@contextlib.contextmanager
def deferred_interrupts(on_signal: Callable[[str], None] | None = None) -> Iterator[Signals]:
    """Record SIGINT and SIGTERM inside the block (``on_signal(reason)`` is called from the handler: keep it to
    setting an event); the previous handlers come back at the end. Signals reach only the main thread, so elsewhere
    this records nothing and changes nothing. A signal to the whole process group reaches child processes too:
    those that must finish cleanly ignore SIGINT themselves."""
    signals = Signals(on_signal)
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    previous = {sig: signal.signal(sig, signals) for sig in NAMES}
    try:
        yield signals
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Terminated(KeyboardInterrupt):
    """SIGTERM where nothing defers it, raised in the main thread: the program unwinds as on Ctrl-C (servers
    stopped, worker pools shut down, checkpoints left whole) instead of dying at the line it was on."""


@contextlib.contextmanager
def raise_on_signal(signals: tuple[int, ...], raised: Callable[[str], BaseException]) -> Iterator[None]:
    """Inside the block the first of ``signals`` raises ``raised(name)`` (``name`` as ``"SIGTERM"``) in the main
    thread and later ones are ignored while it unwinds; blocks that defer signals themselves
    (:func:`deferred_interrupts`) take over inside them. The previous handlers come back at the end; outside the main
    thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = threading.Event()

    def handler(signum, _frame) -> None:
        if not fired.is_set():
            fired.set()
            raise raised(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def sigterm_unwinds() -> ContextManager[None]:
    """SIGTERM raises :class:`Terminated` inside the block (:func:`raise_on_signal`): the entry point's default."""
    return raise_on_signal((signal.SIGTERM,), Terminated)
