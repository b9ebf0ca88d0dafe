"""The sidecar's API errors and the one place they become OpenAI-shaped HTTP responses."""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from slo_core.wire import openai
from slo_core.wire.openai import internal_error, route_error

log = logging.getLogger(__name__)


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


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes (404) and wrong methods (405) as OpenAI error objects, not plain text."""
    assert isinstance(exc, HTTPException)
    err = route_error(exc.status_code, request.method, request.url.path, str(exc.detail))
    response = error_response(err)
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


async def internal_error_response(request: Request, exc: Exception) -> Response:
    """The catch-all: a bug becomes an explicit OpenAI-shaped 500 and a logged traceback."""
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(internal_error())


def exception_handlers() -> dict[Any, Any]:
    return {HTTPException: _http_error, Exception: internal_error_response}
