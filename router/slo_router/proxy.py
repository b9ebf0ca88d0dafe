"""Forwarding one request to a pod: retries before the first byte, a lean streaming relay, accounting.

The upstream client is :mod:`slo_net.upstream` (httptools on the event loop: the request leaves in
one write, the body is relayed as the socket delivers it; bench/path_overhead.py measured it against
aiohttp's client and httpx, which cost more CPU per request and per chunk). Connect errors, 5xx and
503 (the pod's admission control found it infeasible) before the first byte are retried on another
pod, bounded and with backoff, and each failure feeds that pod's circuit breaker. Once bytes flowed,
a failure ends the stream with an explicit SSE error event. A client disconnect at any point closes
the upstream response, which aborts the request in the pod.

Token accounting never JSON-parses a token chunk: one regular expression finds each event's output
text (its length in bytes, not its content), and the engine's final ``usage`` spreads the exact
token count over the events in proportion to their text, so a chunk carrying several tokens counts
as several at the time it arrived. Only the rare usage/error events are parsed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.types import Receive

from slo_core.wire import openai
from slo_net.upstream import UpstreamError, UpstreamPool, UpstreamResponse

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
# An event's output: the string value of a field that carries generated tokens (completions' text, a
# chat delta's content, reasoning, tool-call arguments). Only its span is used, never decoded.
_OUTPUT = re.compile(rb'"(?:text|content|reasoning_content|reasoning|arguments)":\s*"((?:[^"\\]|\\.)*)"')
CONNECT_TIMEOUT_S = 5.0
KEEPALIVE_S = 2.0  # idle ones are swept every 2 s: none is older than 4 s
_T = TypeVar("_T")


class UpstreamUnavailable(Exception):
    """The pod could not take the request (connect error or a retryable status before any byte)."""

    def __init__(
        self, reason: str, status: int | None = None, retry_after_s: float | None = None, kind: str = ""
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.retry_after_s = retry_after_s
        self.kind = kind or ("connect" if status is None else f"http_{status}")


class ClientGone(Exception):
    """The client disconnected before the pod's answer reached it."""


@dataclass
class StreamStats:
    """What the router saw of a response: when output arrived, how much, and whether it completed."""

    start_s: float
    # one entry per event that carried output: (arrival time, bytes of output text in it)
    events: list[tuple[float, int]] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    completed: bool = False
    error: str | None = None
    _partial: bytes = b""

    def observe_sse(self, data: bytes, now_s: float) -> None:
        """Account whole SSE events of the byte stream (a raw chunk may end mid-event)."""
        buf = self._partial + data if self._partial else data
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._partial = buf
            return
        whole, self._partial = buf[:end], buf[end + 2 :]
        for m in _OUTPUT.finditer(whole):
            size = m.end(1) - m.start(1)
            if size:
                self.events.append((now_s, size))
        if b'"usage"' in whole or b'"error"' in whole:
            self._observe_special(whole)
        if whole.rstrip().endswith(openai.DONE_PAYLOAD):
            self.completed = self.error is None

    def _observe_special(self, whole: bytes) -> None:
        """The rare events worth parsing: usage (exact counts) and errors."""
        for event in whole.split(b"\n\n"):
            if b'"usage"' not in event and b'"error"' not in event:
                continue
            payload = event.strip()
            if not payload.startswith(b"data:"):
                continue
            try:
                chunk = json.loads(payload[5:])
            except ValueError:
                continue
            if not isinstance(chunk, dict):
                continue
            if chunk.get("error"):
                self.error = str(chunk["error"])
            self._take_usage(chunk.get("usage"))

    def _take_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)

    def observe_json(self, body: Any, now_s: float) -> None:
        if not isinstance(body, dict):
            self.error = "invalid upstream JSON"
            return
        self._take_usage(body.get("usage"))
        if self.completion_tokens:
            self.events = [(now_s, self.completion_tokens)]
        self.completed = "error" not in body

    def delivered_times(self) -> list[float]:
        """One timestamp per output token.

        Without usage, each event counts one token. With usage, its exact count is spread over the
        events in proportion to their output text (largest remainder, every event at least one token
        while there are enough), so an event that carried three tokens' worth of text counts three.
        """
        events, n = self.events, self.completion_tokens
        if not events:
            return []
        if n is None or n == len(events):
            return [t for t, _ in events]
        if n < len(events):
            return [t for t, _ in events[:n]]
        spare = n - len(events)
        total = sum(size for _, size in events)
        shares = [spare * size / total for _, size in events]
        counts = [1 + int(s) for s in shares]
        left = n - sum(counts)
        for i in sorted(range(len(events)), key=lambda i: int(shares[i]) - shares[i])[:left]:
            counts[i] += 1
        return [t for (t, _), c in zip(events, counts, strict=True) for _ in range(c)]


