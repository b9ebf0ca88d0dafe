"""The router's API errors and the one place they become OpenAI-shaped HTTP responses."""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from slo_core.wire.openai import APIError, internal_error, route_error

__all__ = ["APIError", "error_response", "exception_handlers", "internal_error_response"]

log = logging.getLogger(__name__)


def error_response(err: APIError) -> JSONResponse:
    """The single place errors become HTTP responses (OpenAI error shape, Retry-After when known)."""
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers())


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
