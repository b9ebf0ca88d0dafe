"""The Starlette app: vLLM's OpenAI endpoints over an EngineRunner.

``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming as SSE ``data:`` chunks, a usage
chunk with ``stream_options.include_usage``, then ``data: [DONE]``), ``GET /v1/models``,
``POST /tokenize``, ``GET /health``, ``GET /version``, ``GET /metrics``. A client that disconnects
(streaming or not) has its request aborted in the engine. Errors are answered in one place
(:func:`_error`) as ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from slo_core.wire.tokens import message_text

from . import tokens, tool_calls
from .metrics import EngineMetrics
from .protocol import (
    ApiError,
    ChatBody,
    CompletionBody,
    chat_prompt_of,
    decode_xargs,
    parse_body,
    prompt_tokens_of,
    resolve_lengths,
)
from .responses import Shape, chunk, full_response, role_chunk, sse, usage, usage_chunk
from .runner import EngineRunner, Handle, Submission
from .settings import EngineSimSettings

log = logging.getLogger(__name__)
T = TypeVar("T")
CLIENT_CLOSED = 499


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


class DisconnectAwareStream(StreamingResponse):
    """Streams while listening for the client's disconnect (on every ASGI spec version), so a
    request still queued in the engine, with no token to send yet, is aborted at once."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:

            async def body() -> None:
                with contextlib.suppress(OSError):
                    await self.stream_response(send)
                tg.cancel_scope.cancel()

            tg.start_soon(body)
            await self.listen_for_disconnect(receive)
            tg.cancel_scope.cancel()


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None if the client went away first."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(gone())
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watch):
            t.cancel()
    return task.result() if task in done else None


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"the request body is not valid JSON ({exc}); send a JSON object") from None


def _runner(request: Request) -> EngineRunner:
    runner: EngineRunner = request.app.state.runner
    return runner


def _engine_down(runner: EngineRunner) -> ApiError:
    reason = runner.error or "stopped"
    return ApiError(
        f"the engine is not running ({reason}); retry on another replica",
        503,
        err_type="ServiceUnavailableError",
    )


def _check_model(model: str | None, runner: EngineRunner) -> None:
    if model is not None and model != runner.model_name:
        raise ApiError(
            f"The model `{model}` does not exist. Valid aliases: {runner.model_name}.",
            404,
            err_type="NotFoundError",
            param="model",
        )


async def _generate(request: Request, *, chat: bool) -> Response:
    runner = _runner(request)
    try:
        body: Any = parse_body(ChatBody if chat else CompletionBody, await _json(request))
        _check_model(body.model, runner)
        if chat:
            prompt_tokens, key = chat_prompt_of(body)
            wanted = body.max_completion_tokens or body.max_tokens
        else:
            prompt_tokens, key = prompt_tokens_of(body)
            wanted = body.max_tokens
        max_tokens, output_tokens = resolve_lengths(body, prompt_tokens, wanted, runner.max_model_len, key)
        tags = runner.trusted(decode_xargs(body.vllm_xargs), body.vllm_xargs)
        tool_fn = tool_calls.named_function(body) if chat else None
        if body.stream_options is not None and not body.stream:
            raise ApiError("Stream options can only be defined when `stream=True`.", param="stream_options")
        if not runner.alive:
            raise _engine_down(runner)
    except ApiError as exc:
        return _error(exc)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{request.headers.get('x-request-id') or uuid.uuid4().hex}"
    if rid in runner.live:
        rid = f"{rid}-{uuid.uuid4().hex[:8]}"
    h = runner.submit(Submission(rid, prompt_tokens, output_tokens, max_tokens, tags, body.priority))
    shape = Shape(rid, int(time.time()), runner.model_name, chat)
    if body.stream:
        opts = body.stream_options
        stream = _stream(
            runner,
            h,
            shape,
            key,
            include_usage=bool(opts and opts.include_usage),
            continuous=bool(opts and opts.continuous_usage_stats),
            tool_fn=tool_fn,
        )
        return DisconnectAwareStream(stream, media_type="text/event-stream")
    try:
        result = await _unless_disconnected(request, _collect(h))
    finally:
        if h.finish_reason is None:
            runner.abort(h.request_id)
    if result is None:
        return Response(status_code=CLIENT_CLOSED)
    n, reason = result
    if tool_fn is not None:
        args = tool_calls.arguments(tool_fn, key)
        answer = full_response(shape, "", reason, prompt_tokens, n)
        return JSONResponse(tool_calls.message_with_call(answer, tool_calls.call(rid, tool_fn, args)))
    text = "".join(tokens.filler_words(key, n))
    return JSONResponse(full_response(shape, text, reason, prompt_tokens, n))


