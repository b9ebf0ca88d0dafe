"""The sidecar's API errors and the one place they become OpenAI-shaped HTTP responses."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse


class APIError(Exception):
    """An error a client sees: HTTP status, OpenAI error type, the parameter to fix, a stable code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.code, self.retry_after_s = code, retry_after_s
        self.labels = ("-", "-")  # (tier, priority class) for metrics, once the request's tier is known

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def overloaded(message: str, code: str, retry_after_s: float) -> APIError:
    return APIError(503, message, kind="overloaded_error", code=code, retry_after_s=retry_after_s)


def error_response(err: APIError) -> JSONResponse:
    """The single place errors become HTTP responses (OpenAI error shape, Retry-After when known)."""
    headers = {}
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(err.retry_after_s)))
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def error_event(err: APIError) -> bytes:
    """A failure after streaming began: an SSE error event, then the end of the stream."""
    return b"data: " + json.dumps(err.body()).encode() + b"\n\ndata: [DONE]\n\n"
