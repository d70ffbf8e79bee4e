"""Observations as JSON lines, so an interrupted search resumes without redoing work.

Line 1 is a header ``{"kind": "header", "search": {...}}`` describing the search (space, objective, SLOs, load);
every further line is one observation ``{"kind": "observation", "key": ..., "params": ..., "result": ...}``, appended
and flushed (fsync) as soon as it is known. On resume the header must match the new search, or it is an
:class:`InputError` (a checkpoint of another search is never mixed in); a last line cut short by a crash is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

from serving_bench.errors import InputError
from serving_bench.files import atomic_write_text
from serving_bench.profiles.importers import H200_CSV


class Checkpoint:
    """Append-only observation log at ``path`` for the search described by ``header`` (JSON-able)."""

    def __init__(self, path: str | Path, header: dict):
        self.path = Path(path)
        self.header = json.loads(json.dumps(header, sort_keys=True))

    def load(self) -> list[dict]:
        """Earlier observations of this same search (empty when there is no file yet)."""
        if not self.path.is_file():
            return []
        lines = self.path.read_text().splitlines()
        out: list[dict] = []
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):  # cut short by an interruption: that evaluation is redone
                    break
                raise InputError(self.path, f"line {number}", "malformed JSON; expected one observation per line") from None
            if number == 1:
                if row.get("kind") != "header":
                    raise InputError(self.path, "line 1", "expected a tune checkpoint header")
                if row.get("search") != self.header:
                    raise InputError(self.path, "header", "checkpoint of a different search (space, objective, SLOs or"
                                                          " load differ); use another --out or pass --restart")
                continue
            if row.get("kind") == "observation":
                out.append(row)
        return out

    def start(self, fresh: bool = False) -> None:
        """Create the file with its header (``fresh`` discards an existing one)."""
        if fresh or not self.path.is_file() or self.path.stat().st_size == 0:
            atomic_write_text(self.path, json.dumps({"kind": "header", "search": self.header}, sort_keys=True) + "\n")
        else:
            self._repair_tail()

    def _repair_tail(self) -> None:
        """Drop a partial last line so appends start on a fresh line."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as fh:
                fh.truncate(data.rfind(b"\n") + 1)

    def append(self, key: str, params: dict, result: dict) -> None:
        row = {"kind": "observation", "key": key, "params": params, "result": result}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def __iter__(self) -> Iterator[dict]:
        return iter(self.load())


def file_id(path: str | Path) -> str:
    """Name and content hash of a file (a checkpoint is only resumed with the same profile)."""
    if str(path).startswith("builtin:"):
        return f"{path}:{hashlib.sha256(H200_CSV.read_bytes()).hexdigest()[:16]}"
    path = Path(path)
    return f"{path.name}:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
