"""A stand-in pod for router tests and benchmarks: OpenAI-shaped answers plus a gRPC State stream.

It speaks the sidecar's two faces and nothing else: ``POST /v1/completions`` and
``/v1/chat/completions`` (streaming SSE or one JSON body; ``max_tokens`` tokens after ``ttft_s``, one
every ``tbt_s``) and ``State.Watch`` / ``State.Snapshot`` reporting the requests it holds. It has no
model and no scheduler; it is what the router sees of a pod, with knobs to fail: a status before the
first byte (``fail_status``), or dropping the connection after ``die_after_tokens`` tokens.

Run one: ``python -m slo_lab.fakepod --http-port 8101 --grpc-port 9101 --models m``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from slo_core.wire.keepalive import SERVER_OPTIONS
from slo_proto import slofleet_pb2, slofleet_pb2_grpc


@dataclass
class PodBehaviour:
    ttft_s: float = 0.01
    tbt_s: float = 0.002
    fail_status: int | None = None
    die_after_tokens: int | None = None
    healthy: bool = True


@dataclass
class _Live:
    request_id: str
    tier: str
    prompt_tokens: int
    max_tokens: int
    arrival_unix_s: float
    generated: int = 0


@dataclass
class FakePod:
    name: str
    models: tuple[str, ...] = ("m",)
    max_context_tokens: int = 8192
    gpu_class: str = "fake"
    behaviour: PodBehaviour = field(default_factory=PodBehaviour)
    live: dict[str, _Live] = field(default_factory=dict)
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    served: int = 0

    # ------------------------------------------------------------------------------------ HTTP

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self._complete, methods=["POST"]),
                Route("/v1/chat/completions", self._complete, methods=["POST"]),
                Route("/health", lambda r: JSONResponse({"status": "ok"}), methods=["GET"]),
            ]
        )

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        self.seen_headers.append(dict(request.headers))
        b = self.behaviour
        if b.fail_status is not None:
            return JSONResponse({"error": {"message": "fake failure"}}, status_code=b.fail_status)
        chat = request.url.path.endswith("chat/completions")
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        text = json.dumps(body.get("messages") if chat else body.get("prompt"))
        live = _Live(
            rid,
            request.headers.get("x-slo-tier", ""),
            max(1, len(text) // 4),
            int(body.get("max_tokens") or 16),
            time.time(),
        )
        if body.get("stream"):
            return StreamingResponse(self._stream(live, chat, body["model"]), media_type="text/event-stream")
        self.live[rid] = live
        try:
            await asyncio.sleep(b.ttft_s + b.tbt_s * (live.max_tokens - 1))
        finally:
            self.live.pop(rid, None)
        self.served += 1
        choice: dict[str, Any] = (
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x" * live.max_tokens},
                "finish_reason": "length",
            }
            if chat
            else {"index": 0, "text": "x" * live.max_tokens, "finish_reason": "length"}
        )
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [choice],
                "usage": {
                    "prompt_tokens": live.prompt_tokens,
                    "completion_tokens": live.max_tokens,
                    "total_tokens": live.prompt_tokens + live.max_tokens,
                },
            }
        )

    async def _stream(self, live: _Live, chat: bool, model: str) -> AsyncIterator[bytes]:
        b = self.behaviour
        self.live[live.request_id] = live
        try:
            await asyncio.sleep(b.ttft_s)
            for i in range(live.max_tokens):
                if b.die_after_tokens is not None and i >= b.die_after_tokens:
                    raise ConnectionAbortedError("fake pod died mid-stream")
                if i:
                    await asyncio.sleep(b.tbt_s)
                live.generated = i + 1
                if chat:
                    choice: dict[str, Any] = {"index": 0, "delta": {"content": "x"}, "finish_reason": None}
                    obj = "chat.completion.chunk"
                else:
                    choice, obj = {"index": 0, "text": "x", "finish_reason": None}, "text_completion"
                chunk = {
                    "id": live.request_id,
                    "object": obj,
                    "created": 0,
                    "model": model,
                    "choices": [choice],
                }
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            self.served += 1
            yield b"data: [DONE]\n\n"
        finally:
            self.live.pop(live.request_id, None)

    # ------------------------------------------------------------------------------------ gRPC

    def pod_state(self) -> Any:
        reqs = [
            slofleet_pb2.RequestState(
                request_id=r.request_id,
                kind="best-effort",
                tier=r.tier,
                priority_weight=1.0,
                phase="decode" if r.generated else "waiting",
                prompt_tokens=r.prompt_tokens,
                generated_tokens=r.generated,
                output_bound=r.max_tokens,
                arrival_unix_s=r.arrival_unix_s,
            )
            for r in list(self.live.values())
        ]
        return slofleet_pb2.PodState(
            pod=self.name,
            snapshot_unix_s=time.time(),
            healthy=self.behaviour.healthy,
            waiting=sum(1 for r in reqs if r.phase == "waiting"),
            running=sum(1 for r in reqs if r.phase != "waiting"),
            outstanding_tokens=sum(r.output_bound - r.generated_tokens for r in reqs),
            capabilities=slofleet_pb2.Capabilities(
                models=list(self.models), max_context_tokens=self.max_context_tokens, gpu_class=self.gpu_class
            ),
            requests=reqs,
            step_time_correction=1.0,
        )


class _StateServicer(slofleet_pb2_grpc.StateServicer):
    def __init__(self, pod: FakePod) -> None:
        self.pod = pod

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        interval_s = max(0.005, (request.interval_ms or 50) / 1000.0)
        while True:
            yield self.pod.pod_state()
            await asyncio.sleep(interval_s)

    async def Snapshot(self, request: Any, context: Any) -> Any:
        return self.pod.pod_state()


def _bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


class ServedApp:
    """Any ASGI app served by uvicorn on a loopback port inside the current event loop."""

    def __init__(self, app: Any, port: int = 0) -> None:
        self.app = app
        self._sock = _bind(port)
        self.port = self._sock.getsockname()[1]
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        config = uvicorn.Config(self.app, log_level="warning", lifespan="auto", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        # _serve, not serve: an in-process server must leave the process's signal handlers alone (serve
        # installs its own and restores what it found, so servers stopped out of order leak one)
        self._task = asyncio.create_task(self._server._serve(sockets=[self._sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)

    async def stop(self, *, abort: bool = False) -> None:
        """Stop; with ``abort`` open connections are cut at once (a crash, as clients see it)."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            if abort:
                self._server.force_exit = True
                for conn in list(getattr(self._server.server_state, "connections", ())):
                    conn.transport.abort()
            await asyncio.wait({self._task}, timeout=5)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._server = None
        self._sock.close()

    async def __aenter__(self) -> ServedApp:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class RunningPod:
    """A fake pod served on loopback inside the current event loop (``async with``)."""

    def __init__(self, pod: FakePod, http_port: int = 0, grpc_port: int = 0) -> None:
        self.pod = pod
        self._http = ServedApp(pod.app(), http_port)
        self.http_port = self._http.port
        self._grpc_port_wanted = grpc_port
        self.grpc_port = 0
        self._grpc: Any = None

    @property
    def url(self) -> str:
        return self._http.url

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    async def __aenter__(self) -> RunningPod:
        self._grpc = grpc.aio.server(options=list(SERVER_OPTIONS))
        slofleet_pb2_grpc.add_StateServicer_to_server(_StateServicer(self.pod), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port(f"127.0.0.1:{self._grpc_port_wanted}")
        await self._grpc.start()
        await self._http.start()
        return self

    async def kill(self) -> None:
        """Stop abruptly: open streams are cut, the state stream ends, new connections are refused."""
        if self._grpc is not None:
            await self._grpc.stop(grace=None)
            self._grpc = None
        await self._http.stop(abort=True)

    async def __aexit__(self, *exc: object) -> None:
        await self.kill()


async def _main(args: argparse.Namespace) -> None:
    pod = FakePod(
        args.name,
        models=tuple(args.models.split(",")),
        behaviour=PodBehaviour(ttft_s=args.ttft_s, tbt_s=args.tbt_s),
    )
    async with RunningPod(pod, args.http_port, args.grpc_port):
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="fake")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--models", default="m")
    parser.add_argument("--ttft-s", type=float, default=0.01)
    parser.add_argument("--tbt-s", type=float, default=0.002)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
