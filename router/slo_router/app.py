"""The router's ASGI app: OpenAI-compatible front door with tiers, tenants and gain-based dispatch.

Every request that enters ends in a response or an explicit error: 400 (malformed body or SLO
fields), 401 (unknown key), 429 (tenant rate limit, with Retry-After), 503 (no pod can serve it in
time, with Retry-After), or the pod's own answer. Errors are OpenAI-shaped and built in one place
(:func:`error_response`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from slo_core.policies.base import RequestView, RouterPolicy
from slo_core.policies.registry import make_router_policy
from slo_core.policies.seed_estimates import first_token_due_s
from slo_core.slo import RequestKind
from slo_core.wire.request_slo import strip_slo_fields
from slo_router.accounting import respond
from slo_router.config import RouterConfig
from slo_router.dispatch import DispatchResult, SessionTable, dispatch
from slo_router.endpoints import EndpointState
from slo_router.errors import APIError, error_response
from slo_router.intake import (
    affinity_of,
    authenticate,
    read_body,
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
from slo_router.ratelimit import RateLimiter
from slo_router.tenants import KeyStore

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 12


@dataclass
class RouterState:
    """Everything the handlers share, built once in the app factory."""

    config: RouterConfig
    keys: KeyStore
    endpoints: dict[str, EndpointState]
    metrics: RouterMetrics
    policy: RouterPolicy
    limiter: RateLimiter = field(default_factory=RateLimiter)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    client: aiohttp.ClientSession | None = None  # upstream pool, built in the lifespan when not given
    upstream_timeout_s: float = 600.0
    clock: Callable[[], float] = time.monotonic
    background: list[Any] = field(default_factory=list)
    sessions: SessionTable = field(default_factory=SessionTable)
    catalog: dict[str, str] = field(default_factory=dict)
    # False while a policy the router must follow (``--policy-name``) has not been read yet: not ready
    policy_loaded: bool = True
    policy_source: str = ""

    def usable_endpoints(self) -> list[EndpointState]:
        return [ep for ep in self.endpoints.values() if ep.usable]

    def apply_config(self, config: RouterConfig, source: str = "") -> None:
        """Switch to a new policy (tiers, tenants, routing); requests already dispatched are unaffected.

        The routing policy is built first, so a config it rejects (``ValueError``) changes nothing.
        """
        policy = make_router_policy(config.routing_policy, config.routing_params)
        self.config, self.policy = config, policy
        self.policy_loaded = True
        self.policy_source = source


async def completions(request: Request) -> Response | RelayResponse:
    state: RouterState = request.app.state.router
    labels = ["", "", ""]
    try:
        return await _serve(state, request, labels)
    except APIError as err:
        state.metrics.rejects.labels(*labels, err.code or str(err.status)).inc()
        return error_response(err)


async def _serve(state: RouterState, request: Request, labels: list[str]) -> Response | RelayResponse:
    if not state.policy_loaded:  # no tiers or tenants to bind the caller to yet
        raise APIError(
            503,
            f"the router has not read SLOPolicy {state.policy_source or '(unnamed)'} yet; retry shortly",
            kind="server_error",
            code="policy_not_loaded",
            retry_after_s=5.0,
        )
    body = await read_body(request)
    tenant, slo, tier, targets = resolve(state, request, body)
    model = body["model"]
    labels[:] = [tier, tenant.name, model]
    request_id = request.headers.get("x-request-id") or f"rtr-{uuid.uuid4().hex[:16]}"
    view = request_view(request_id, targets, state.clock(), body=body, tenant=tenant, slo=slo)
    wait = state.limiter.check(
        tenant.name, tenant.requests_per_s, tenant.tokens_per_s, view.prompt_tokens + view.max_tokens
    )
    if wait is not None:
        raise APIError(
            429,
            f"rate limit of tenant {tenant.name!r} exceeded",
            kind="rate_limit_error",
            code="rate_limited",
            retry_after_s=wait,
        )
    forward_body = json.dumps(strip_slo_fields(body), separators=(",", ":")).encode()
    affinity = affinity_of(state, request, body, slo)
    tried: set[str] = set()
    last_reason = "no replica available"
    retry_after: float | None = 1.0
    retry_until = _retry_until_s(state.config, view)
    for _attempt in range(MAX_ATTEMPTS):
        t0 = time.perf_counter()
        result = dispatch(
            view,
            model,
            list(state.endpoints.values()),
            state.policy,
            now_s=state.clock(),
            rng=state.rng,
            exclude=frozenset(tried),
            gpu_classes=state.config.tier_gpu_classes.get(tier, frozenset()),
            affinity=affinity,
            sessions=state.sessions,
            shuffle=state.config.shuffle_ties,
        )
        state.metrics.dispatch_seconds.labels(state.policy.name).observe(time.perf_counter() - t0)
        if result.infeasible and not tried:
            tier, view, result = _on_infeasible(state, tier, view, result, model=model, labels=labels)
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
        state.metrics.chosen.labels(ep_id).inc()
        for rid, score in result.decision.scores:
            state.metrics.estimated_gain.labels(rid).set(score)
        if result.affinity:
            state.metrics.affinity_hits.labels(result.affinity).inc()
        tried.add(ep_id)
        ep.note_sent(view, state.clock())
        assert state.client is not None
        try:
            opening = open_upstream(
                state.client,
                ep.spec.http_url + request.url.path,
                forward_body,
                upstream_headers(slo, tier, tenant, request_id),
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


def _on_infeasible(
    state: RouterState, tier: str, view: RequestView, result: DispatchResult, *, model: str, labels: list[str]
) -> tuple[str, RequestView, DispatchResult]:
    """No pod gains from the request: honest early 503, the best-effort tier, or admit (per policy)."""
    cfg = state.config
    if cfg.overload_to_best_effort and cfg.best_effort_tier and tier != cfg.best_effort_tier:
        be = cfg.best_effort_tier
        targets = cfg.tiers[be].targets()
        view = dataclasses.replace(
            view, slo=targets, deadline_at_s=view.arrival_s + targets.effective_deadline_s
        )
        state.metrics.downgraded.labels(*labels).inc()
        labels[0] = be
        again = dispatch(
            view,
            model,
            list(state.endpoints.values()),
            state.policy,
            now_s=state.clock(),
            rng=state.rng,
            gpu_classes=cfg.tier_gpu_classes.get(be, frozenset()),
            shuffle=cfg.shuffle_ties,
        )
        return be, view, again
    if cfg.reject_infeasible:
        soonest = _retry_hint_s(view)
        decision = dataclasses.replace(
            result.decision,
            replica_id=None,
            reason="no replica can meet this request's SLO now (estimated from the pods' state)",
            retry_after_s=soonest,
        )
        return tier, view, dataclasses.replace(result, endpoint=None, decision=decision)
    return tier, view, result


def _retry_until_s(config: RouterConfig, view: RequestView) -> float:
    """Until when pods that were busy or unreachable may be tried again: half the time to the first
    token's due time, at most ``retry_budget_s`` after arrival."""
    due_s = first_token_due_s(view) - view.arrival_s
    return view.arrival_s + min(config.retry_budget_s, 0.5 * max(0.0, due_s))


