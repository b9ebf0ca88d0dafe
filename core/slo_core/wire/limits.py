"""Limits every front door enforces on a request before it is parsed, and the checks themselves.

The router and the sidecar read a body only after the caller is authenticated, and only up to
``max_body_bytes`` (a declared ``Content-Length`` above it is refused without reading a byte). The
JSON nesting depth is measured on the raw bytes before ``json.loads`` runs, so a deeply nested body
costs one linear scan, never a recursion. ``NaN``/``Infinity`` are refused: JSON has no such numbers.
Every failure is an :class:`~slo_core.wire.openai.APIError` with a 4xx status.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterable, Iterable
from dataclasses import dataclass
from typing import Any

from slo_core.wire.openai import APIError

MiB = 1 << 20
# request ids and other values a front door forwards as headers: printable ASCII, bounded
SAFE_TOKEN = re.compile(r"[A-Za-z0-9._:/@+=-]{1,128}")


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may be, before any of it is parsed (bytes, nesting levels, tokens)."""

    max_body_bytes: int = 4 * MiB
    max_header_bytes: int = 32 * 1024
    max_json_depth: int = 32
    max_tokens_limit: int = 1 << 20  # the largest max_tokens accepted when no model context is known

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes", "max_json_depth", "max_tokens_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


def check_headers(headers: Iterable[tuple[bytes, bytes]], limits: RequestLimits) -> None:
    """431 when the request's headers (names and values) together exceed the limit."""
    size = sum(len(k) + len(v) + 4 for k, v in headers)
    if size > limits.max_header_bytes:
        raise APIError(
            431,
            f"request headers are {size} bytes; this server accepts at most {limits.max_header_bytes}",
            code="headers_too_large",
        )


def _too_large(limits: RequestLimits) -> APIError:
    return APIError(
        413,
        f"request body exceeds {limits.max_body_bytes} bytes; send a smaller request",
        code="body_too_large",
    )


async def read_capped(
    chunks: AsyncIterable[bytes], content_length: str | None, limits: RequestLimits
) -> bytes:
    """The body, read only while it stays within the limit (413 otherwise, before reading the rest)."""
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise APIError(400, "Content-Length is not a number", code="invalid_request") from None
        if declared > limits.max_body_bytes:
            raise _too_large(limits)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise _too_large(limits)
        parts.append(chunk)
    return b"".join(parts)


# a whole JSON string (escapes included); what is left of the body after they are cut out is brackets,
# punctuation, numbers and literals, and only the brackets are kept
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(raw: bytes) -> int:
    """The deepest nesting of objects and arrays in ``raw`` (brackets inside strings do not count; an
    unterminated string runs to the end)."""
    outside = _STRING.sub(b"", raw).split(b'"', 1)[0]
    depth = deepest = 0
    for byte in outside.translate(None, _NOT_BRACKET):
        if byte in (0x7B, 0x5B):  # { [
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:20]} is out of range for a number")
    return value


def parse_json_object(raw: bytes, limits: RequestLimits) -> dict[str, Any]:
    """The body as a JSON object; 400 for bad JSON, too deep a nesting, NaN/Infinity, or a non-object."""
    depth = json_depth(raw)
    if depth > limits.max_json_depth:
        raise APIError(
            400,
            f"request body nests {depth} levels deep; at most {limits.max_json_depth} are accepted",
            code="invalid_json",
        )
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise APIError(400, f"request body is not valid JSON ({exc})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    return body


def token_count(body: dict[str, Any], name: str, limit: int) -> int | None:
    """A positive integer field such as ``max_tokens`` (None when absent), at most ``limit``."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 1e3 is how some clients write 1000
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise APIError(400, f"'{name}' must be a positive integer, got {_short(value)}", param=name)
    if value > limit:
        raise APIError(
            400,
            f"'{name}' is {_short(value)}; this model's context allows at most {limit} tokens: lower {name}",
            param=name,
            code="context_length_exceeded",
        )
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
