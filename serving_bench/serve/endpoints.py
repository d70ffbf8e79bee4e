"""Where a Triton server answers: its gRPC, HTTP and metrics addresses (:class:`Endpoints`), ours or an external
server's (``--url``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from serving_bench.errors import InputError
from serving_bench.serve.announce import announced

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Endpoints:
    """Addresses of one Triton server, each ``host:port``; ``guessed`` names those assumed, not known (``"http"``,
    ``"metrics"``: an external server's, at Triton's default layout), so errors can say so."""

    grpc_url: str
    http_url: str
    metrics_url: str
    guessed: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_url(cls, url: str, http_url: str | None = None, metrics_url: str | None = None) -> "Endpoints":
        """Endpoints of an external server from its gRPC ``host:port``.

        HTTP and metrics, unless given: those a live ``serving-bench serve`` on this machine announced for that gRPC
        address (:mod:`serving_bench.serve.announce`), else Triton's default layout, gRPC port - 1 and gRPC port + 1
        (8000 / 8001 / 8002), marked ``guessed``.
        """
        host, port = _host_port(url, "--url", "the server's gRPC address")
        if metrics_url is not None:
            metrics_url = "{}:{}".format(*_host_port(metrics_url, "--metrics-url", "the server's metrics address"))
        found = announced(host, port)
        if found is not None:
            return cls(f"{host}:{port}", http_url or found.http_url, metrics_url or found.metrics_url)
        guessed = tuple(name for name, given in (("http", http_url), ("metrics", metrics_url)) if given is None)
        return cls(f"{host}:{port}", http_url or f"{host}:{port - 1}", metrics_url or f"{host}:{port + 1}", guessed)

    def guess_note(self, name: str) -> str:
        """`` (guessed: ...)`` where ``name``'s address (``"http"``, ``"metrics"``) is only guessed, else ``""``."""
        if name not in self.guessed:
            return ""
        return f" (guessed: the gRPC port {'- 1' if name == 'http' else '+ 1'}, Triton's default layout)"


def _host_port(url: str, option: str, what: str) -> tuple[str, int]:
    match = re.fullmatch(r"(?:[a-z]+://)?([^:/\s]+):(\d{1,5})(?:/metrics)?/?", url.strip())
    if not match:
        raise InputError(option, None, f"{url!r}: expected {what} as host:port")
    return match.group(1), int(match.group(2))
