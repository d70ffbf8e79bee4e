"""Where ``serving-bench serve`` tells its endpoints, so that a later ``--url`` finds them.

Triton's gRPC API does not say on which ports its HTTP and metrics services listen, and ``serve`` picks free ports,
so a client given only the gRPC address would have to guess them (Triton's default layout puts them at the gRPC port
- 1 and + 1). ``serve`` therefore writes one small JSON file per running server, ``servers/<grpc port>.json`` in the
cache folder: the three addresses, the pid of the tritonserver process, and when it started; it removes the file when
it stops. :func:`announced` reads it back for a gRPC address on this machine, and only while that process lives.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from serving_bench.files import atomic_write_json, cache_dir

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::")


@dataclass(frozen=True)
class Announcement:
    """A running ``serve``'s endpoints (``host:port`` each) and its tritonserver's pid."""

    grpc_url: str
    http_url: str
    metrics_url: str
    pid: int


def announcement_path(grpc_port: int) -> Path:
    return cache_dir() / "servers" / f"{int(grpc_port)}.json"


def announce(grpc_url: str, http_url: str, metrics_url: str, pid: int) -> Path:
    """Write the announcement of a server that listens on ``grpc_url`` (returns its path, for :func:`withdraw`)."""
    port = int(grpc_url.rsplit(":", 1)[1])
    return atomic_write_json(announcement_path(port), {"grpc_url": grpc_url, "http_url": http_url,
                                                       "metrics_url": metrics_url, "pid": pid,
                                                       "since": time.strftime("%Y-%m-%d %H:%M:%S")})


def withdraw(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def announced(host: str, port: int) -> Announcement | None:
    """The announcement of the server whose gRPC service is at ``host:port``, where ``host`` is this machine and a
    live ``serve`` announced that port; None otherwise (another machine, none announced, or its process is gone)."""
    if host not in LOCAL_HOSTS:
        return None
    return _read(announcement_path(port))


def other_service(host: str, port: int) -> str | None:
    """Where ``host:port`` (on this machine) is the HTTP or metrics port of a live announced server: a clause naming
    it and that server's gRPC address (what ``--url`` takes); None otherwise."""
    if host not in LOCAL_HOSTS:
        return None
    for path in sorted((cache_dir() / "servers").glob("*.json")):
        found = _read(path)
        for name in ("http", "metrics"):
            if found is not None and getattr(found, f"{name}_url").rsplit(":", 1)[1] == str(port):
                return (f"{host}:{port} is the {name} port of the server serve started (pid {found.pid}); its gRPC "
                        f"address is {found.grpc_url}")
    return None


def _read(path: Path) -> Announcement | None:
    """The announcement in ``path`` while its server's process lives, else None."""
    try:
        facts = json.loads(path.read_text())
        found = Announcement(str(facts["grpc_url"]), str(facts["http_url"]), str(facts["metrics_url"]),
                             int(facts["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(found.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return found
