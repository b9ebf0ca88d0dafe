"""OpenAI's error object and server-sent-event framing, as every slofleet front door answers them.

An error is ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status beside it; a failure
after a stream began is one SSE event carrying that object, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
from typing import Any

SSE_PREFIX = b"data: "
SSE_END = b"\n\n"
DONE_PAYLOAD = b"[DONE]"
SSE_DONE = SSE_PREFIX + DONE_PAYLOAD + SSE_END


class APIError(Exception):
    """An error a client sees: HTTP status, OpenAI error type, the parameter to fix, a stable code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.code, self.retry_after_s = code, retry_after_s

    def body(self) -> dict[str, Any]:
        return error_body(self.message, kind=self.kind, param=self.param, code=self.code)

    def headers(self) -> dict[str, str]:
        """``Retry-After`` in whole seconds (at least 1) when the error says when to come back."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


def route_error(status: int, method: str, path: str, detail: str) -> APIError:
    """What an HTTP-level failure (no such route, wrong method, ...) is as an OpenAI error object."""
    path = path[:200]
    if status == 404:
        return APIError(404, f"no such route: {path}", code="not_found")
    if status == 405:
        return APIError(405, f"{method} is not allowed on {path}", code="method_not_allowed")
    return APIError(status, detail, code=str(status))


INTERNAL_ERROR = "internal error; it was logged"


def internal_error() -> APIError:
    """The catch-all's answer: an explicit 500 (the traceback goes to the log, never to the client)."""
    return APIError(500, INTERNAL_ERROR, kind="server_error", code="internal_error")


def error_body(
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | int | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def sse_event(payload: bytes) -> bytes:
    """One SSE event carrying ``payload`` (already-encoded JSON, or ``[DONE]``)."""
    return SSE_PREFIX + payload + SSE_END


def sse_json(obj: Any) -> bytes:
    return sse_event(json.dumps(obj, separators=(",", ":")).encode())


def error_event(body: dict[str, Any]) -> bytes:
    """A failure after streaming began: an SSE error event, then the end of the stream."""
    return sse_json(body) + SSE_DONE
