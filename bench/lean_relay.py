"""The floor: a minimal reverse proxy that relays bytes without parsing them (aiohttp server + client).

Every per-token cost of the router and the sidecar is measured against this process in the same run
(bench/path_overhead.py). It forwards method, path, body and content-type to one upstream and copies
the response back chunk by chunk as it arrives; a client that goes away closes the upstream request.

    .venv/bin/python bench/lean_relay.py --port 8300 --upstream http://127.0.0.1:8200 [--uvloop]

The floor runs on asyncio's own event loop; ``--uvloop`` (the loop the router and the sidecar run on)
shows how much of a hop's margin over the floor is the loop's.
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="base URL to relay to")
    p.add_argument("--uvloop", action="store_true", help="run on uvloop instead of asyncio's loop")
    args = p.parse_args()
    loop = None
    if args.uvloop:
        import uvloop

        loop = uvloop.new_event_loop()
    web.run_app(make_app(args.upstream.rstrip("/")), host=args.host, port=args.port, print=None, loop=loop)


if __name__ == "__main__":
    main()
