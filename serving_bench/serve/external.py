"""A Triton server somebody else runs (``--url``): nothing is started or stopped, only asked."""

from __future__ import annotations

import contextlib
from typing import Iterator

from serving_bench.errors import ServerError
from serving_bench.serve.announce import other_service
from serving_bench.serve.control import Control
from serving_bench.serve.endpoints import Endpoints


class ExternalServer:
    """A Triton server somebody else runs (``--url host:port``, its gRPC address): the same interface as
    :class:`TritonServer` (``endpoints``, ``pid`` = None, ``check_alive``, ``guard``, ``served_models``, context
    manager) so every command can take either; entering checks it is ready, nothing is started or stopped."""

    def __init__(self, url: str | Endpoints, *, timeout_s: float = 5.0, metrics_url: str | None = None):
        self.endpoints = url if isinstance(url, Endpoints) else Endpoints.from_url(url, metrics_url=metrics_url)
        self.timeout_s = timeout_s
        self.served_models: list[str] = []
        self.process = None
        self.pid = None
        self.log_path = None

    def __enter__(self) -> "ExternalServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "ExternalServer":
        """Check the server is ready and list its ready models; :class:`ServerError` naming the URL if not."""
        self.check_alive(ready=True)
        with Control(self.endpoints.grpc_url, timeout_s=self.timeout_s) as control:
            try:
                self.served_models = control.served_models()
            except ServerError:
                self.served_models = []  # the repository extension may be restricted; the models stay unknown
        return self

    def stop(self, timeout_s: float = 0.0) -> None:
        """Nothing to stop: the server is not ours."""

    def check_alive(self, ready: bool = False) -> None:
        """Raise :class:`ServerError` naming the URL unless the server answers ``live`` (or ``ready``) over gRPC."""
        what = "ready" if ready else "live"
        with Control(self.endpoints.grpc_url, timeout_s=self.timeout_s) as control:
            answered = control.ready() if ready else control.live()
        if not answered:
            host, port = self.endpoints.grpc_url.rsplit(":", 1)
            hint = other_service(host, int(port))
            raise ServerError(f"Triton at --url {self.endpoints.grpc_url} is not answering: no '{what}' from its "
                              "gRPC health service" + (f" ({hint})" if hint else ""))

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Turn a client error inside the block into :class:`ServerError` naming the URL when the server is gone."""
        try:
            yield
        except ServerError:
            raise
        except Exception as err:
            try:
                self.check_alive()
            except ServerError as dead:
                raise ServerError(f"{dead} [{type(err).__name__} while in use]", log_path=dead.log_path) from err
            raise
