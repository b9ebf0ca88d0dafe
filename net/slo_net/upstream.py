"""An upstream HTTP/1.1 client: one keep-alive pool, requests written at once, bodies relayed raw.

The router sends through it to the pods, and the proxy-mode sidecar to its engine. Why not aiohttp's
client, which both used before: measured side by side on this host (a uvicorn relay, 64 closed-loop
streams), a relay on aiohttp's client spent about 150-200 us of CPU per request more than the same
relay on this one, and on Python 3.11 aiohttp writes a request's bytes in a task of its own, queued
behind every other ready task. When a wave of requests arrived together, every intake of the wave
therefore ran before the first upstream byte left, and the router's TTFT grew with the wave. Here the
request goes out in one ``write`` from the caller's own call, and a response costs a parser callback
per chunk and nothing per byte. Parsing is httptools (uvicorn's parser); the client keeps only what
the services need:

- ``POST`` with a body held in memory, to pods addressed as ``http://host:port``;
- the status, the headers, the body as it arrives (chunked or sized: the parser undoes the framing);
- idle connections reused (most recent first) and dropped after ``keepalive_s`` (before the pods' own
  5 s keep-alive can close one under a request);
- a connect timeout, and a read timeout that counts from the last byte received (aiohttp's
  ``sock_read``), checked by one timer per response rather than one per chunk;
- back-pressure: a response whose reader falls behind stops reading the socket until it catches up;
- ``close()`` before the response is complete aborts the connection, which aborts the request in the
  pod.

Errors are :class:`UpstreamError` (connect failures, a connection lost before or during the answer, a
malformed response) and :class:`TimeoutError`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import socket
import time
from collections.abc import Awaitable, Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

__all__ = ["UpstreamError", "UpstreamPool", "UpstreamResponse"]

# Resolves a pod's (host, port) to where to connect; the default connects to the name as given.
Resolver = Callable[[str, int], Awaitable[tuple[str, int]]]

_HIGH_WATER = 256 * 1024  # bytes buffered for a slow reader before the socket stops being read
MAX_HEADER_BYTES = 64 * 1024  # a response head larger than this is refused (a pod is not trusted with memory)
MAX_READ_BYTES = 64 * 1024 * 1024  # the most :meth:`UpstreamResponse.read` holds of one whole answer
_BAD_HEADER = re.compile(r"[\r\n\0]")


class UpstreamError(Exception):
    """The pod could not be reached, or its answer broke off or could not be parsed."""


class _Connection(asyncio.Protocol):
    """One TCP connection to a pod and the response in flight on it (at most one at a time)."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self.response: UpstreamResponse | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        resp = self.response
        if resp is None or resp.complete:  # bytes nobody asked for: the connection cannot be trusted again
            self.abort()
            return
        resp.last_read = time.monotonic()
        try:
            resp.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            resp.fail(UpstreamError("the pod answered with a protocol upgrade"))
            self.abort()
        except httptools.HttpParserError as exc:
            resp.fail(UpstreamError(f"malformed response from the pod: {exc}"))
            self.abort()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        resp = self.response
        if resp is None or resp.complete:
            return
        if exc is None and resp.ends_at_eof():  # an answer with neither length nor chunks ends here
            resp.on_message_complete()
            return
        resp.fail(UpstreamError("the pod closed the connection before the answer was complete"))

    def abort(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.abort()


class UpstreamResponse:
    """A pod's answer: ``status`` and ``headers`` (lower-case names) once :meth:`UpstreamPool.post`
    returns, then the body through :meth:`readany` or :meth:`read`; always end with :meth:`close`."""

    def __init__(self, pool: UpstreamPool, conn: _Connection, read_timeout_s: float | None) -> None:
        self.pool, self.conn, self.read_timeout_s = pool, conn, read_timeout_s
        self.host = conn.key[0]
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False
        self.keep_alive = False
        self._header_bytes = 0
        self.error: BaseException | None = None
        self.last_read = time.monotonic()
        self._head: asyncio.Future[None] = pool.loop.create_future()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        if read_timeout_s is not None:
            self._timer = pool.loop.call_later(read_timeout_s, self._check_timeout)
        self._closed = False

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > MAX_HEADER_BYTES:
            self.fail(UpstreamError(f"the pod's response head exceeds {MAX_HEADER_BYTES} bytes"))
            raise ValueError("response head too large")  # stops the parser; the connection is aborted
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status < 200:  # informational (100 Continue, 103 Early Hints): the answer follows it
            self.headers.clear()
            return
        self.keep_alive = self.parser.should_keep_alive()  # after the message the parser no longer says
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.conn.transport is not None:
            self._paused = True
            self.conn.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status < 200:
            return
        self.complete = True
        self._stop_timer()
        self._wake()

    def ends_at_eof(self) -> bool:
        """An answer whose body runs to the end of the connection (HTTP/1.0 style framing)."""
        return (
            self._head.done()
            and self.error is None
            and self.status >= 200
            and "content-length" not in self.headers
            and "chunked" not in self.headers.get("transfer-encoding", "").lower()
        )

    # state changes
    def fail(self, exc: BaseException) -> None:
        if self.complete or self.error is not None:
            return
        self.error = exc
        self._stop_timer()
        if not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved: nobody may be waiting any more
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_timeout(self) -> None:
        self._timer = None
        if self.complete or self.error is not None or self._closed or self.read_timeout_s is None:
            return
        idle = time.monotonic() - self.last_read
        if self._paused or idle < self.read_timeout_s:  # a paused socket is the reader's wait, not the pod's
            wait_s = max(self.read_timeout_s - idle, 0.001)
            self._timer = self.pool.loop.call_later(wait_s, self._check_timeout)
            return
        self.fail(TimeoutError(f"no byte from the pod for {self.read_timeout_s:g} s"))
        self.conn.abort()

    # reading
    async def wait_head(self) -> None:
        await self._head

    async def readany(self) -> bytes:
        """What arrived since the last call (waiting for something); ``b""`` at the end of the body."""
        while not self._chunks:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            self._waiter = self.pool.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self.conn.transport is not None:
            self._paused = False
            self.conn.transport.resume_reading()
        return data

    async def read(self, max_bytes: int = MAX_READ_BYTES) -> bytes:
        """The whole body; :class:`UpstreamError` (and the connection aborted) past ``max_bytes``."""
        parts, size = [], 0
        while chunk := await self.readany():
            size += len(chunk)
            if size > max_bytes:
                self.fail(UpstreamError(f"the pod's answer exceeds {max_bytes} bytes"))
                self.conn.abort()
                raise UpstreamError(f"the pod's answer exceeds {max_bytes} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        """Done with the answer: a complete one hands its connection back, anything else aborts it."""
        if self._closed:
            return
        self._closed = True
        self._stop_timer()
        conn = self.conn
        conn.response = None
        if self.complete and self.error is None and self.keep_alive:
            if self._paused and conn.transport is not None:
                conn.transport.resume_reading()
            self.pool._put(conn)
        else:
            conn.abort()

    release = close

    @property
    def closed(self) -> bool:
        return self._closed


class UpstreamPool:
    """Keep-alive connections to the pods; :meth:`post` sends a request and waits for its status line."""

    def __init__(
        self,
        *,
        keepalive_s: float = 2.0,
        connect_timeout_s: float = 5.0,
        resolve: Resolver | None = None,
    ) -> None:
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self._resolve = resolve
        self._idle: dict[tuple[str, int], collections.deque[_Connection]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], *, read_timeout_s: float | None
    ) -> UpstreamResponse:
        """Send ``body`` to ``url`` and wait for the answer's status line and headers.

        The request's bytes are written before this returns control to the event loop (when a pooled
        connection is at hand); cancelling the call aborts the connection. ``read_timeout_s``: the
        longest silence from the pod, None for none (the caller bounds the request)."""
        if self._closed:
            raise UpstreamError("the upstream pool is closed")
        host, port, target = _split(url)
        head = _request_head(target, f"{host}:{port}", len(body), headers)
        conn = self._take((host, port)) or await self._connect(host, port)
        resp = UpstreamResponse(self, conn, read_timeout_s)
        conn.response = resp
        assert conn.transport is not None
        conn.transport.write(head + body)
        try:
            await resp.wait_head()
        except BaseException:
            resp.close()
            raise
        return resp

    def _take(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to be closing
            if not conn.lost and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.abort()
        return None

    async def _connect(self, host: str, port: int) -> _Connection:
        to_host, to_port = await self._resolve(host, port) if self._resolve is not None else (host, port)
        key = (host, port)
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Connection(key), to_host, to_port),
                self.connect_timeout_s,
            )
        except TimeoutError:
            raise TimeoutError(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {host}:{port}: {type(exc).__name__}") from None
        return conn

    def _put(self, conn: _Connection) -> None:
        if self._closed or conn.lost:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, collections.deque()).append(conn)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(self.keepalive_s, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        now = time.monotonic()
        left = 0
        for idle in self._idle.values():
            while idle and (idle[0].lost or now - idle[0].idle_since >= self.keepalive_s):
                idle.popleft().abort()  # oldest first: the deque is in order of return
            left += len(idle)
        if left and not self._closed:
            self._sweeper = self.loop.call_later(self.keepalive_s / 2, self._sweep)

    def idle_connections(self) -> int:
        return sum(len(q) for q in self._idle.values())

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        aborted = 0
        for idle in self._idle.values():
            while idle:
                idle.pop().abort()
                aborted += 1
        self._idle.clear()
        if aborted:
            await asyncio.sleep(0)  # the transports close in a callback: let it run before the loop ends


def _split(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UpstreamError(f"not an http:// pod URL: {url!r}")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return parts.hostname, parts.port or 80, target


def _request_head(target: str, host: str, length: int, headers: dict[str, str]) -> bytes:
    lines = [f"POST {target} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {length}\r\n"]
    for name, value in headers.items():
        if _BAD_HEADER.search(name) or _BAD_HEADER.search(value) or ":" in name:
            raise ValueError(f"header {name!r} carries a character HTTP does not allow")
        if name.lower() in ("host", "content-length", "transfer-encoding"):
            continue  # this client frames the request itself
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")
