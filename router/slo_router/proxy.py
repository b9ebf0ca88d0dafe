"""Forwarding one request to a pod: retries before the first byte, streaming relay, accounting.

Connect errors, 5xx and 503 (the pod's admission control found it infeasible) before the first byte
are retried on another pod, bounded and with backoff, and each failure feeds that pod's circuit
breaker. Once bytes flowed, a failure ends the stream with an explicit SSE error event. A client
disconnect closes the upstream response, which aborts the request in the pod.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx

from slo_core.wire import openai

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
# A chunk whose "text" or "content" is a non-empty string carries output (no JSON parse needed).
_HAS_TEXT = re.compile(rb'"(?:text|content)":\s*"(?!")')
CONNECT_TIMEOUT_S = 5.0


class UpstreamUnavailable(Exception):
    """The pod could not take the request (connect error or a retryable status before any byte)."""

    def __init__(
        self, reason: str, status: int | None = None, retry_after_s: float | None = None, kind: str = ""
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.retry_after_s = retry_after_s
        self.kind = kind or ("connect" if status is None else f"http_{status}")


@dataclass
class StreamStats:
    """What the router saw of a response: token delivery times and whether it completed."""

    start_s: float
    token_times_s: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    completed: bool = False
    error: str | None = None
    _partial: bytes = b""

    def observe_sse(self, data: bytes, now_s: float) -> None:
        """Parse whole lines of the SSE byte stream (a raw chunk may end mid-line)."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == openai.DONE_PAYLOAD:
                self.completed = self.error is None
                continue
            if b'"error"' not in payload and b'"usage"' not in payload:
                # the common token chunk: no JSON parse, just whether it carries text
                if _HAS_TEXT.search(payload):
                    self.token_times_s.append(now_s)
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            self._observe_chunk(chunk, now_s)

    def _observe_chunk(self, chunk: dict[str, object], now_s: float) -> None:
        if "error" in chunk:
            self.error = str(chunk["error"])
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            text = choice.get("text") if "text" in choice else delta.get("content")
            if text:
                self.token_times_s.append(now_s)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)

    def observe_json(self, body: dict[str, object], now_s: float) -> None:
        usage = body.get("usage")
        if isinstance(usage, dict):
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.token_times_s = [now_s] * self.completion_tokens
        self.completed = "error" not in body

    def delivered_times(self) -> list[float]:
        """One timestamp per output token; chunks carrying several tokens repeat their time."""
        n = self.completion_tokens
        times = self.token_times_s
        if n is None or n <= len(times) or not times:
            return times
        return times + [times[-1]] * (n - len(times))


def _retry_after(resp: httpx.Response) -> float | None:
    raw = resp.headers.get("retry-after")
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


async def open_upstream(
    client: httpx.AsyncClient, url: str, body: dict[str, object], headers: dict[str, str], timeout_s: float
) -> httpx.Response:
    """Send the request and wait for the status line; raises :class:`UpstreamUnavailable`."""
    req = client.build_request(
        "POST", url, json=body, headers=headers, timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)
    )
    try:
        resp = await client.send(req, stream=True)
    except httpx.ConnectTimeout:  # a swamped pod (or host) accepts slowly: not a reason to open its breaker
        raise UpstreamUnavailable("connect timed out", kind="connect_timeout") from None
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
        raise UpstreamUnavailable(f"connect failed: {type(exc).__name__}") from None
    if resp.status_code in RETRYABLE_STATUS:
        retry_after = _retry_after(resp)
        try:
            await resp.aread()
        except httpx.HTTPError:
            pass
        finally:
            await resp.aclose()
        raise UpstreamUnavailable(f"status {resp.status_code}", resp.status_code, retry_after)
    return resp


def error_event(message: str, code: int = 502) -> bytes:
    return openai.error_event(openai.error_body(message, kind="upstream_error", code=code))


async def relay_stream(
    resp: httpx.Response, stats: StreamStats, on_done: Callable[[StreamStats], None]
) -> AsyncIterator[bytes]:
    """Relay SSE bytes to the client; an upstream failure mid-stream becomes an error event."""
    try:
        async for chunk in resp.aiter_raw():
            stats.observe_sse(chunk, time.monotonic())
            yield chunk
        if not stats.completed and stats.error is None:  # closed cleanly but without [DONE]
            stats.error = "upstream stream ended early"
            yield error_event("the serving pod ended the stream early; the response is incomplete")
    except (TimeoutError, httpx.HTTPError) as exc:
        if not stats.completed:  # after [DONE] the answer is whole, whatever the connection does
            stats.error = f"upstream failed mid-stream: {type(exc).__name__}"
            log.warning("stream from %s broke: %s", resp.request.url.host, type(exc).__name__)
            yield error_event("the serving pod failed while streaming; the response is incomplete")
    except (asyncio.CancelledError, GeneratorExit):  # the client went away: close the upstream too
        # a client that hangs up right after [DONE] (as the openai client does) got everything
        if not stats.completed:
            stats.error = "client disconnected"
        raise
    finally:
        await resp.aclose()
        on_done(stats)
