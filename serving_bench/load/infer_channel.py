"""The sender's transport: Triton ``ModelInfer`` calls started on gRPC core's completion queue, answered by whoever
polls it.

:meth:`InferChannel.start` begins a unary call with pre-serialized bytes and returns at once; the answer comes out
of :meth:`InferChannel.next` (blocking, in the thread that polls) as ``(tag, status code, details)``. One poller per
channel. Nothing else is created per call: no coroutine or task (``grpc.aio``), no condition variable, rendezvous
object or callback list (the sync channel's ``future()``), whose per-call Python work dominated the sender's CPU
(measured: ``docs/load.md#drivers``).

This is the same Cython layer (``grpc._cython.cygrpc``: ``integrated_call`` / ``next_call_event``) that grpcio's own
sync channel drives for ``future()``; it is not a public API, so grpcio is pinned in ``setup.cfg`` and
:func:`check_transport` says plainly when the installed grpcio lacks it. Connecting, readiness and blocking calls
(the warm-up) use the public ``grpc`` API of the same channel.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import grpc
from grpc._cython import cygrpc  # grpcio's Cython layer (not a public API: see check_transport)

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
LIVE_METHOD = "/inference.GRPCInferenceService/ServerLive"

#: gRPC status code (int) -> grpc.StatusCode
STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
OK_CODE = grpc.StatusCode.OK.value[0]


def _cygrpc() -> Any:
    return cygrpc


def check_transport() -> None:
    """Raise ``RuntimeError`` naming the grpcio version when its Cython layer lacks what the sender uses."""
    cygrpc = _cygrpc()
    needed = {"Channel": ("integrated_call", "next_call_event", "get_registered_call_handle"),
              "IntegratedCall": ("cancel",), "ReceiveStatusOnClientOperation": ("code", "details")}
    missing = [f"{cls}.{attr}" for cls, attrs in needed.items() for attr in attrs
               if not hasattr(getattr(cygrpc, cls, None), attr)]
    if missing:
        raise RuntimeError(f"grpcio {grpc.__version__} lacks {', '.join(missing)} (grpc._cython.cygrpc); install the "
                           "grpcio pinned in setup.cfg")


class InferChannel:
    """One insecure gRPC channel to Triton at ``url`` (``host:port``). :meth:`start` may be called from any thread;
    :meth:`next` from exactly one (the poller). Close only when nothing is in flight and the poller has stopped
    (a call left in flight makes ``close`` wait for a poll that never comes)."""

    def __init__(self, url: str, options: Sequence[tuple[str, Any]] = ()):
        check_transport()
        cygrpc = _cygrpc()
        self.channel = grpc.insecure_channel(url, options=list(options))
        self._core = self.channel._channel  # the cygrpc.Channel under the public one
        self._infer = INFER_METHOD.encode()
        self._live = LIVE_METHOD.encode()
        self._infer_handle = self._core.get_registered_call_handle(self._infer)
        self._live_handle = self._core.get_registered_call_handle(self._live)
        self._propagate = cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS
        self._ops = (cygrpc.SendInitialMetadataOperation, cygrpc.SendMessageOperation,
                     cygrpc.SendCloseFromClientOperation, cygrpc.ReceiveInitialMetadataOperation,
                     cygrpc.ReceiveMessageOperation, cygrpc.ReceiveStatusOnClientOperation)
        self._complete = cygrpc.CompletionType.operation_complete
        self._shutdown = cygrpc.CompletionType.queue_shutdown
        self._cancelled = cygrpc.StatusCode.cancelled

    # -- public API, before the clock ----------------------------------------------------------------------------
    def ready(self, timeout_s: float) -> None:
        """Wait until the channel is connected (raises ``grpc.FutureTimeoutError``)."""
        grpc.channel_ready_future(self.channel).result(timeout=timeout_s)

    def infer_blocking(self, payload: bytes, timeout_s: float) -> bytes:
        """One blocking ``ModelInfer`` (raises ``grpc.RpcError``)."""
        rpc = self.channel.unary_unary(INFER_METHOD, request_serializer=None, response_deserializer=None)
        return rpc(payload, timeout=timeout_s)

    # -- the hot path ---------------------------------------------------------------------------------------------
    def start(self, payload: bytes, timeout_s: float, tag: Any) -> Any:
        """Start ``ModelInfer(payload)`` with a deadline ``timeout_s`` from now; its outcome comes out of
        :meth:`next` with ``tag``. Returns the call (for :meth:`cancel`); raises ``ValueError`` when the channel
        is closed or the call cannot start."""
        return self._call(self._infer, self._infer_handle, payload, timeout_s, tag)

    def wake(self, tag: Any, timeout_s: float = 1.0) -> None:
        """Start a ``ServerLive`` call whose outcome, with ``tag``, wakes the poller (it answers or fails fast)."""
        self._call(self._live, self._live_handle, b"", timeout_s, tag)

    def _call(self, method: bytes, handle: Any, payload: bytes, timeout_s: float, tag: Any) -> Any:
        smd, smsg, close, rmd, rmsg, rstatus = self._ops
        ops = (smd(None, 0), smsg(payload, 0), close(0), rmd(0), rmsg(0), rstatus(0))
        return self._core.integrated_call(self._propagate, method, None, time.time() + timeout_s, None, None,
                                          ((ops, tag),), None, handle)

    def next(self) -> tuple[Any, int, str] | None:
        """Block until a call finishes: ``(tag, status code as int, details)``; ``None`` for a queue timeout (only
        with grpc's fork support enabled); raises ``RuntimeError`` when the queue shut down."""
        event = self._core.next_call_event()
        if event.completion_type != self._complete:
            if event.completion_type == self._shutdown:
                raise RuntimeError("the channel's completion queue shut down")
            return None
        status = event.batch_operations[-1]
        return event.tag, status.code(), status.details()

    def cancel(self, call: Any, details: str) -> None:
        """Cancel a started call (no-op when it already finished); its outcome still comes out of :meth:`next`."""
        call.cancel(self._cancelled, details)

    def close(self) -> None:
        self.channel.close()
