"""What a request is before it is dispatched: its JSON body, its tenant (API key), its tier and SLO,
its size estimate, its affinity keys, and the headers it is forwarded with.

A tier the tenant is not allowed, and any client-supplied ``x-slofleet-*`` header, is stripped and
counted; the key itself is only ever compared by digest (:mod:`slo_router.tenants`).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from slo_core.policies.base import RequestView
from slo_core.routing import Affinity
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.headers import INTERNAL_PREFIX
from slo_core.wire.request_slo import SLOParamError, SLORequest, parse_slo, to_headers
from slo_core.wire.tokens import approx_tokens
from slo_router.errors import APIError
from slo_router.state import RouterState
from slo_router.tenants import Tenant

DEFAULT_MAX_TOKENS = 1024
# No engine has a context this long; a larger max_tokens (10**400, say) is a 400, never arithmetic.
MAX_TOKENS_CEILING = 1 << 31
PREFIX_AFFINITY_CHARS = 512
PREFIX_AFFINITY_MIN_CHARS = 64


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """Rough prompt size (≈4 characters a token); the pod's sidecar counts exactly."""
    if "messages" in body:
        msgs = body["messages"]
        text = (
            "".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
            if isinstance(msgs, list)
            else ""
        )
    else:
        prompt = body.get("prompt", "")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return approx_tokens(text)


def max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    if value is None:
        return DEFAULT_MAX_TOKENS
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise APIError(400, "max_tokens must be a positive integer", param="max_tokens")
    if value > MAX_TOKENS_CEILING:
        raise APIError(400, f"max_tokens must be at most {MAX_TOKENS_CEILING}", param="max_tokens")
    return value


def model_context(endpoints: Any, model: str) -> int | None:
    """The longest context any known pod serving ``model`` offers (None: no pod states one)."""
    known = [
        ep.spec.max_context_tokens
        for ep in endpoints
        if (not ep.spec.models or model in ep.spec.models or model in ep.spec.lora_adapters)
        and ep.spec.max_context_tokens < (1 << 30)
    ]
    return max(known) if known else None


def bound_to_context(view: RequestView, context: int | None) -> None:
    """vLLM's own rule, applied before anything is charged: prompt plus max_tokens fit the context."""
    if context is not None and view.prompt_tokens + view.max_tokens > context:
        raise APIError(
            400,
            f"max_tokens {view.max_tokens} plus about {view.prompt_tokens} prompt tokens exceeds the "
            f"model's context of {context} tokens; lower max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )


def authenticate(state: RouterState, request: Request) -> Tenant:
    auth = request.headers.get("authorization", "")
    key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    if not key:
        if state.config.require_keys:
            raise APIError(
                401, "missing API key: send 'Authorization: Bearer <key>'", kind="authentication_error"
            )
        return state.config.anonymous()
    name = state.keys.tenant_of(key)
    if name is None:
        if not state.config.require_keys and len(state.keys) == 0:
            return state.config.anonymous()
        raise APIError(401, "invalid API key", kind="authentication_error", code="invalid_api_key")
    tenant = state.config.tenants.get(name)
    if tenant is None:
        raise APIError(
            401,
            f"API key belongs to tenant {name!r}, which the SLOPolicy does not define",
            kind="authentication_error",
        )
    return tenant


def upstream_headers(slo: SLORequest, tier: str, tenant: Tenant, request_id: str) -> dict[str, str]:
    """The SLO as headers with the bound tier; the body's SLO fields are stripped before forwarding."""
    headers = to_headers(slo.model_copy(update={"tier": tier}))
    headers.update(
        {
            "content-type": "application/json",
            "x-request-id": request_id,
            f"{INTERNAL_PREFIX}tenant": tenant.name,
        }
    )
    return headers


def resolve(
    state: RouterState, request: Request, body: dict[str, Any]
) -> tuple[Tenant, SLORequest, str, SLOTargets]:
    tenant = authenticate(state, request)
    stripped = [h for h in request.headers if h.lower().startswith(INTERNAL_PREFIX)]
    try:
        slo = parse_slo(request.headers, body)
    except SLOParamError as exc:
        raise APIError(400, str(exc), param=exc.param, code="invalid_slo") from None
    tier, was_stripped = tenant.bind_tier(slo.tier)
    if was_stripped or stripped:
        state.metrics.stripped.labels(tenant.name).inc()
    targets = state.config.tiers[tier].targets(ttft_s=slo.ttft_s, tbt_s=slo.tbt_s, deadline_s=slo.deadline_s)
    return tenant, slo, tier, targets


async def read_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise APIError(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise APIError(400, "'model' is required and must be a string", param="model")
    return body


def request_view(
    request_id: str, targets: SLOTargets, now: float, *, body: dict[str, Any], tenant: Tenant, slo: SLORequest
) -> RequestView:
    deadline_at = (
        now + targets.deadline_s
        if targets.deadline_s
        else (now + targets.effective_deadline_s if targets.kind is RequestKind.BEST_EFFORT else None)
    )
    return RequestView(
        request_id=request_id,
        slo=targets,
        arrival_s=now,
        prompt_tokens=estimate_prompt_tokens(body),
        max_tokens=max_tokens(body),
        deadline_at_s=deadline_at,
        tenant=tenant.name,
        program_id=slo.program_id,
        stage=slo.stage,
    )


def affinity_of(
    state: RouterState, request: Request, body: dict[str, Any], slo: SLORequest
) -> Affinity | None:
    wanted = state.config.affinity
    if not wanted:
        return None
    session = None
    if "session" in wanted:
        session = request.headers.get("x-session-id") or slo.program_id or body.get("user") or None
    prefix = None
    if "prefix" in wanted:
        text = json.dumps(body.get("messages") if "messages" in body else body.get("prompt"))
        prefix = text[:PREFIX_AFFINITY_CHARS] if len(text) >= PREFIX_AFFINITY_MIN_CHARS else None
    return Affinity(session=str(session) if session else None, prefix=prefix)
