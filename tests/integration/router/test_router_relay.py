"""The router's relay over real loopback sockets: pass-through, token accounting, and hang-ups.

The router runs under uvicorn in-process; the pod is a raw TCP server that records what it received
and when its connection was closed, so "the client hung up, so the pod's request was aborted" is
checked where a pod would notice it: its socket reaching end-of-file.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import uvicorn

from slo_router.app import build_state, create_app
from slo_router.config import ANONYMOUS, RouterConfig
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.proxy import StreamStats
from slo_router.tenants import KeyStore

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]


@dataclasses.dataclass
class Pod:
    """A fake engine: runs ``script`` per connection; ``closed`` is set when the router hangs up."""

    script: Script
    port: int = 0
    got_request: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    closed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    bodies: list[bytes] = dataclasses.field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        self.bodies.append(await reader.readexactly(length))
        self.got_request.set()
        try:
            await self.script(reader, writer)
            if await reader.read() == b"":  # the router closed its side
                self.closed.set()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed.set()
        finally:
            writer.close()


def sse_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@contextlib.asynccontextmanager
async def fleet(script: Script) -> AsyncIterator[tuple[Pod, int, Any]]:
    pod = Pod(script)
    server = await asyncio.start_server(pod.handle, "127.0.0.1", 0)
    pod.port = server.sockets[0].getsockname()[1]
    config = dataclasses.replace(RouterConfig.single_tier(), routing_policy="round-robin", routing_params={})
    spec = EndpointSpec("a", f"http://127.0.0.1:{pod.port}", models=("m",))
    state = build_state(config, KeyStore({}), {"a": EndpointState(spec)})
    router = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(router._serve())  # not serve(): it would take over the test process's signals
    while not router.started:
        await asyncio.sleep(0.01)
    port = router.servers[0].sockets[0].getsockname()[1]
    try:
        yield pod, port, state
    finally:
        router.should_exit = True
        await task
        server.close()


async def post(port: int, body: dict[str, Any]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    raw = json.dumps(body).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(raw), raw)
    )
    await writer.drain()
    return reader, writer


def cancelled(state: Any) -> float:
    return float(state.metrics.requests.labels("standard", ANONYMOUS, "m", "cancelled")._value.get())


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def test_a_client_leaving_before_the_pod_answers_aborts_the_pod_request() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        return None  # never answers: the router is waiting for the status line

    async with fleet(silent) as (pod, port, state):
        _, writer = await post(port, {**BODY, "stream": True})
        await asyncio.wait_for(pod.got_request.wait(), 10)
        writer.close()
        await asyncio.wait_for(pod.closed.wait(), 10)
        assert cancelled(state) == 1


async def test_a_client_leaving_mid_stream_aborts_the_pod_request_even_while_the_pod_is_silent() -> None:
    async def one_token_then_wait(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(sse_head() + chunked(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'))
        await writer.drain()

    async with fleet(one_token_then_wait) as (pod, port, state):
        reader, writer = await post(port, {**BODY, "stream": True})
        await asyncio.wait_for(reader.readuntil(b'"content":"a"'), 10)
        writer.close()
        await asyncio.wait_for(pod.closed.wait(), 10)
        await asyncio.sleep(0.1)
        assert cancelled(state) == 1


async def test_a_client_leaving_during_a_non_streamed_generation_aborts_the_pod_request() -> None:
    async def half_a_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{")
        await writer.drain()

    async with fleet(half_a_body) as (pod, port, state):
        _, writer = await post(port, BODY)
        await asyncio.wait_for(pod.got_request.wait(), 10)
        await asyncio.sleep(0.2)
        writer.close()
        await asyncio.wait_for(pod.closed.wait(), 10)
        assert cancelled(state) == 1


RICH = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "reasoning_content": "think",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            "logprobs": {"content": [{"token": "x", "logprob": -0.1, "top_logprobs": []}]},
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
}


async def test_a_non_streamed_answer_is_the_engines_own_bytes() -> None:
    raw = json.dumps(RICH).encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(raw)
        )
        writer.write(raw)
        await writer.drain()

    async with fleet(answer) as (pod, port, state):
        reader, writer = await post(port, BODY)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(reader.readexactly(len(raw)), 10) == raw
        writer.close()
        assert json.loads(pod.bodies[0])["messages"] == BODY["messages"]
        assert state.metrics.requests.labels("standard", ANONYMOUS, "m", "ok")._value.get() == 1


STREAM = [
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":"one two three"},"logprobs":{"content":[]}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}}\n\n',
    b"data: [DONE]\n\n",
]


async def test_a_stream_is_relayed_byte_for_byte_and_its_tokens_counted_exactly() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(sse_head())
        for event in STREAM:
            writer.write(chunked(event))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with fleet(answer) as (_, port, state):
        reader, writer = await post(port, {**BODY, "stream": True})
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        got = b""
        while b"[DONE]" not in got:
            size = int((await asyncio.wait_for(reader.readline(), 10)).strip(), 16)
            got += (await reader.readexactly(size + 2))[:-2]
        writer.close()
        assert got == b"".join(STREAM)
        await asyncio.sleep(0.1)
        assert state.metrics.requests.labels("standard", ANONYMOUS, "m", "ok")._value.get() == 1


def test_an_event_carrying_several_tokens_counts_as_several_at_its_arrival() -> None:
    stats = StreamStats(start_s=0.0)
    stats.observe_sse(b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[{"te', 1.0)
    stats.observe_sse(b'xt":"bcdefghijklmnop"}]}\n\n', 2.0)  # one event, split across reads
    stats.observe_sse(b'data: {"choices":[{"text":"q"}]}\n\n', 3.0)
    stats.observe_sse(b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":6}}\n\n', 3.5)
    stats.observe_sse(b"data: [DONE]\n\n", 3.6)
    assert stats.completed and stats.prompt_tokens == 1
    assert stats.delivered_times() == [1.0, 2.0, 2.0, 2.0, 2.0, 3.0]


def test_without_usage_each_output_event_is_one_token_and_empty_ones_none() -> None:
    stats = StreamStats(start_s=0.0)
    stats.observe_sse(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n', 1.0)
    stats.observe_sse(b'data: {"choices":[{"delta":{"content":"x \\"quoted\\""}}]}\n\n', 2.0)
    stats.observe_sse(b'data: {"error":{"message":"boom"}}\n\n', 3.0)
    stats.observe_sse(b"data: [DONE]\n\n", 3.1)
    assert stats.delivered_times() == [2.0]
    assert not stats.completed and stats.error is not None


@pytest.mark.parametrize("n", [1, 2, 5, 40])
def test_spreading_usage_keeps_the_exact_count(n: int) -> None:
    stats = StreamStats(start_s=0.0)
    for i, text in enumerate([b"a", b"bb", b"cccc"]):
        stats.observe_sse(b'data: {"choices":[{"text":"%s"}]}\n\n' % text, float(i))
    stats.completion_tokens = n
    times = stats.delivered_times()
    assert len(times) == n and times == sorted(times)
