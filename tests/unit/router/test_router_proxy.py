"""Relaying a pod's SSE stream: how it ends decides the outcome the router accounts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from slo_lab.loopback_pods import LoopbackPods, close_all
from slo_router.proxy import RelayResponse, StreamStats, open_upstream

TOKEN = b'data: {"choices":[{"index":0,"text":"x"}]}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.fixture(autouse=True)
async def _stop_loopback_pods() -> AsyncIterator[None]:
    yield
    await close_all()


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


async def relay(stream: Upstream, stop_after: bytes | None) -> tuple[list[bytes], StreamStats]:
    """Relay through :class:`RelayResponse`; the client hangs up after a chunk containing ``stop_after``."""
    pods = LoopbackPods(lambda req: httpx.Response(200, stream=stream))
    resp = await open_upstream(pods.session(), "http://pod/v1/completions", b"{}", {}, 30.0)
    finished: list[StreamStats] = []
    got: list[bytes] = []
    hung_up = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await hung_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message["body"]:
            got.append(message["body"])
            if stop_after is not None and stop_after in message["body"]:
                hung_up.set()

    response = RelayResponse(resp, StreamStats(start_s=0.0), {}, finished.append, lambda: 1.0)
    await asyncio.wait_for(response({}, receive, send), 10)
    assert len(finished) == 1, "the outcome is accounted exactly once"
    assert resp.closed, "the upstream response is closed however the relay ends"
    return got, finished[0]


async def test_a_client_that_hangs_up_right_after_done_got_a_complete_answer() -> None:
    got, stats = await relay(Upstream([TOKEN, TOKEN, DONE]), b"[DONE]")
    assert b"".join(got) == TOKEN + TOKEN + DONE
    assert stats.completed and stats.error is None and len(stats.delivered_times()) == 2


async def test_a_client_that_leaves_before_done_is_a_cancellation() -> None:
    _, stats = await relay(Upstream([TOKEN, TOKEN]), b'"x"')
    assert not stats.completed and stats.error == "client disconnected"


async def test_a_pod_failing_after_done_does_not_spoil_a_whole_answer() -> None:
    got, stats = await relay(Upstream([TOKEN, DONE], then_fail=True), None)
    assert b"".join(got) == TOKEN + DONE, "no error event after [DONE]"
    assert stats.completed and stats.error is None


async def test_a_pod_failing_mid_stream_ends_in_an_explicit_error_event() -> None:
    got, stats = await relay(Upstream([TOKEN], then_fail=True), None)
    assert got[0] == TOKEN and b'"error"' in got[-1]
    assert not stats.completed and stats.error is not None
    assert stats.error.startswith("upstream failed mid-stream")
