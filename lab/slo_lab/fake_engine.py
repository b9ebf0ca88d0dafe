"""A tiny stand-in for an OpenAI-compatible engine, for the sidecar's tests and local smoke runs.

It streams ``max_tokens`` filler tokens (fewer without ``ignore_eos``: a length from a hash of the
prompt) at a fixed pace, runs at most ``max_running`` requests at once (the rest wait, as in vLLM),
counts what it started, finished and saw aborted, and can be told to fail (``fail_after_tokens``)
to test what clients see when the engine dies,
or hold every request at a ``gate`` until a test opens it. Use engine-sim for realistic timing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class FakeEngine:
    """Knobs and counters of the fake engine (change knobs between requests in tests)."""

    model: str = "fake-model"
    ttft_s: float = 0.01
    tbt_s: float = 0.002
    max_running: int = 1000
    fail_after_tokens: int | None = None
    gate: asyncio.Event | None = None
    healthy: bool = True
    started: int = 0
    finished: int = 0
    aborted: int = 0
    generated_tokens: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    _slots: asyncio.Semaphore | None = None
    waiting: int = 0
    running: int = 0

    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_running)
        return self._slots


def _length(body: dict[str, Any]) -> int:
    cap = int(body.get("max_tokens") or 16)
    if body.get("ignore_eos"):
        return cap
    key = json.dumps(body.get("prompt") or body.get("messages"), sort_keys=True).encode()
    return min(cap, 1 + int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "big") % 64)


def _chunk(chat: bool, text: str, finish: str | None, model: str) -> dict[str, Any]:
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        return {
            "id": "fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [choice],
        }
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": "fake", "object": "text_completion", "created": 0, "model": model, "choices": [choice]}


def _prompt_tokens(body: dict[str, Any]) -> int:
    if "messages" in body:
        return 1 + sum(len(str(m.get("content", "")).split()) + 4 for m in body["messages"]) + 3
    prompt = body.get("prompt", "")
    return len(prompt) if isinstance(prompt, list) else 1 + len(str(prompt).split())


async def _generate(eng: FakeEngine, body: dict[str, Any], chat: bool) -> AsyncIterator[bytes]:
    n = _length(body)
    eng.waiting += 1
    done = False
    async with eng.slots():
        eng.waiting -= 1
        eng.running += 1
        eng.started += 1
        try:
            if eng.gate is not None:
                await eng.gate.wait()
            await asyncio.sleep(eng.ttft_s)
            for i in range(n):
                if eng.fail_after_tokens is not None and i >= eng.fail_after_tokens:
                    raise ConnectionError("fake engine failure")
                if i:
                    await asyncio.sleep(eng.tbt_s)
                eng.generated_tokens += 1
                finish = (
                    ("length" if body.get("ignore_eos") or n == body.get("max_tokens") else "stop")
                    if i == n - 1
                    else None
                )
                yield _sse(_chunk(chat, f" w{i}", finish, eng.model))
            usage = {
                "prompt_tokens": _prompt_tokens(body),
                "completion_tokens": n,
                "total_tokens": _prompt_tokens(body) + n,
            }
            yield _sse(
                {"id": "fake", "object": "x", "created": 0, "model": eng.model, "choices": [], "usage": usage}
            )
            yield b"data: [DONE]\n\n"
            done = True
            eng.finished += 1
        finally:
            eng.running -= 1
            if not done:
                eng.aborted += 1


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def create_fake_engine_app(eng: FakeEngine) -> Starlette:
    async def generate(request: Request) -> Response:
        body = await request.json()
        eng.bodies.append(body)
        chat = request.url.path.endswith("chat/completions")
        if body.get("model") != eng.model:
            return JSONResponse({"error": {"message": f"model {body.get('model')!r} does not exist"}}, 404)
        if not body.get("stream"):  # the streamed events, assembled as vLLM answers a non-streamed call
            text, finish, usage = [], None, None
            async for raw in _generate(eng, body, chat):
                if raw.startswith(b"data: {"):
                    event = json.loads(raw[6:])
                    usage = event.get("usage") or usage
                    for c in event["choices"]:
                        text.append(c["delta"]["content"] if chat else c["text"])
                        finish = c["finish_reason"] or finish
            content = "".join(text)
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
                if chat
                else {"index": 0, "text": content, "logprobs": None, "finish_reason": finish}
            )
            kind = "chat.completion" if chat else "text_completion"
            answer = {"id": "fake", "object": kind, "created": 0, "model": eng.model, "choices": [choice]}
            return JSONResponse({**answer, "usage": usage})
        return StreamingResponse(_generate(eng, body, chat), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return Response(status_code=200 if eng.healthy else 503)

    async def models(request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": eng.model, "object": "model", "max_model_len": 4096}]}
        )

    async def metrics(request: Request) -> Response:
        text = (
            f"vllm:num_requests_running {eng.running}\nvllm:num_requests_waiting {eng.waiting}\n"
            f"vllm:kv_cache_usage_perc 0.0\n# finished {eng.finished} at {time.time()}\n"
        )
        return PlainTextResponse(text)

    return Starlette(
        routes=[
            Route("/v1/completions", generate, methods=["POST"]),
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )


@asynccontextmanager
async def serve_fake_engine(eng: FakeEngine, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve ``eng`` on a free loopback port in this event loop; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    config = uvicorn.Config(
        create_fake_engine_app(eng),
        log_level="warning",
        lifespan="off",
        http="h11",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server._serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()
