"""Authentication of the sidecar's gRPC services: every call carries an HMAC token made with the tag
key ring (``slo_core.wire.callauth``); a call without one, or with a stale or wrong one, is answered
``UNAUTHENTICATED`` before its handler runs (a Watch stream is never opened) and counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from slo_core.wire.callauth import METADATA_KEY, check_call_token

log = logging.getLogger(__name__)


class CallAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls whose ``x-slofleet-auth`` token is not valid for one of ``keys()``."""

    def __init__(
        self,
        keys: Callable[[], Sequence[bytes]],
        on_refused: Callable[[str, str], None] = lambda _method, _why: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys
        self.on_refused = on_refused
        self.clock = clock
        self.refused = 0

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        token = next((v for k, v in details.invocation_metadata or () if k == METADATA_KEY), None)
        if isinstance(token, bytes):
            token = token.decode("ascii", "replace")
        why = check_call_token(token, details.method, self.keys(), self.clock())
        handler = await continuation(details)
        if why is None or handler is None:
            return handler
        self.refused += 1
        self.on_refused(details.method, why)
        return _refusal(handler, details.method, why, self.refused)


def _refusal(handler: Any, method: str, why: str, count: int) -> Any:
    """A handler of the same shape as ``handler`` that only aborts with UNAUTHENTICATED."""

    async def refuse(_request: Any, context: Any) -> None:
        if count == 1 or count % 100 == 0:
            log.warning("gRPC %s from %s refused: %s (%d so far)", method, context.peer(), why, count)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"slofleet: {why}")

    if handler.request_streaming and handler.response_streaming:
        make = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        make = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        make = grpc.unary_stream_rpc_method_handler
    else:
        make = grpc.unary_unary_rpc_method_handler
    return make(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
