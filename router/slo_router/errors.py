"""The router's API errors and the one place they become OpenAI-shaped HTTP responses."""

from __future__ import annotations

from starlette.responses import JSONResponse

from slo_core.wire.openai import APIError

__all__ = ["APIError", "error_response"]


def error_response(err: APIError) -> JSONResponse:
    """The single place errors become HTTP responses (OpenAI error shape, Retry-After when known)."""
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers())
