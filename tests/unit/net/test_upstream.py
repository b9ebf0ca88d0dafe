"""The router's upstream HTTP/1.1 client against a scripted pod (a raw socket server writing exact bytes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from slo_net.upstream import UpstreamError, UpstreamPool

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Pod:
    """A loopback server that runs ``script`` on each connection and records what it saw."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed_by_client.set()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = int(next(line for line in lines if line.startswith(b"content-length:")).split(b":")[1])
        raw = head + await reader.readexactly(length)
        self.requests.append(raw)
        return raw

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/completions"


@contextlib.asynccontextmanager
async def serving(script: Script) -> AsyncIterator[Pod]:
    pod = Pod(script)
    pod.server = await asyncio.start_server(pod._handle, "127.0.0.1", 0)
    try:
        yield pod
    finally:
        pod.server.close()
        await pod.server.wait_closed()


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def test_a_chunked_stream_arrives_chunk_by_chunk_and_its_connection_is_reused() -> None:
    events = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]
    go = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await pod.read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(SSE_HEAD + chunk(events[0]))
            await writer.drain()
            await go.wait()
            for e in events[1:]:
                writer.write(chunk(e))
                await writer.drain()
            writer.write(b"0\r\n\r\n")

    pool = UpstreamPool()
    async with serving(script) as pod:
        for _ in range(2):
            go.clear()
            headers = {"content-type": "application/json"}
            resp = await pool.post(pod.url, b'{"a":1}', headers, read_timeout_s=5)
            assert resp.status == 200
            assert resp.headers["content-type"] == "text/event-stream"
            assert await resp.readany() == events[0], "the first event is relayed before the rest exists"
            go.set()
            rest = await resp.read()
            assert rest == b"".join(events[1:])
            assert resp.complete
            resp.close()
        assert pod.connections == 1, "a completed keep-alive answer hands its connection back"
        first = pod.requests[0]
        assert first.startswith(b"POST /v1/completions HTTP/1.1\r\n")
        assert b"\r\ncontent-length: 7\r\n" in first and first.endswith(b'\r\n\r\n{"a":1}')
        assert b"\r\ncontent-type: application/json\r\n" in first
        await pool.close()


async def test_a_sized_answer_is_read_whole_and_connection_close_is_honoured() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.read_request(reader)
        writer.write(
            b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 3\r\ncontent-length: 4\r\n"
            b"connection: close\r\n\r\nbusy"
        )

    pool = UpstreamPool()
    async with serving(script) as pod:
        resp = await pool.post(pod.url, b"{}", {}, read_timeout_s=5)
        assert (resp.status, resp.headers["retry-after"]) == (503, "3")
        assert await resp.read() == b"busy"
        resp.close()
        assert pool.idle_connections() == 0, "a connection the pod closes is not pooled"
    await pool.close()


async def test_a_pod_that_breaks_off_mid_stream_is_an_upstream_error() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.read_request(reader)
        writer.write(SSE_HEAD + chunk(b"data: one\n\n"))
        await writer.drain()
        writer.transport.abort()

    pool = UpstreamPool()
    async with serving(script) as pod:
        resp = await pool.post(pod.url, b"{}", {}, read_timeout_s=5)
        assert await resp.readany() == b"data: one\n\n"
        with pytest.raises(UpstreamError):
            await resp.readany()
        resp.close()
        assert pool.idle_connections() == 0
    await pool.close()


async def test_a_silent_pod_times_out_before_and_after_its_status_line() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.read_request(reader)
        await asyncio.sleep(5)

    pool = UpstreamPool()
    async with serving(silent) as pod:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool.post(pod.url, b"{}", {}, read_timeout_s=0.2), 3)

    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.read_request(reader)
        for _ in range(4):  # bytes keep coming within the timeout: no timeout however long in total
            writer.write(SSE_HEAD if _ == 0 else chunk(b"data: x\n\n"))
            await writer.drain()
            await asyncio.sleep(0.1)
        await asyncio.sleep(5)

    async with serving(stalls) as pod:
        resp = await pool.post(pod.url, b"{}", {}, read_timeout_s=0.25)
        got = b""
        with pytest.raises(TimeoutError):
            while True:
                got += await asyncio.wait_for(resp.readany(), 3)
        assert got == b"data: x\n\n" * 3
        resp.close()
    await pool.close()


async def test_closing_an_unfinished_answer_aborts_the_request_in_the_pod() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.read_request(reader)
        writer.write(SSE_HEAD + chunk(b"data: one\n\n"))
        await writer.drain()
        await reader.read()  # returns at the client's close
        pod.closed_by_client.set()

    pool = UpstreamPool()
    async with serving(script) as pod:
        resp = await pool.post(pod.url, b"{}", {}, read_timeout_s=5)
        await resp.readany()
        resp.close()
        await asyncio.wait_for(pod.closed_by_client.wait(), 3)
        assert pool.idle_connections() == 0
    await pool.close()


