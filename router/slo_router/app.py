"""The router's ASGI app: OpenAI-compatible front door with tiers, tenants and gain-based dispatch.

Every request that enters ends in a response or an explicit error: 400 (malformed body or SLO
fields), 401 (unknown key), 429 (tenant rate limit, with Retry-After), 503 (no pod can serve it in
time, with Retry-After), or the pod's own answer. Errors are OpenAI-shaped and built in one place
(:func:`error_response`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from slo_core.policies.base import RequestView
from slo_core.policies.registry import make_router_policy
from slo_core.policies.seed_estimates import first_token_due_s
from slo_core.routing import Affinity, Routed
from slo_core.wire.api_description import DESCRIPTION_PATH, api_description
from slo_core.wire.request_slo import SLORequest, strip_slo_fields
from slo_core.wire.tags import strip_engine_tags
from slo_router.accounting import respond
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointState
from slo_router.enginetags import program_start_unix_s, with_tags
from slo_router.errors import APIError, error_response, exception_handlers, internal_error_response
from slo_router.intake import (
    affinity_of,
    authenticate,
    check_model,
    engine_headers,
    model_context_tokens,
    read_request,
    request_id_of,
    request_view,
    resolve,
    upstream_headers,
)
from slo_router.metrics import RouterMetrics
from slo_router.proxy import (
    ClientGone,
    RelayResponse,
    UpstreamUnavailable,
    new_session,
    open_upstream,
    unless_disconnected,
)
from slo_router.ratelimit import RequestTooLarge
from slo_router.state import RouterState
from slo_router.tenants import KeyStore, Tenant

__all__ = ["RouterState", "build_state", "create_app"]

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 12


async def completions(request: Request) -> Response | RelayResponse:
    state: RouterState = request.app.state.router
    labels = ["", "", ""]
    try:
        return await _serve(state, request, labels)
    except APIError as err:
        state.metrics.rejects.labels(*labels, err.code or str(err.status)).inc()
        return error_response(err)


async def _serve(state: RouterState, request: Request, labels: list[str]) -> Response | RelayResponse:
    not_yet = state.not_serving_yet()
    if not_yet is not None:
        raise not_yet
    adm = await admit(state, request, labels, id_prefix="rtr")
    body, model, tenant, slo, tier, view = adm.body, adm.model, adm.tenant, adm.slo, adm.tier, adm.view
    request_id = view.request_id
    forward = forward_json(adm, body_to_forward(state, adm))
    affinity = affinity_of(state, request, body, slo)
    tried: set[str] = set()
    last_reason = "no replica available"
    retry_after: float | None = 1.0
    retry_until = _retry_until_s(state.config, view)
    for _attempt in range(MAX_ATTEMPTS):
        result = route_once(
            state,
            view,
            list(state.endpoints.values()),
            model=model,
            tier=tier,
            affinity=affinity,
            labels=labels,
            exclude=frozenset(tried),
            check_admission=not tried,  # pods already refused it: take what the policy picks
        )
        if result.outcome == "demoted":
            tier, view = labels[0], result.request
        ep = result.endpoint
        if ep is not None and len(tried) > state.config.max_retries:
            ep = None  # this pass tried enough pods
        if ep is None:
            if not tried:  # nothing was tried: the dispatcher's own reason; else the pods' answers stand
                last_reason = result.decision.reason or last_reason
                retry_after = max(retry_after or 0.0, result.decision.retry_after_s or 0.0) or None
                break
            # every pod this pass tried was busy or unreachable: wait and go round again while the
            # request's SLO leaves room (SLOs-Serve §4.2 re-routing, bounded in time)
            wait_s = min(max(0.2, retry_after or 0.0), 2.0) * (0.5 + state.rng.random())
            if state.clock() + wait_s > retry_until:
                break
            await asyncio.sleep(wait_s)
            tried.clear()
            continue
        ep_id = ep.spec.endpoint_id
        state.metrics.of(state.metrics.chosen, ep_id).inc()
        for rid, score in result.decision.scores:
            state.metrics.of(state.metrics.estimated_gain, rid).set(score)
        if result.affinity:
            state.metrics.affinity_hits.labels(result.affinity).inc()
        tried.add(ep_id)
        ep.note_sent(view, state.clock())
        assert state.client is not None
        if ep.spec.mode == "engine":  # straight to the engine: the SLO rides along as signed tags (the
            # engine reads no SLO header, so none is built or signed)
            body_bytes = with_tags(forward, view, tier, state.tag_keys, clock=state.clock, stages=slo.stages)
            headers = engine_headers(request_id)
        else:
            body_bytes = forward
            started = program_start_unix_s(view, clock=state.clock)
            headers = upstream_headers(
                slo, tier, tenant, request_id, state.tag_keys, program_start_unix_s=started
            )
        try:
            opening = open_upstream(
                state.client,
                ep.spec.http_url + request.scope["path"],  # one of the two completion routes
                body_bytes,
                headers,
                state.upstream_timeout_s,
            )
            # a client that hangs up while the pod has not answered yet aborts the upstream request
            resp = await unless_disconnected(request.receive, opening)
        except ClientGone:
            ep.forget_sent(request_id)
            state.metrics.requests.labels(*labels, "cancelled").inc()
            return Response(b"", status_code=499)
        except UpstreamUnavailable as exc:
            ep.forget_sent(request_id)
            if exc.kind not in ("http_503", "connect_timeout"):  # refused or broken: the pod is at fault
                ep.breaker.failure()
            last_reason = f"pod {ep_id}: {exc}"
            retry_after = max(retry_after or 0.0, exc.retry_after_s or 0.0) or None
            state.metrics.retries.labels(*labels).inc()
            state.metrics.upstream_failures.labels(ep_id, exc.kind).inc()
            await asyncio.sleep(min(0.05 * (2 ** len(tried)), 0.5))
            continue
        except BaseException:
            ep.forget_sent(request_id)
            raise
        ep.breaker.success()
        return await respond(
            state,
            request,
            resp,
            stream=bool(body.get("stream")),
            labels=(labels[0], labels[1], labels[2]),
            view=view,
            on_finish=functools.partial(ep.forget_sent, request_id),
        )
    raise APIError(
        503,
        f"no pod can serve this request in time: {last_reason}",
        kind="overloaded_error",
        code="no_capacity",
        retry_after_s=retry_after,
    )


@dataclass(frozen=True, slots=True)
class Admission:
    """A request the front door accepted: who sent it, what it asks for, its SLO, tier and size."""

    body: dict[str, Any]
    model: str
    tenant: Tenant
    slo: SLORequest
    tier: str
    view: RequestView
    raw: bytes = b""  # the body as the client sent it


async def admit(state: RouterState, request: Request, labels: list[str], *, id_prefix: str) -> Admission:
    """Intake and admission, in the cheap order: key, body within limits, model (404), tier and SLO
    bounded by the tier, size within the model's context, the tenant's rate. The HTTP front and the
    endpoint picker both call this; ``labels`` becomes (tier, tenant, model label) for metrics."""
    tenant, body, raw = await read_request(state, request)
    model = body["model"]
    labels[:] = ["", tenant.name, ""]
    labels[2] = check_model(state, model)
    slo, tier, targets = resolve(state, request, body, tenant)
    labels[0] = tier
    request_id = request_id_of(request) or f"{id_prefix}-{os.urandom(8).hex()}"
    view = request_view(
        request_id,
        targets,
        state.clock(),
        body=body,
        tenant=tenant,
        slo=slo,
        context_tokens=model_context_tokens(state, model),
        max_tokens_limit=state.limits.max_tokens_limit,
        programs=state.programs,
        stage_share=state.config.tiers[tier].stage_deadline_share,
    )
    charge_rate_limit(state, tenant, view)
    return Admission(body, model, tenant, slo, tier, view, raw)


def body_to_forward(state: RouterState, adm: Admission) -> dict[str, Any]:
    """The body a pod gets: without the client's SLO fields (they travel as headers) and without any
    engine tag (priority, vllm_xargs, slo_*) a client set; only slofleet sets those."""
    forward, dropped = strip_engine_tags(strip_slo_fields(adm.body))
    if dropped:
        state.metrics.stripped.labels(adm.tenant.name).inc()
    return forward


def forward_json(adm: Admission, forward: dict[str, Any]) -> bytes:
    """The body a pod gets, encoded: the client's own bytes when nothing was stripped from it (a relay
    does not decode and encode again what it passes on; the parsed body was checked and is what the
    pod will parse), else ``forward`` encoded."""
    # stripping only ever removes top-level keys; a body in UTF-16/32 or after a byte-order mark (JSON
    # allows them) is encoded again, as UTF-8
    if len(forward) == len(adm.body) and adm.raw.lstrip(b" \t\r\n")[:1] == b"{" and b"\0" not in adm.raw[:4]:
        return adm.raw
    return json.dumps(forward, separators=(",", ":")).encode()


def charge_rate_limit(state: RouterState, tenant: Tenant, view: RequestView) -> None:
    """The tenant's request and token buckets (fleet-wide share): 429 to wait, 400 if it can never fit."""
    try:
        wait = state.limiter.check(
            tenant.name, tenant.requests_per_s, tenant.tokens_per_s, view.prompt_tokens + view.max_tokens
        )
    except RequestTooLarge as exc:  # can never fit this tenant's burst: a 4xx, nothing charged
        raise APIError(
            400,
            f"request of tenant {tenant.name!r} too large for its token rate: {exc}; lower max_tokens",
            param="max_tokens",
            code="request_too_large",
        ) from None
    if wait is not None:
        raise APIError(
            429,
            f"rate limit of tenant {tenant.name!r} exceeded",
            kind="rate_limit_error",
            code="rate_limited",
            retry_after_s=wait,
        )


