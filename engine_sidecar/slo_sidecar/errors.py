"""The sidecar's API errors and the one place they become OpenAI-shaped HTTP responses."""

from __future__ import annotations

from starlette.responses import JSONResponse

from slo_core.wire import openai


class APIError(openai.APIError):
    """An OpenAI-shaped error that also remembers the request's (tier, priority class) for metrics."""

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
        super().__init__(status, message, kind=kind, param=param, code=code, retry_after_s=retry_after_s)
        self.labels = ("-", "-")  # (tier, priority class) for metrics, once the request's tier is known


def overloaded(message: str, code: str, retry_after_s: float) -> APIError:
    return APIError(503, message, kind="overloaded_error", code=code, retry_after_s=retry_after_s)


def error_response(err: openai.APIError) -> JSONResponse:
    """The single place errors become HTTP responses (OpenAI error shape, Retry-After when known)."""
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers())


def error_event(err: openai.APIError) -> bytes:
    """A failure after streaming began: an SSE error event, then the end of the stream."""
    return openai.error_event(err.body())
