"""The sidecar's HTTP front: OpenAI-compatible completions and chat (streaming or not), health, metrics.

The status of an answer is decided at the request's first event: a token (200, then the stream or
the whole body), or an error (4xx/5xx, OpenAI-shaped, with Retry-After on 429/503). A request that has
not produced its first token within the pod's maximum wait gets 503 (408 if the client asked for a
shorter wait); a client that disconnects while its
request waits or streams cancels it (and the upstream request with it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from slo_core.wire import openai
from slo_core.wire.api_description import DESCRIPTION_PATH, api_description
from slo_core.wire.limits import RequestLimits, check_headers, parse_json_object, read_capped
from slo_sidecar.calibration import PEER_PATH, state_endpoint
from slo_sidecar.errors import (
    APIError,
    error_event,
    error_response,
    exception_handlers,
    internal_error_response,
    overloaded,
)
from slo_sidecar.front import CHAT, COMPLETION
from slo_sidecar.job import Event, Job
from slo_sidecar.service import Sidecar
from slo_sidecar.streaming import full_response, sse, usage_chunk

_POLL_S = 0.25


class _ClientGone(Exception):
    pass


async def _next_event(job: Job, request: Request, until_s: float, sc: Sidecar) -> Event | None:
    """The job's next event; None when ``until_s`` passes first; raises _ClientGone on disconnect."""
    while True:
        if not job.events.empty():
            return job.events.get_nowait()
        left = until_s - sc.now()
        if left <= 0:
            return None
        try:
            return await asyncio.wait_for(job.events.get(), timeout=min(_POLL_S, left))
        except TimeoutError:
            if await request.is_disconnected():
                raise _ClientGone from None


async def _wait_disconnect(receive: Receive) -> None:
    """Returns when the server reports the client gone (the request body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class _JobStream:
    """A streaming answer, as a plain ASGI response (no generator, no per-chunk middleware).

    The chunks queued before it started go out first (piled-up ones in one write); then the job's
    sink is installed and the generation task writes each chunk straight to the client. This waits
    only for the end event. A disconnect watcher cancels the generation the moment the client goes
    away; however it ends (normal, error or disconnect), the job ends exactly once.
    """

    def __init__(self, sc: Sidecar, job: Job, task: asyncio.Task[None], first: Event) -> None:
        self.sc, self.job, self.task, self.first = sc, job, task, first
        self.status = "aborted"
        self._ending = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        me = asyncio.current_task()
        watcher = asyncio.ensure_future(_wait_disconnect(receive))

        def hang_up(w: asyncio.Future[None]) -> None:
            # the server reports "disconnect" after a complete response too: not a hang-up then
            if not w.cancelled() and w.exception() is None and not self._ending and me is not None:
                self.task.cancel()
                me.cancel()

        watcher.add_done_callback(hang_up)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            await self._stream(send)
        except (asyncio.CancelledError, OSError):
            if not watcher.done():  # cancelled by the server, not by the client leaving: propagate
                raise
            if me is not None and me.cancelling():
                me.uncancel()  # the hang-up's own cancellation, handled here
        finally:
            watcher.remove_done_callback(hang_up)
            watcher.cancel()
            self.job.sink = None
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.sc.end(self.job, self.status)

    async def _stream(self, send: Send) -> None:
        job, event = self.job, self.first

        async def write(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        while event[0] == "chunk":
            pending, after = [event[1]], None  # chunks that piled up before the stream started: one write
            while after is None and not job.events.empty():
                queued = job.events.get_nowait()
                if queued[0] == "chunk":
                    pending.append(queued[1])
                else:
                    after = queued
            await write(b"".join(pending) if len(pending) > 1 else pending[0])
            if after is not None:
                event = after
            elif job.events.empty():
                job.sink = write  # from here on, the generation task writes each chunk itself
                event = await job.events.get()  # the generation task always ends with done or error
            else:
                event = job.events.get_nowait()
        self._ending = True
        if event[0] == "done":
            tail = (sse(usage_chunk(job)) if job.parsed.include_usage else b"") + openai.SSE_DONE
            self.status = "ok"
        else:
            tail = error_event(event[1])
            self.status = "error"
        await send({"type": "http.response.body", "body": tail, "more_body": False})


_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]


async def _serve(sc: Sidecar, request: Request, job: Job) -> Response | _JobStream:
    task = asyncio.create_task(sc.generate(job))
    sc.scheduler.submit(job)
    status, err = "aborted", None
    try:
        event = await _next_event(job, request, job.live.arrival_s + job.live.max_wait_s, sc)
        if event is None:
            status, err = "rejected", _wait_exceeded(sc, job)
            return error_response(err)
        if event[0] == "error":
            err = event[1]
            status = "rejected" if err.status in (429, 503) and not job.live.started else "error"
            return error_response(err)
        if job.parsed.stream:
            stream = _JobStream(sc, job, task, event)
            task = None  # type: ignore[assignment]  # the stream owns it now
            return stream
        deadline = job.live.arrival_s + sc.knobs.request_timeout_s
        while event is not None and event[0] == "chunk":
            event = await _next_event(job, request, deadline, sc)
        if event is None:
            status, err = (
                "error",
                APIError(
                    504, "the request ran past its time limit", kind="timeout_error", code="request_timeout"
                ),
            )
            return error_response(err)
        if event[0] == "error":
            err = event[1]
            status = "rejected" if err.status in (429, 503) and not job.live.started else "error"
            return error_response(err)
        status = "ok"
        if job.response_body is not None:  # the engine's own answer, byte for byte
            return Response(job.response_body, media_type="application/json")
        return JSONResponse(full_response(job))
    except _ClientGone:
        return Response(status_code=499)
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            sc.end(job, status, err)


def _wait_exceeded(sc: Sidecar, job: Job) -> APIError:
    """Not started in time: 503 (retry later) when the wait was this pod's own maximum; 408 when it was a
    shorter wait the client asked for (x-slo-max-wait-s), which is the client's condition, not a fault."""
    wait_s = job.live.max_wait_s
    if wait_s < sc.config.max_wait_s:
        return APIError(
            408,
            f"not started within the maximum wait of {wait_s:g} s this request asked for; allow a longer "
            "max_wait_s (x-slo-max-wait-s) or none",
            kind="timeout_error",
            param="max_wait_s",
            code="max_wait_exceeded",
        )
    return overloaded(
        f"not started within the maximum wait of {wait_s:g} s; retry later",
        "wait_exceeded",
        sc.scheduler.retry_after_s(),
    )


