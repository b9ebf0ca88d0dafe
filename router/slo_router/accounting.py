"""Answering the client from the pod's response, and accounting the outcome per tier/tenant/model.

Streams are relayed as they arrive (:class:`slo_router.proxy.RelayResponse`); a non-streaming answer
is read whole while watching for the client to go away (then the upstream request is closed, which
aborts it in the pod) and passed through byte for byte. Every request that reached a pod is counted
once: outcome, TTFT, goodput tokens and whether it met its SLO.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from slo_core.gain import Delivery, request_goodput
from slo_core.policies.base import RequestView
from slo_core.wire import openai
from slo_core.wire.request_slo import SERVED_TIER_HEADER
from slo_net.upstream import UpstreamError, UpstreamResponse
from slo_router.proxy import ClientGone, RelayResponse, StreamStats, unless_disconnected
from slo_router.state import RouterState

PASSTHROUGH_HEADERS = ("content-type", "retry-after", "x-request-id")


async def respond(
    state: RouterState,
    request: Request,
    resp: UpstreamResponse,
    *,
    stream: bool,
    labels: tuple[str, str, str],
    view: RequestView,
    on_finish: Callable[[], None],
) -> Response | RelayResponse:
    """Relay the pod's answer; ``on_finish`` runs once when the request is over, however it ends. The
    answer says which tier served the request (``labels[0]``: after binding and any demotion)."""
    stats = StreamStats(start_s=view.arrival_s)
    status = resp.status

    def done(s: StreamStats) -> None:
        on_finish()
        account(state, labels, view, s, status)

    passthrough = {k: v for k, v in resp.headers.items() if k.lower() in PASSTHROUGH_HEADERS}
    passthrough[SERVED_TIER_HEADER] = labels[0]
    if stream and status == 200:
        return RelayResponse(resp, stats, passthrough, done, state.clock)
    try:
        raw = await unless_disconnected(request.receive, resp.read())
    except ClientGone:
        stats.error = "client disconnected"
        done(stats)
        return Response(b"", status_code=499)
    except (TimeoutError, UpstreamError) as exc:
        stats.error = f"upstream failed: {type(exc).__name__}"
        done(stats)
        body = openai.error_body("the serving pod failed while answering", kind="upstream_error", code=502)
        return Response(
            json.dumps(body),
            status_code=502,
            media_type="application/json",
            headers={SERVED_TIER_HEADER: labels[0]},
        )
    finally:
        resp.close()
    if status == 200:
        try:
            stats.observe_json(json.loads(raw), state.clock())
        except ValueError:
            stats.error = "invalid upstream JSON"
    else:
        stats.error = f"status {status}"
    done(stats)
    return Response(raw, status_code=status, headers=passthrough)


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
    m.of(m.requests, *labels, outcome).inc()
    times = stats.delivered_times()
    if times:
        m.of(m.ttft, labels[0]).observe(times[0] - view.arrival_s)
    delivery = Delivery(
        slo=view.slo,
        arrival_s=view.arrival_s,
        input_tokens=stats.prompt_tokens or view.prompt_tokens,
        token_times_s=times,
        completed=stats.completed and not stats.error,
    )
    m.of(m.goodput_tokens, *labels).inc(state.config.objective(delivery))
    if delivery.completed:
        m.of(m.slo_met if request_goodput(delivery) > 0 else m.slo_missed, *labels).inc()