def route_once(
    state: RouterState,
    view: RequestView,
    endpoints: list[EndpointState],
    *,
    model: str,
    tier: str,
    affinity: Affinity | None,
    labels: list[str],
    exclude: frozenset[str] = frozenset(),
    check_admission: bool = True,
) -> Routed[EndpointState]:
    """One pass of core's routing pipeline for this request (the HTTP front and the endpoint picker
    both route through here); a demotion to best effort is counted and written into ``labels[0]``."""
    t0 = time.perf_counter()
    result = state.pipeline.route(
        view,
        endpoints,
        now_s=state.clock(),
        rng=state.rng,
        model=model,
        exclude=exclude,
        gpu_classes=state.config.tier_gpu_classes.get(tier, frozenset()),
        demoted_gpu_classes=_demoted_gpu_classes(state.config),
        affinity=affinity,
        sessions=state.sessions,
        check_admission=check_admission,
    )
    state.metrics.of(state.metrics.dispatch_seconds, state.policy.name).observe(time.perf_counter() - t0)
    if result.outcome == "demoted":
        state.metrics.downgraded.labels(*labels).inc()
        labels[0] = state.config.best_effort_tier or tier
    return result


def _demoted_gpu_classes(cfg: RouterConfig) -> frozenset[str]:
    be = cfg.best_effort_tier
    return cfg.tier_gpu_classes.get(be, frozenset()) if be is not None else frozenset()


