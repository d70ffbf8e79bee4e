"""One error type for bad user input, so every command reports it the same way.

The contract (README, "Bad input"): one line naming the file, the field and what was expected; the CLI prints it and
exits with status 2, having written nothing.
"""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad user input: ``<file>: <field>: <problem>`` on one line.

    ``source`` is the file (or command-line option) the value came from, ``field`` the dotted field path inside it
    (with ``line N`` where known), ``expected`` what a valid value looks like.
    """

    def __init__(self, source: str | Path | None, field: str | None, expected: str):
        self.source = str(source) if source is not None else None
        self.field = field
        self.expected = expected
        super().__init__(self.line())

    def line(self) -> str:
        parts = [p for p in (self.source, self.field) if p]
        text = " ".join(str(self.expected).split())  # always one line
        return ": ".join(parts + [text])


def require_count(option: str, value: int | None, minimum: int = 1) -> None:
    """An :class:`InputError` naming the command-line ``option`` where its ``value`` (None: not given) is below
    ``minimum``."""
    if value is not None and value < minimum:
        raise InputError(option, str(value), f"expected an integer >= {minimum}")


class OutputError(Exception):
    """Results that could not be written where asked although the folder was checked before the run (the disk
    filled, the folder was removed or made read-only meanwhile). The message names the folder, the reason and where
    what was measured was saved instead, marked partial; the CLI prints it on one line and exits 4."""


class ServerError(RuntimeError):
    """The Triton server failed to start, died, or refused a model; the message names its log file, and
    ``log_path`` is that file where the server was ours (None otherwise)."""

    def __init__(self, message: str, log_path=None):
        super().__init__(message)
        self.log_path = log_path


class ServerDied(ServerError):
    """The server process we started died while in use (a crash, a kill): the work can resume on a new one."""
