"""Relaying a pod's SSE stream: how it ends decides the outcome the router accounts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from slo_router.proxy import StreamStats, relay_stream

TOKEN = b'data: {"choices":[{"index":0,"text":"x"}]}\n\n'
DONE = b"data: [DONE]\n\n"


class Upstream(httpx.AsyncByteStream):
    """Yields the given chunks, then either fails or stays open (a pod that has not closed yet)."""

    def __init__(self, chunks: list[bytes], then_fail: bool = False) -> None:
        self.chunks, self.then_fail = chunks, then_fail

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.then_fail:
            raise httpx.ReadError("connection reset")
        await asyncio.Event().wait()

    async def aclose(self) -> None:
        return None


def response(stream: Upstream) -> httpx.Response:
    return httpx.Response(200, stream=stream, request=httpx.Request("POST", "http://pod/v1/completions"))


async def relay_until(stream: Upstream, stop_after: bytes) -> tuple[list[bytes], StreamStats]:
    """Read the relayed stream until a chunk containing ``stop_after``, then hang up like a client."""
    finished: list[StreamStats] = []
    relay = relay_stream(response(stream), StreamStats(start_s=0.0), finished.append)
    got = []
    async for chunk in relay:
        got.append(chunk)
        if stop_after in chunk:
            break
    await relay.aclose()
    assert len(finished) == 1, "the outcome is accounted exactly once"
    return got, finished[0]


async def test_a_client_that_hangs_up_right_after_done_got_a_complete_answer() -> None:
    got, stats = await relay_until(Upstream([TOKEN, TOKEN, DONE]), b"[DONE]")
    assert got == [TOKEN, TOKEN, DONE]
    assert stats.completed and stats.error is None and len(stats.token_times_s) == 2


async def test_a_client_that_leaves_before_done_is_a_cancellation() -> None:
    _, stats = await relay_until(Upstream([TOKEN, TOKEN, DONE]), b'"x"')
    assert not stats.completed and stats.error == "client disconnected"


async def test_a_pod_failing_after_done_does_not_spoil_a_whole_answer() -> None:
    finished: list[StreamStats] = []
    relay = relay_stream(response(Upstream([TOKEN, DONE], then_fail=True)), StreamStats(0.0), finished.append)
    got = [chunk async for chunk in relay]
    assert got == [TOKEN, DONE], "no error event after [DONE]"
    assert finished[0].completed and finished[0].error is None


async def test_a_pod_failing_mid_stream_ends_in_an_explicit_error_event() -> None:
    finished: list[StreamStats] = []
    relay = relay_stream(response(Upstream([TOKEN], then_fail=True)), StreamStats(0.0), finished.append)
    got = [chunk async for chunk in relay]
    assert got[0] == TOKEN and b'"error"' in got[-1]
    assert not finished[0].completed and finished[0].error == "upstream failed mid-stream: ReadError"