def _retry_until_s(config: RouterConfig, view: RequestView) -> float:
    """Until when pods that were busy or unreachable may be tried again: half the time to the first
    token's due time, at most ``retry_budget_s`` after arrival."""
    due_s = first_token_due_s(view) - view.arrival_s
    return view.arrival_s + min(config.retry_budget_s, 0.5 * max(0.0, due_s))


async def models(request: Request) -> Response:
    state: RouterState = request.app.state.router
    try:
        authenticate(state, request)
    except APIError as err:
        return error_response(err)
    names: dict[str, str] = dict(state.catalog)
    for ep in state.endpoints.values():
        for name in (*ep.spec.models, *ep.spec.lora_adapters):
            names.setdefault(name, ep.spec.deployment or "slofleet")
    data: list[dict[str, Any]] = []
    for n, owner in sorted(names.items()):
        entry: dict[str, Any] = {"id": n, "object": "model", "created": 0, "owned_by": owner}
        context = model_context_tokens(state, n)
        if context is not None:  # as vLLM lists it
            entry["max_model_len"] = context
        data.append(entry)
    return JSONResponse({"object": "list", "data": data})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    state: RouterState = request.app.state.router
    n = len(state.usable_endpoints())
    state.metrics.endpoints_ready.set(n)
    # ?engines=optional: ready once started up (policy and key Secrets read, engine pods listed and
    # their state streams tried once; the chart's probe: a router with no engine answers 503 +
    # Retry-After itself instead of leaving the Service)
    engines_optional = request.query_params.get("engines") == "optional"
    ok = (n > 0 or engines_optional) and state.settled()
    body: dict[str, Any] = {"ready": ok, "endpoints": n, "policy_loaded": state.policy_loaded}
    if not state.keys_loaded:
        body["keys_loaded"] = False
    if not state.endpoints_listed:
        body["endpoints_listed"] = False
    if state.policy_source:
        body["policy"] = state.policy_source
    return JSONResponse(body, status_code=200 if ok else 503)