async def test_a_cancelled_request_aborts_its_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.read_request(reader)
        await reader.read()
        pod.closed_by_client.set()

    pool = UpstreamPool()
    async with serving(script) as pod:
        task = asyncio.ensure_future(pool.post(pod.url, b"{}", {}, read_timeout_s=5))
        while not pod.requests:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(pod.closed_by_client.wait(), 3)
    await pool.close()


async def test_the_request_is_written_before_the_caller_yields_to_the_loop() -> None:
    """On a pooled connection the bytes leave in the caller's own step: no task queued behind others."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await pod.read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    pool = UpstreamPool()
    async with serving(script) as pod:
        resp = await pool.post(pod.url, b"{}", {}, read_timeout_s=5)
        assert await resp.read() == b"ok"
        resp.close()
        (conn,) = [c for q in pool._idle.values() for c in q]
        assert conn.transport is not None
        written: list[bytes] = []
        real_write = conn.transport.write
        conn.transport.write = lambda data: (written.append(bytes(data)), real_write(data))[1]  # type: ignore[method-assign]
        coro = pool.post(pod.url, b'{"x":2}', {}, read_timeout_s=5)
        coro.send(None)  # runs until its first suspension: waiting for the status line
        assert written and written[0].endswith(b'{"x":2}')
        coro.close()
    await pool.close()


async def test_unreachable_pods_and_bad_headers_are_refused() -> None:
    pool = UpstreamPool(connect_timeout_s=1)
    with pytest.raises(UpstreamError):
        await pool.post("http://127.0.0.1:9/v1/completions", b"{}", {}, read_timeout_s=1)
    with pytest.raises(UpstreamError):
        await pool.post("https://example.invalid/v1/completions", b"{}", {}, read_timeout_s=1)
    with pytest.raises(ValueError, match="does not allow"):
        await pool.post("http://127.0.0.1:9/x", b"{}", {"x-request-id": "a\r\nx-evil: 1"}, read_timeout_s=1)
    await pool.close()


async def test_idle_connections_expire_and_a_slow_reader_pauses_the_socket() -> None:
    big = b"x" * (1024 * 1024)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await pod.read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(big) + big)
            await writer.drain()

    pool = UpstreamPool(keepalive_s=0.2)
    async with serving(script) as pod:
        resp = await pool.post(pod.url, b"{}", {}, read_timeout_s=0.5)
        for _ in range(100):  # let the pod's megabyte arrive while nobody reads
            await asyncio.sleep(0.01)
            if resp._paused:
                break
        assert resp._paused, "a reader that falls behind stops the socket being read"
        await asyncio.sleep(0.7)  # longer than the read timeout: a paused socket is not the pod's silence
        assert await resp.read() == big
        resp.close()
        assert pool.idle_connections() == 1
        await asyncio.sleep(0.5)
        assert pool.idle_connections() == 0, "idle connections are dropped after keepalive_s"
        resp = await pool.post(pod.url, b"{}", {}, read_timeout_s=5)
        await resp.read()
        resp.close()
        assert pod.connections == 2
    await pool.close()


async def test_an_informational_answer_is_skipped_and_oversized_answers_are_refused() -> None:
    async def early_hints(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.read_request(reader)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    pool = UpstreamPool()
    async with serving(early_hints) as pod:
        resp = await pool.post(pod.url, b"{}", {}, read_timeout_s=5)
        assert (resp.status, resp.headers, await resp.read()) == (200, {"content-length": "2"}, b"ok")
        resp.close()

    async def huge_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n" + b"x-junk: " + b"j" * 100_000 + b"\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with serving(huge_head) as pod:
        with pytest.raises(UpstreamError, match="head exceeds"):
            await pool.post(pod.url, b"{}", {}, read_timeout_s=5)

    async def huge_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + b"b" * 100_000)
        await writer.drain()
        await reader.read()

    await pool.close()
    pool = UpstreamPool()
    async with serving(huge_body) as pod:
        resp = await pool.post(pod.url, b"{}", {}, read_timeout_s=5)
        with pytest.raises(UpstreamError, match="exceeds 1000 bytes"):
            await resp.read(max_bytes=1000)
        resp.close()
        assert pool.idle_connections() == 0, "a connection whose answer was refused is not reused"
    await pool.close()


async def test_an_answer_framed_by_the_end_of_the_connection_is_complete_at_a_clean_close() -> None:
    async def eof_framed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    pool = UpstreamPool()
    async with serving(eof_framed) as pod:
        resp = await pool.post(pod.url, b"{}", {}, read_timeout_s=5)
        assert await resp.read() == b"all of it"
        assert resp.complete and resp.error is None
        resp.close()
        assert pool.idle_connections() == 0
    await pool.close()
