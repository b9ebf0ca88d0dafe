"""What a request is before it is dispatched: its JSON body, its tenant (API key), its tier and SLO,
its size estimate, its affinity keys, and the headers it is forwarded with.

A tier the tenant is not allowed, any client-supplied ``x-slofleet-*`` header, and any engine tag a
client sets (``priority``, ``vllm_xargs``, ``slo_*``) is stripped and counted; the key itself is only
ever compared by digest (:mod:`slo_router.tenants`). The order is the cheap one: header size, then the
key (401 without reading the body), then the body within its size and nesting limits, then the model
(404 when no pod or ModelDeployment serves it) and ``max_tokens`` within the model's context.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from slo_core.policies.base import RequestView
from slo_core.predict.compound import routing_deadline_at_s
from slo_core.routing import Affinity, ProgramClock
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.headers import (
    INTERNAL_PREFIX,
    PROGRAM_START_HEADER,
    REQUEST_ID_HEADER,
    TENANT_HEADER,
    sign_headers,
)
from slo_core.wire.keyring import KeyRing
from slo_core.wire.limits import SAFE_TOKEN, check_headers, parse_json_object, read_capped, token_count
from slo_core.wire.request_slo import SLOParamError, SLORequest, parse_slo, to_headers
from slo_core.wire.tokens import estimate_body_prompt_tokens
from slo_router.errors import APIError
from slo_router.state import RouterState
from slo_router.tenants import Tenant

DEFAULT_MAX_TOKENS = 1024  # the size estimate when neither the client nor the model's context says more
UNKNOWN_CONTEXT = 1 << 30  # what an endpoint that declares no context length reports
OTHER_MODEL = "other"  # the metrics label of a model name the router does not know
PREFIX_AFFINITY_CHARS = 512
PREFIX_AFFINITY_MIN_CHARS = 64
_NO_HEADERS: dict[str, str] = {}


def max_tokens(body: dict[str, Any], prompt_tokens: int, context_tokens: int | None, limit: int) -> int:
    """The client's ``max_tokens`` within the model's context; without one, what vLLM would allow
    (the context left after the prompt), or a size estimate when the context is unknown."""
    bound = context_tokens if context_tokens is not None else limit
    asked = token_count(body, "max_tokens", bound)
    if asked is None:
        asked = token_count(body, "max_completion_tokens", bound)
    if asked is not None:
        return asked
    if context_tokens is None:
        return DEFAULT_MAX_TOKENS
    return max(1, context_tokens - prompt_tokens)


def known_models(state: RouterState) -> set[str] | None:
    """Every model name some pod or ModelDeployment serves; None when a pod serves any model."""
    names = set(state.catalog)
    for ep in state.endpoints.values():
        caps = ep.reported_capabilities()
        served = (*ep.spec.models, *ep.spec.lora_adapters)
        if caps is not None:
            served = (*served, *caps.models, *caps.lora_adapters)
        if not served:
            return None
        names.update(served)
    return names


def check_model(state: RouterState, model: str) -> str:
    """404 ``model_not_found`` for a model nobody serves; the model's metrics label otherwise."""
    known = known_models(state)
    if not known:  # a pod serves any model, or nothing is known yet (no pods: a 503 follows)
        return OTHER_MODEL
    if model not in known:
        raise APIError(
            404,
            f"the model {model[:200]!r} does not exist; GET /v1/models lists the models served here",
            param="model",
            code="model_not_found",
        )
    return model


def model_context_tokens(state: RouterState, model: str) -> int | None:
    """The longest context (prompt plus output, tokens) a pod serving ``model`` accepts; None if unknown."""
    best: int | None = None
    for ep in state.endpoints.values():
        caps = ep.reported_capabilities()
        served = (*ep.spec.models, *ep.spec.lora_adapters)
        if caps is not None:
            served = (*served, *caps.models, *caps.lora_adapters)
        if served and model not in served:
            continue
        length = min(ep.spec.max_context_tokens, caps.max_context_tokens if caps else UNKNOWN_CONTEXT)
        if length < UNKNOWN_CONTEXT:
            best = max(best or 0, length)
    return best


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


def upstream_headers(
    slo: SLORequest,
    tier: str,
    tenant: Tenant,
    request_id: str,
    keys: Callable[[], KeyRing] | None = None,
    *,
    program_start_unix_s: float | None = None,
) -> dict[str, str]:
    """The SLO as headers with the bound tier; the body's SLO fields are stripped before forwarding.
    With the tag key ring they are signed (the sidecar believes only signed ones).
    ``program_start_unix_s``: a compound call's program start (its first call at this router)."""
    headers = to_headers(slo.model_copy(update={"tier": tier}))
    headers.update(
        {
            "content-type": "application/json",
            "x-request-id": request_id,
            TENANT_HEADER: tenant.name,
        }
    )
    if program_start_unix_s is not None:
        headers[PROGRAM_START_HEADER] = repr(program_start_unix_s)
    if keys is not None:
        now_s = time.time()
        headers = sign_headers(headers, keys().signing_key(now_s), now_s)
    return headers