async def description(request: Request) -> Response:
    """The OpenAPI description of this surface, under the limits this router enforces (no secrets)."""
    state: RouterState = request.app.state.router
    return JSONResponse(api_description(state.limits, door="router"))


async def metrics(request: Request) -> Response:
    state: RouterState = request.app.state.router
    state.metrics.endpoints_ready.set(len(state.usable_endpoints()))
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def create_metrics_app(state: RouterState) -> Starlette:
    """``/metrics`` alone, for a port the public Service does not expose (metrics name tenants)."""
    app = Starlette(
        routes=[Route("/metrics", metrics, methods=["GET"])], exception_handlers=exception_handlers()
    )
    app.state.router = state
    return app


async def serve_metrics(state: RouterState, host: str, port: int) -> None:
    """Background job: serve :func:`create_metrics_app` on its own port until cancelled."""
    app = create_metrics_app(state)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
    try:
        await server._serve()
    finally:
        server.should_exit = True


class _RouterApp(Starlette):
    """Starlette, except that the two completion routes are served without its middleware stack,
    whose wrappers would otherwise sit on every relayed chunk's way to the client; everything else
    (and a mounted app, ``root_path``) goes through Starlette as before."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in _COMPLETION_PATHS
            and not scope.get("root_path")
        ):
            scope["app"] = self
            request = Request(scope, receive)
            try:
                response = await completions(request)
            except Exception as exc:  # what Starlette's catch-all does: a logged, OpenAI-shaped 500
                response = await internal_error_response(request, exc)
            await response(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


_COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


def create_app(
    state: RouterState,
    *,
    background: list[Callable[[RouterState], Any]] | None = None,
    metrics_route: bool = True,
) -> Starlette:
    """App factory: the state is built by the caller and shared by every handler.

    ``metrics_route=False`` leaves ``/metrics`` off the public app (``slofleet router --metrics-port``
    serves it on its own port instead, see :func:`serve_metrics`).
    """

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        own_client = state.client is None
        if own_client:
            state.client = new_session()
        tasks = [asyncio.create_task(job(state)) for job in background or []]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if own_client and state.client is not None:
                await state.client.close()
                state.client = None

    app = _RouterApp(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
            Route(DESCRIPTION_PATH, description, methods=["GET"]),
            *([Route("/metrics", metrics, methods=["GET"])] if metrics_route else []),
        ],
        lifespan=lifespan,
        exception_handlers=exception_handlers(),
    )
    app.state.router = state
    return app


def build_state(
    config: RouterConfig,
    keys: KeyStore,
    endpoints: dict[str, EndpointState],
    metrics_: RouterMetrics | None = None,
) -> RouterState:
    return RouterState(
        config=config,
        keys=keys,
        endpoints=endpoints,
        metrics=metrics_ or RouterMetrics(),
        policy=make_router_policy(config.routing_policy, config.routing_params),
    )
