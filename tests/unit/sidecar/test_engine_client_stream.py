"""The proxy-mode sidecar's streamed generation against a scripted engine (raw socket, exact bytes):
after ``[DONE]`` the connection goes back to the pool when the answer ends, and is dropped when the
engine keeps sending or is slow to end it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from slo_sidecar import engine_client
from slo_sidecar.engine_client import stream_events

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


EVENTS = chunk(b'data: {"choices":[{"text":"a"}]}\n\n') + chunk(b"data: [DONE]\n\n")
END = b"0\r\n\r\n"

Tail = Callable[[asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next(int(x.split(b":")[1]) for x in lines if x.startswith(b"content-length:"))
    await reader.readexactly(length)


@contextlib.asynccontextmanager
async def engine(tail: Tail) -> AsyncIterator[tuple[str, list[int]]]:
    """A pod answering every request on a connection with EVENTS, then ``tail``; yields its URL and
    the number of connections it has accepted (a list of one, updated)."""
    connections = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        try:
            while True:
                await _read_request(reader)
                writer.write(HEAD + EVENTS)
                await writer.drain()
                await tail(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/completions", connections
    finally:
        server.close()
        await server.wait_closed()


async def _stream_twice(url: str) -> list[list[bytes]]:
    pool = engine_client.new_session()
    got: list[list[bytes]] = []
    try:
        for _ in range(2):
            async for batch in stream_events(pool, url, {"prompt": "x"}, {}, 5.0):
                got.append(batch)
    finally:
        await pool.close()
    return got


async def _end_later(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(0.005)  # the terminator in a write of its own, as uvicorn sends it
    writer.write(END)
    await writer.drain()


async def _never_end(writer: asyncio.StreamWriter) -> None:
    for _ in range(50):  # keeps sending past [DONE], never ends the body
        writer.write(chunk(b": keep-alive\n\n"))
        await writer.drain()
        await asyncio.sleep(0.01)


async def _end_too_late(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(engine_client.FINISH_WAIT_S * 4)
    writer.write(END)
    await writer.drain()


@pytest.mark.asyncio
async def test_the_connection_is_reused_once_the_answer_ends_after_done() -> None:
    async with engine(_end_later) as (url, connections):
        got = await _stream_twice(url)
    assert got == [[b'{"choices":[{"text":"a"}]}']] * 2
    assert connections[0] == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("tail", [_never_end, _end_too_late])
async def test_an_engine_that_does_not_end_promptly_loses_the_connection(tail: Tail) -> None:
    async with engine(tail) as (url, connections):
        t0 = asyncio.get_running_loop().time()
        got = await _stream_twice(url)
        took = asyncio.get_running_loop().time() - t0
    assert got == [[b'{"choices":[{"text":"a"}]}']] * 2
    assert connections[0] == 2  # the first connection was dropped, not pooled
    assert took < 2.0  # nothing hangs on the tail