def engine_headers(request_id: str) -> dict[str, str]:
    """The headers of a request sent straight to an engine-mode pod: its SLO travels as signed tags in
    the body (:mod:`slo_router.enginetags`); the request id is the one the engine reports it by."""
    return {"content-type": "application/json", REQUEST_ID_HEADER: request_id}


def resolve(
    state: RouterState, request: Request, body: dict[str, Any], tenant: Tenant
) -> tuple[SLORequest, str, SLOTargets]:
    # most requests carry no x-slo* header at all: then neither the SLO headers nor the internal ones
    # need Starlette's decoded header view (one pass over the raw names instead of three decodes)
    any_slo_header = any(name[:5].lower() == b"x-slo" for name, _ in request.scope["headers"])
    headers = request.headers if any_slo_header else _NO_HEADERS
    stripped = [h for h in headers if h.lower().startswith(INTERNAL_PREFIX)]
    try:
        slo = parse_slo(headers, body)
    except SLOParamError as exc:
        raise APIError(400, str(exc), param=exc.param, code="invalid_slo") from None
    tier, was_stripped = tenant.bind_tier(slo.tier)
    targets = state.config.tiers[tier].targets(ttft_s=slo.ttft_s, tbt_s=slo.tbt_s, deadline_s=slo.deadline_s)
    tightened = any(  # stricter than the tier allows: raised to the tier's targets
        asked is not None and asked != got
        for asked, got in (
            (slo.ttft_s, targets.ttft_s),
            (slo.tbt_s, targets.tbt_s),
            (slo.deadline_s, targets.deadline_s),
        )
    )
    if was_stripped or stripped or tightened:
        state.metrics.stripped.labels(tenant.name).inc()
    return slo, tier, targets


async def read_request(state: RouterState, request: Request) -> tuple[Tenant, dict[str, Any], bytes]:
    """The caller's tenant and the JSON body (parsed, and as sent), in the cheap order: headers, key,
    then the body."""
    check_headers(request.scope["headers"], state.limits)
    tenant = authenticate(state, request)
    raw = await read_capped(request.stream(), request.headers.get("content-length"), state.limits)
    body = parse_json_object(raw, state.limits)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise APIError(400, "'model' is required and must be a string", param="model")
    return tenant, body, raw


def request_id_of(request: Request) -> str | None:
    """The client's request id when it is safe to forward as a header (printable ASCII, bounded)."""
    given = request.headers.get(REQUEST_ID_HEADER)
    return given if given and SAFE_TOKEN.fullmatch(given) else None


def request_view(
    request_id: str,
    targets: SLOTargets,
    now: float,
    *,
    body: dict[str, Any],
    tenant: Tenant,
    slo: SLORequest,
    context_tokens: int | None = None,
    max_tokens_limit: int = UNKNOWN_CONTEXT,
    programs: ProgramClock | None = None,
    stage_share: tuple[float, ...] | None = None,
) -> RequestView:
    """The request as the routing policy sees it. A compound call of a stated program is due when core's
    ``routing_deadline_at_s`` says, reckoned from the program's first call (``programs``) and the tier's
    ``stage_share``, as the simulator routes it; the pod's analyzer may narrow it for the engine."""
    deadline_at = (
        now + targets.deadline_s
        if targets.deadline_s
        else (now + targets.effective_deadline_s if targets.kind is RequestKind.BEST_EFFORT else None)
    )
    first: float | None = None
    if (
        targets.kind is RequestKind.COMPOUND
        and targets.deadline_s
        and slo.program_id
        and programs is not None
    ):
        first = programs.arrival_s(tenant.name, slo.program_id, now, targets.deadline_s)
        deadline_at = routing_deadline_at_s(
            first, targets.deadline_s, now, slo.stage, stages=slo.stages, tier_share=stage_share
        )
    prompt_tokens = estimate_body_prompt_tokens(body)  # the sidecar's count of the same body
    return RequestView(
        request_id=request_id,
        slo=targets,
        arrival_s=now,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens(body, prompt_tokens, context_tokens, max_tokens_limit),
        deadline_at_s=deadline_at,
        tenant=tenant.name,
        program_id=slo.program_id,
        stage=slo.stage,
        # the program as the simulator's views show it (its first call in the fleet); the pods get
        # the start in the signed tags or headers and date the program from it, not their first call
        program_arrival_s=first,
        program_deadline_at_s=first + targets.effective_deadline_s if first is not None else None,
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
