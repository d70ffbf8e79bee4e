"""The python backend's shared-memory regions (``/dev/shm``, one per model instance), named per server so they can be
removed when the server stops however it ended, and regions of servers whose starting process is dead removed when
the next one starts."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "serving_bench_pb_"  # + "<pid of the starting process>_<server number>_"; the backend appends a uuid
_SERVER_NUMBERS = itertools.count()


def shm_prefix(number: int, pid: int | None = None) -> str:
    """The python backend's shared-memory region prefix of server ``number`` started by process ``pid``."""
    return f"{SHM_PREFIX}{os.getpid() if pid is None else pid}_{number}_"


def next_shm_prefix() -> str:
    """The prefix for the next server this process starts."""
    return shm_prefix(next(_SERVER_NUMBERS))


def remove_shm_regions(prefix: str) -> int:
    """Remove the shared-memory regions whose names start with ``prefix``; return how many."""
    return _unlink(SHM_DIR.glob(f"{prefix}*") if SHM_DIR.is_dir() else ())


def remove_orphaned_shm_regions() -> int:
    """Remove the regions of servers whose starting process no longer exists (killed before it could clean up)."""
    def orphaned(path: Path) -> bool:
        pid = path.name[len(SHM_PREFIX):].split("_", 1)[0]
        return pid.isdigit() and not _process_exists(int(pid))

    return _unlink(p for p in (SHM_DIR.glob(f"{SHM_PREFIX}*") if SHM_DIR.is_dir() else ()) if orphaned(p))


def _unlink(paths) -> int:
    removed = 0
    for path in paths:
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
