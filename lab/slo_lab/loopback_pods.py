"""Fake pods for router tests: a handler written with httpx types, served over a real loopback socket.

The router's upstream client is a :class:`~slo_net.upstream.UpstreamPool`; tests describe a pod's
answer as an ``httpx.Response`` built by a plain function of the ``httpx.Request`` (status, headers,
JSON, or an async byte stream). :class:`LoopbackPods` serves that function on 127.0.0.1 and the pools
it hands out send every pod host name (``http://a.pod``) there, so the router runs its real network
path. A handler that raises makes the pod drop the connection (a refused/broken pod); a stream that
raises drops it mid-body.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable
from typing import ClassVar

import httpx
from aiohttp import web

from slo_net.upstream import UpstreamPool
from slo_router.proxy import KEEPALIVE_S

Handler = Callable[[httpx.Request], httpx.Response]


class LoopbackPods:
    """One loopback server answering for every pod host; use :meth:`session` as the router's client."""

    live: ClassVar[weakref.WeakSet[LoopbackPods]] = weakref.WeakSet()

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._lock = asyncio.Lock()
        self._sessions: list[UpstreamPool] = []
        LoopbackPods.live.add(self)

    def session(self) -> UpstreamPool:
        """The router's upstream pool, with every pod host name or IP literal (a test's pod IP such as
        10.0.0.9) sent to the loopback server: a test never sends a packet off this machine."""
        s = UpstreamPool(keepalive_s=KEEPALIVE_S, resolve=self._address)
        self._sessions.append(s)
        return s

    async def _address(self, host: str, port: int) -> tuple[str, int]:
        await self._start()
        return "127.0.0.1", self._port

    async def close(self) -> None:
        for s in self._sessions:
            await s.close()
        self._sessions.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _start(self) -> None:
        async with self._lock:
            if self._runner is not None:
                return
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._serve)
            runner = web.AppRunner(
                app, handle_signals=False, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
            )
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self._port = int(runner.addresses[0][1])
            self._runner = runner

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        req = httpx.Request(
            request.method,
            f"http://{request.host}{request.path_qs}",
            headers=list(request.headers.items()),
            content=body,
        )
        try:
            resp = self.handler(req)
        except Exception:
            _drop(request)
            raise
        out = web.StreamResponse(status=resp.status_code, headers=_headers(resp))
        await out.prepare(request)
        try:
            try:
                await out.write(resp.content)  # built from json=/content=: already in memory
            except httpx.ResponseNotRead:
                async for chunk in resp.aiter_raw():  # a stream: chunk by chunk, as a pod streams
                    await out.write(chunk)
                    await asyncio.sleep(0)
        except Exception:
            _drop(request)
            raise
        await out.write_eof()
        return out


def _headers(resp: httpx.Response) -> dict[str, str]:
    skip = {"content-length", "transfer-encoding", "connection"}
    return {k: v for k, v in resp.headers.items() if k.lower() not in skip}


def _drop(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.abort()


async def close_all() -> None:
    """Stop every loopback server still running (a test fixture calls this after each test)."""
    for pods in list(LoopbackPods.live):
        await pods.close()
