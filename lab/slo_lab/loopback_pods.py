"""Fake pods for router tests: a handler written with httpx types, served over a real loopback socket.

The router's upstream client is an aiohttp session; tests describe a pod's answer as an
``httpx.Response`` built by a plain function of the ``httpx.Request`` (status, headers, JSON, or an
async byte stream). :class:`LoopbackPods` serves that function on 127.0.0.1 and its resolver sends
every pod host name (``http://a.pod``) there, so the router runs its real network path. A handler
that raises makes the pod drop the connection (a refused/broken pod); a stream that raises drops it
mid-body.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import weakref
from collections.abc import Callable
from typing import ClassVar

import aiohttp
import httpx
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

Handler = Callable[[httpx.Request], httpx.Response]


class LoopbackPods(AbstractResolver):
    """One loopback server answering for every pod host; use :meth:`session` as the router's client."""

    live: ClassVar[weakref.WeakSet[LoopbackPods]] = weakref.WeakSet()

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._lock = asyncio.Lock()
        self._sessions: list[aiohttp.ClientSession] = []
        LoopbackPods.live.add(self)

    def session(self) -> aiohttp.ClientSession:
        s = aiohttp.ClientSession(connector=_LoopbackOnly(self), auto_decompress=False)
        self._sessions.append(s)
        return s

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        await self._start()
        return [
            ResolveResult(
                hostname=host, host="127.0.0.1", port=self._port, family=socket.AF_INET, proto=0, flags=0
            )
        ]

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


class _LoopbackOnly(aiohttp.TCPConnector):
    """Every destination, host name or IP literal (a test's pod IP such as 10.0.0.9), goes to the
    loopback server: a test never sends a packet off this machine."""

    def __init__(self, pods: LoopbackPods) -> None:
        super().__init__(resolver=pods, force_close=True)
        self._pods = pods

    async def _resolve_host(
        self, host: str, port: int, traces: object = None
    ) -> list[ResolveResult]:  # aiohttp skips the resolver for IP literals; this does not
        return await self._pods.resolve(host, port)


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