async def _collect(h: Handle) -> tuple[int, str]:
    total = 0
    while True:
        n, _, reason = await h.events.get()
        total += n
        if reason is not None:
            return total, reason


async def _stream(
    runner: EngineRunner,
    h: Handle,
    shape: Shape,
    key: bytes,
    *,
    include_usage: bool,
    continuous: bool,
    tool_fn: dict[str, Any] | None = None,
) -> AsyncIterator[bytes]:
    prompt_tokens = h.sub.prompt_tokens
    sent = 0
    args = tool_calls.arguments(tool_fn, key) if tool_fn is not None else ""
    try:
        if shape.chat:
            yield sse(role_chunk(shape, usage(prompt_tokens, 0, details=False) if continuous else None))
        if tool_fn is not None:
            head = role_chunk(shape)
            head.pop("choices")
            opening = tool_calls.call(shape.response_id, tool_fn, "")
            yield sse(tool_calls.delta_chunk(head, {"index": 0, **opening}, None))
        while True:
            n, _, reason = await h.events.get()
            # a client that fell behind gets the tokens that piled up in one chunk, as vLLM merges them
            while reason is None and not h.events.empty():
                more, _, reason = h.events.get_nowait()
                n += more
            if tool_fn is not None:  # the arguments in pieces, in step with the tokens generated
                total = max(1, h.sub.output_tokens)
                done_before, sent = sent, sent + n
                cut_from = min(len(args), len(args) * done_before // total)
                cut_to = len(args) if reason is not None else min(len(args), len(args) * sent // total)
                piece = {"index": 0, "function": {"arguments": args[cut_from:cut_to]}}
                yield sse(tool_calls.delta_chunk(head, piece, reason))
                if reason is not None:
                    break
                continue
            text = "".join(tokens.filler_words(key, n, sent))
            sent += n
            if continuous:
                yield sse(chunk(shape, text, reason, usage_now=usage(prompt_tokens, sent, details=False)))
            else:
                yield shape.text_event(text, reason)
            if reason is not None:
                break
        if include_usage:
            yield sse(usage_chunk(shape, prompt_tokens, sent))
        yield sse("[DONE]")
    finally:
        if h.finish_reason is None:
            runner.abort(h.request_id)


async def completions(request: Request) -> Response:
    return await _generate(request, chat=False)


async def chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


async def models(request: Request) -> Response:
    runner = _runner(request)
    name = runner.model_name
    card = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": name,
            "parent": None, "max_model_len": runner.max_model_len, "permission": []}  # fmt: skip
    return JSONResponse({"object": "list", "data": [card]})


async def tokenize(request: Request) -> Response:
    runner = _runner(request)
    try:
        raw = await _json(request)
        if not isinstance(raw, dict) or ("prompt" in raw) == ("messages" in raw):
            raise ApiError("send exactly one of 'prompt' (a string) or 'messages' (a chat)")
        _check_model(raw.get("model"), runner)
        if "prompt" in raw:
            if not isinstance(raw["prompt"], str):
                raise ApiError("prompt: must be a string")
            ids = tokens.token_ids(
                raw["prompt"], add_special_tokens=bool(raw.get("add_special_tokens", True))
            )
        else:
            chat = parse_body(ChatBody, {"messages": raw["messages"]})
            try:
                ids = tokens.chat_token_ids([(m.role, message_text(m.content)) for m in chat.messages])
            except ValueError as exc:
                raise ApiError(f"messages: {exc}") from None
    except ApiError as exc:
        return _error(exc)
    return JSONResponse(
        {"count": len(ids), "max_model_len": runner.max_model_len, "tokens": ids, "token_strs": None}
    )


async def health(request: Request) -> Response:
    runner = _runner(request)
    if not runner.alive:
        return _error(_engine_down(runner))
    return Response(status_code=200)


async def version(_request: Request) -> Response:
    return JSONResponse({"version": "engine-sim"})


async def metrics(request: Request) -> Response:
    engine_metrics: EngineMetrics = request.app.state.metrics
    return Response(generate_latest(engine_metrics.registry), media_type=CONTENT_TYPE_LATEST)


def create_app(settings: EngineSimSettings | None = None) -> Starlette:
    """The app; the engine task starts with the app's lifespan (``app.state.runner`` holds it)."""
    runner = EngineRunner(settings or EngineSimSettings())
    engine_metrics = EngineMetrics(runner)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await runner.start()
        log.info(
            "engine-sim: model=%s profile=%s policy=%s speedup=%g max_model_len=%d",
            runner.model_name,
            runner.profile.name,
            runner.policy.name,
            runner.settings.speedup,
            runner.max_model_len,
        )
        try:
            yield
        finally:
            await runner.stop()

    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/version", version, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.runner = runner
    app.state.metrics = engine_metrics
    return app