def _retry_hint_s(view: RequestView) -> float:
    """Retry-After for an infeasible request: about one TTFT (or a deadline's tenth), at least 1 s."""
    slo = view.slo
    hint = slo.ttft_s if slo.kind is RequestKind.LATENCY else (slo.deadline_s or 10.0) / 10.0
    return max(1.0, hint or 1.0)


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
    data = [
        {"id": n, "object": "model", "created": 0, "owned_by": owner} for n, owner in sorted(names.items())
    ]
    return JSONResponse({"object": "list", "data": data})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    state: RouterState = request.app.state.router
    n = len(state.usable_endpoints())
    state.metrics.endpoints_ready.set(n)
    ok = n > 0 and state.policy_loaded
    body: dict[str, Any] = {"ready": ok, "endpoints": n, "policy_loaded": state.policy_loaded}
    if state.policy_source:
        body["policy"] = state.policy_source
    return JSONResponse(body, status_code=200 if ok else 503)


async def metrics(request: Request) -> Response:
    state: RouterState = request.app.state.router
    state.metrics.endpoints_ready.set(len(state.usable_endpoints()))
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def create_app(
    state: RouterState, *, background: list[Callable[[RouterState], Any]] | None = None
) -> Starlette:
    """App factory: the state is built by the caller and shared by every handler."""

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

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        lifespan=lifespan,
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
