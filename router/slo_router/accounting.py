"""Answering the client from the pod's response, and accounting the outcome per tier/tenant/model.

Streams are relayed as they arrive; a non-streaming answer is read whole while watching for the
client to go away (then the upstream request is closed, which aborts it in the pod). Every request
that reached a pod is counted once: outcome, TTFT, goodput tokens and whether it met its SLO.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from slo_core.gain import Delivery, request_goodput
from slo_core.policies.base import RequestView
from slo_core.wire import openai
from slo_router.proxy import StreamStats, relay_stream
from slo_router.state import RouterState

PASSTHROUGH_HEADERS = ("content-type", "retry-after", "x-request-id")


class ClientGone(Exception):
    """The client disconnected before the pod answered."""


async def _read_unless_disconnected(request: Request, resp: httpx.Response, poll_s: float = 0.25) -> bytes:
    reader = asyncio.ensure_future(resp.aread())
    try:
        while True:
            done, _ = await asyncio.wait({reader}, timeout=poll_s)
            if done:
                return reader.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await reader


async def respond(
    state: RouterState,
    request: Request,
    resp: httpx.Response,
    *,
    stream: bool,
    labels: tuple[str, str, str],
    view: RequestView,
    on_finish: Callable[[], None],
) -> Response:
    """Relay the pod's answer; ``on_finish`` runs once when the request is over, however it ends."""
    stats = StreamStats(start_s=view.arrival_s)

    def done(s: StreamStats) -> None:
        on_finish()
        account(state, labels, view, s, resp.status_code)

    passthrough = {k: v for k, v in resp.headers.items() if k.lower() in PASSTHROUGH_HEADERS}
    if stream and resp.status_code == 200:
        return StreamingResponse(relay_stream(resp, stats, done), status_code=200, headers=passthrough)
    try:
        raw = await _read_unless_disconnected(request, resp)
    except ClientGone:
        stats.error = "client disconnected"
        done(stats)
        return Response(b"", status_code=499)
    except httpx.HTTPError as exc:
        stats.error = f"upstream failed: {type(exc).__name__}"
        done(stats)
        body = openai.error_body("the serving pod failed while answering", kind="upstream_error", code=502)
        return Response(json.dumps(body), status_code=502, media_type="application/json")
    finally:
        await resp.aclose()
    if resp.status_code == 200:
        try:
            stats.observe_json(json.loads(raw), state.clock())
        except ValueError:
            stats.error = "invalid upstream JSON"
    else:
        stats.error = f"status {resp.status_code}"
    done(stats)
    return Response(raw, status_code=resp.status_code, headers=passthrough)


def account(
    state: RouterState, labels: tuple[str, str, str], view: RequestView, stats: StreamStats, status: int
) -> None:
    m = state.metrics
    if stats.completed and not stats.error:
        outcome = "ok"
    elif stats.error == "client disconnected":
        outcome = "cancelled"
    else:
        outcome = "error" if status == 200 else f"http_{status}"
    m.requests.labels(*labels, outcome).inc()
    times = stats.delivered_times()
    if times:
        m.ttft.labels(labels[0]).observe(times[0] - view.arrival_s)
    delivery = Delivery(
        slo=view.slo,
        arrival_s=view.arrival_s,
        input_tokens=stats.prompt_tokens or view.prompt_tokens,
        token_times_s=times,
        completed=stats.completed and not stats.error,
    )
    m.goodput_tokens.labels(*labels).inc(state.config.objective(delivery))
    if delivery.completed:
        (m.slo_met if request_goodput(delivery) > 0 else m.slo_missed).labels(*labels).inc()
