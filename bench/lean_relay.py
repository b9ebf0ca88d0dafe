"""The floor: a minimal reverse proxy that relays bytes without parsing them (aiohttp server + client).

Every per-token cost of the router and the sidecar is measured against this process in the same run
(bench/path_overhead.py). It forwards method, path, body and content-type to one upstream and copies
the response back chunk by chunk as it arrives; a client that goes away closes the upstream request.

    .venv/bin/python bench/lean_relay.py --port 8300 --upstream http://127.0.0.1:8200 [--uvloop]

The floor runs on asyncio's own event loop; ``--uvloop`` (the loop the router and the sidecar run on)
shows how much of a hop's margin over the floor is the loop's. ``--stack`` swaps the server and the
client for the stacks the router could be built on, the same relay otherwise (bench/relay_stacks.py
compares them side by side):

- ``aiohttp``: aiohttp's server and client (the floor);
- ``asgi-aiohttp``: a raw ASGI app on uvicorn + httptools + uvloop (the router's server), aiohttp's client;
- ``asgi-slonet``: the same server with :mod:`slo_net.upstream` (the router's and sidecar's client).
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import uvicorn
from aiohttp import web

from slo_net.upstream import UpstreamPool


def make_app(upstream: str) -> web.Application:
    async def relay(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        async with session.request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as up:
            resp = web.StreamResponse(status=up.status, headers={"content-type": up.content_type})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        app["session"] = aiohttp.ClientSession(
            # idle connections dropped as the router drops them (slo_router.proxy.KEEPALIVE_S), before the
            # engine's 5 s keep-alive closes them under a request (aiohttp's 15 s default lost requests
            # to "Server disconnected" after an idle spell)
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=600),
        )
        yield
        await app["session"].close()

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


def make_asgi_app(upstream: str, client: str) -> Any:
    """The same relay as a raw ASGI app (no framework): read the body, post it, relay each read."""
    pool: Any = None

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal pool
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                pool = (
                    UpstreamPool(keepalive_s=2.0)
                    if client == "slonet"
                    else aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0),
                        timeout=aiohttp.ClientTimeout(total=None, sock_read=600),
                    )
                )
                await send({"type": "lifespan.startup.complete"})
            await pool.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {"content-type": "application/json"}
        start = {"type": "http.response.start", "headers": [(b"content-type", b"text/event-stream")]}
        if client == "slonet":
            resp = await pool.post(upstream + scope["path"], body, headers, read_timeout_s=600)
            try:
                await send({**start, "status": resp.status})
                while chunk := await resp.readany():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finally:
                resp.close()
        else:
            async with pool.post(upstream + scope["path"], data=body, headers=headers) as up:
                await send({**start, "status": up.status})
                async for chunk in up.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="base URL to relay to")
    p.add_argument("--uvloop", action="store_true", help="run on uvloop instead of asyncio's loop")
    p.add_argument("--stack", choices=("aiohttp", "asgi-aiohttp", "asgi-slonet"), default="aiohttp")
    args = p.parse_args()
    if args.stack != "aiohttp":
        app = make_asgi_app(args.upstream.rstrip("/"), args.stack.removeprefix("asgi-"))
        uvicorn.run(app, host=args.host, port=args.port, loop="uvloop", http="httptools", log_level="warning")
        return
    loop = None
    if args.uvloop:
        import uvloop

        loop = uvloop.new_event_loop()
    web.run_app(make_app(args.upstream.rstrip("/")), host=args.host, port=args.port, print=None, loop=loop)


if __name__ == "__main__":
    main()