def _handler(endpoint: str) -> Callable[[Request], Awaitable[Response | _JobStream]]:
    async def handle(request: Request) -> Response | _JobStream:
        sc: Sidecar = request.app.state.sidecar
        limits = limits_of(sc)
        try:
            check_headers(request.scope["headers"], limits)
            raw = await read_capped(request.stream(), request.headers.get("content-length"), limits)
            body = parse_json_object(raw, limits)
            job = await sc.accept(request.headers, body, endpoint)
        except openai.APIError as exc:
            err = (
                exc
                if isinstance(exc, APIError)
                else APIError(exc.status, exc.message, param=exc.param, code=str(exc.code))
            )
            sc.note_reject(err, *err.labels)
            return error_response(err)
        return await _serve(sc, request, job)

    return handle


async def models(request: Request) -> Response:
    sc: Sidecar = request.app.state.sidecar
    names = sc.engine.models or ([sc.knobs.model_name] if sc.knobs.model_name else [])
    data = [
        {
            "id": n,
            "object": "model",
            "created": 0,
            "owned_by": "slofleet",
            "max_model_len": sc.context_tokens(),
        }
        for n in names
    ]
    return JSONResponse({"object": "list", "data": data})


async def health(request: Request) -> Response:
    """Alive: 200 while the process serves; says what is wrong with the config or the engine."""
    sc: Sidecar = request.app.state.sidecar
    return JSONResponse(
        {
            "status": "ok",
            "mode": sc.knobs.mode,
            "policy": sc.config.policy_name,
            "config_digest": sc.config.digest,
            "config_error": sc.config_error or None,
            "engine_healthy": sc.engine.healthy,
            "engine_error": sc.engine.error or None,
            "predictor": sc.estimator_source,
            "draining": sc.draining,
            "in_flight": len(sc.jobs),
            "history_rows": sc.history.total_rows,
        }
    )


async def ready(request: Request) -> Response:
    """Ready to take traffic: the engine answers and the pod is not draining."""
    sc: Sidecar = request.app.state.sidecar
    ok = sc.engine.healthy and not sc.draining
    reason = "draining" if sc.draining else (sc.engine.error or "")
    return JSONResponse({"ready": ok, "reason": reason or None}, status_code=200 if ok else 503)