def _retry_after(resp: UpstreamResponse) -> float | None:
    raw = resp.headers.get("retry-after")
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def new_session() -> UpstreamPool:
    """The router's one upstream connection pool (no per-request limits beyond the request's own)."""
    # idle connections are dropped before the pods' own keep-alive timeout (uvicorn's and vLLM's 5 s)
    # closes them under us
    return UpstreamPool(keepalive_s=KEEPALIVE_S, connect_timeout_s=CONNECT_TIMEOUT_S)


async def open_upstream(
    session: UpstreamPool, url: str, body: bytes, headers: dict[str, str], timeout_s: float
) -> UpstreamResponse:
    """Send the request and wait for the status line; raises :class:`UpstreamUnavailable`."""
    try:
        resp = await session.post(url, body, headers, read_timeout_s=timeout_s)
    except TimeoutError:  # a swamped pod (or host) accepts or answers slowly: breaker stays shut
        raise UpstreamUnavailable("connect timed out", kind="connect_timeout") from None
    except (UpstreamError, OSError) as exc:
        raise UpstreamUnavailable(f"connect failed: {exc}") from None
    if resp.status in RETRYABLE_STATUS:
        retry_after = _retry_after(resp)
        resp.release()
        raise UpstreamUnavailable(f"status {resp.status}", resp.status, retry_after)
    return resp


async def wait_disconnect(receive: Receive) -> None:
    """Returns when the ASGI server reports the client gone (call only after the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, work: Awaitable[_T]) -> _T:
    """``work``'s result, or :class:`ClientGone` (``work`` cancelled) if the client hangs up first.

    ``work`` runs in the calling task (no task of its own: on a busy loop every extra task switch is
    one more turn of the loop before the first byte); a watcher cancels the caller if the client
    goes, and that cancellation becomes :class:`ClientGone` here.
    """
    me = asyncio.current_task()
    assert me is not None
    gone = finished = False

    def hang_up(w: asyncio.Future[None]) -> None:
        nonlocal gone
        if not finished and not w.cancelled() and w.exception() is None:
            gone = True
            me.cancel()

    watcher = asyncio.ensure_future(wait_disconnect(receive))
    watcher.add_done_callback(hang_up)
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        me.uncancel()
        raise ClientGone() from None
    finally:
        finished = True
        watcher.remove_done_callback(hang_up)
        watcher.cancel()


def error_event(message: str, code: int = 502) -> bytes:
    return openai.error_event(openai.error_body(message, kind="upstream_error", code=code))


class RelayResponse:
    """An ASGI response that pumps the pod's SSE bytes to the client as they arrive.

    No generator, no parsing beyond :meth:`StreamStats.observe_sse`. A disconnect watcher cancels the
    pump the moment the client goes away (even while the pod is silent), which closes the upstream
    response and so aborts the request in the pod. ``on_done`` runs exactly once, however it ends.
    """

    def __init__(
        self,
        resp: UpstreamResponse,
        stats: StreamStats,
        headers: dict[str, str],
        on_done: Callable[[StreamStats], None],
        clock: Callable[[], float],
    ) -> None:
        self.resp, self.stats, self.on_done, self.clock = resp, stats, on_done, clock
        self.raw_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self._ending = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        pump = asyncio.current_task()
        watcher = asyncio.ensure_future(wait_disconnect(receive))
        gone = False

        def hang_up(w: asyncio.Future[None]) -> None:
            nonlocal gone
            # servers also report "disconnect" once the response is complete: not a hang-up then
            if not w.cancelled() and w.exception() is None and pump is not None and not self._ending:
                gone = True
                pump.cancel()

        watcher.add_done_callback(hang_up)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await self._pump(send)
        except asyncio.CancelledError:
            if not gone:
                raise
            if not self.stats.completed:  # a client that hangs up right after [DONE] got everything
                self.stats.error = "client disconnected"
        except OSError:  # the server could not write: the client is gone
            if not self.stats.completed:
                self.stats.error = "client disconnected"
        finally:
            watcher.remove_done_callback(hang_up)
            watcher.cancel()
            self.resp.close()
            self.on_done(self.stats)

    async def _pump(self, send: Any) -> None:
        stats, resp, clock = self.stats, self.resp, self.clock
        try:
            while True:
                chunk = await resp.readany()
                if not chunk:
                    break
                stats.observe_sse(chunk, clock())
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            tail = b""
            if not stats.completed and stats.error is None:  # closed cleanly but without [DONE]
                stats.error = "upstream stream ended early"
                tail = error_event("the serving pod ended the stream early; the response is incomplete")
        except (TimeoutError, UpstreamError) as exc:
            tail = b""
            if not stats.completed:  # after [DONE] the answer is whole, whatever the connection does
                stats.error = f"upstream failed mid-stream: {type(exc).__name__}"
                log.warning("stream from %s broke: %s", resp.host, type(exc).__name__)
                tail = error_event("the serving pod failed while streaming; the response is incomplete")
        self._ending = True
        await send({"type": "http.response.body", "body": tail, "more_body": False})