def limits_of(sc: Sidecar) -> RequestLimits:
    """The limits this sidecar enforces now (max_tokens: the model's context)."""
    k = sc.knobs
    return RequestLimits(k.max_body_bytes, k.max_header_bytes, k.max_json_depth, sc.context_tokens())


async def description(request: Request) -> Response:
    """The OpenAPI description of this surface, under the limits this sidecar enforces."""
    return JSONResponse(api_description(limits_of(request.app.state.sidecar), door="sidecar"))


async def metrics(request: Request) -> Response:
    sc: Sidecar = request.app.state.sidecar
    sc.update_gauges()
    return Response(generate_latest(sc.metrics.registry), media_type=CONTENT_TYPE_LATEST)


ENGINE_METRICS_TIMEOUT_S = 5.0
ENGINE_METRICS_PATH = "/metrics/engine"


async def engine_metrics(request: Request) -> Response:
    """vLLM's own ``/metrics``, relayed: Prometheus scrapes it beside slofleet's while the engine's port
    (which also serves the unauthenticated OpenAI API) stays reachable only inside the pod."""
    sc: Sidecar = request.app.state.sidecar
    if sc.client is None:
        return Response("engine client not started\n", status_code=503, media_type="text/plain")
    try:
        resp = await sc.client.get(sc.engine_url + "/metrics", timeout=ENGINE_METRICS_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return Response(f"engine metrics unavailable: {type(exc).__name__}\n", 502, media_type="text/plain")
    if resp.status_code != 200:
        return Response(f"engine metrics answered {resp.status_code}\n", 502, media_type="text/plain")
    return Response(resp.content, media_type=resp.headers.get("content-type", CONTENT_TYPE_LATEST))


def create_metrics_app(sc: Sidecar) -> Starlette:
    """``/metrics`` (and vLLM's, relayed) alone, for a port the pod's Service does not expose."""
    app = Starlette(
        routes=[
            Route("/metrics", metrics, methods=["GET"]),
            Route(ENGINE_METRICS_PATH, engine_metrics, methods=["GET"]),
        ],
        exception_handlers=exception_handlers(),
    )
    app.state.sidecar = sc
    return app


class _SidecarApp(Starlette):
    """Starlette, except that the two completion routes are served without its middleware stack,
    whose wrappers would otherwise sit on every streamed chunk's way to the client; everything else
    (and a mounted app, ``root_path``) goes through Starlette as before."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            handle = _COMPLETIONS.get(scope["path"])
            if handle is not None:
                scope["app"] = self
                request = Request(scope, receive)
                try:
                    response = await handle(request)
                except Exception as exc:  # what Starlette's catch-all does: a logged, OpenAI-shaped 500
                    response = await internal_error_response(request, exc)
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


_COMPLETIONS = {"/v1/chat/completions": _handler(CHAT), "/v1/completions": _handler(COMPLETION)}


def create_calibration_app(sc: Sidecar) -> Starlette:
    """The peers' calibration route alone, for a port only the ModelDeployment's engine pods reach."""
    app = Starlette(routes=[Route(PEER_PATH, state_endpoint, methods=["GET"])])
    app.state.sidecar = sc
    return app


def create_app(
    sc: Sidecar,
    lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]] | None = None,
    *,
    metrics_route: bool = True,
    calibration_route: bool = True,
) -> Starlette:
    """App factory: the sidecar core is built by the caller and shared by every handler
    (``metrics_route=False``: ``/metrics`` is served on its own port, see ``--metrics-port``;
    ``calibration_route=False``: the peers' calibration route is, see ``--calibration-port``)."""
    app = _SidecarApp(
        routes=[
            Route("/v1/chat/completions", _COMPLETIONS["/v1/chat/completions"], methods=["POST"]),
            Route("/v1/completions", _COMPLETIONS["/v1/completions"], methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
            Route(DESCRIPTION_PATH, description, methods=["GET"]),
            *([Route("/metrics", metrics, methods=["GET"])] if metrics_route else []),
            *([Route(ENGINE_METRICS_PATH, engine_metrics, methods=["GET"])] if metrics_route else []),
            *([Route(PEER_PATH, state_endpoint, methods=["GET"])] if calibration_route else []),
        ],
        lifespan=lifespan,
        exception_handlers=exception_handlers(),
    )
    app.state.sidecar = sc
    return app
