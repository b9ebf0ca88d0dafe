"""One request, one decision: the router's own intake, admission and dispatch, without the proxy.

:func:`pick` runs exactly what the router's ``/v1/*completions`` handler runs before it opens an upstream
connection (body checks, API key → tenant, tier binding and stripping, the tenant's rate limit, the
capability filters and routing policy, the policy's infeasible handling) and returns the chosen pod or
the :class:`APIError` the router would have answered. The routing pipeline is reached through
:func:`_route` only, so moving it into core is a one-line change there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

from slo_core.policies.base import RequestView
from slo_core.wire.headers import INTERNAL_PREFIX
from slo_router import app as router_app
from slo_router.endpoints import EndpointState
from slo_router.enginetags import program_start_unix_s, tagged_body
from slo_router.errors import APIError
from slo_router.intake import (
    affinity_of,
    upstream_headers,
)

ROUTED_PATHS = ("/v1/chat/completions", "/v1/completions")


@dataclass(frozen=True, slots=True)
class Picked:
    """Where the gateway sends the request, and what it sends there."""

    endpoint: EndpointState
    address: str  # <ip:port> of the pod's HTTP front (the sidecar; engine mode: vLLM itself)
    view: RequestView
    tier: str
    tenant: str
    model: str
    set_headers: dict[str, str]  # the router's upstream headers (bound tier, tenant, SLO, request id)
    body: bytes  # the body with slofleet's SLO fields stripped, as the router forwards it


def address_of(ep: EndpointState) -> str:
    """``host:port`` of the pod's HTTP front, the form the endpoint-picker protocol carries."""
    parts = urlsplit(ep.spec.http_url)
    if not parts.hostname or parts.port is None:
        raise ValueError(f"endpoint {ep.spec.endpoint_id} has no host:port in {ep.spec.http_url!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}"


def _request(method: str, path: str, headers: Iterable[tuple[str, str]], body: bytes) -> Request:
    """A Starlette request carrying what Envoy sent, so the router's intake functions read it as-is."""
    sent = False

    async def receive() -> dict[str, object]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode("latin-1", "replace"),
        "query_string": b"",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1", "replace")) for k, v in headers],
    }
    return Request(scope, receive)


def _safe_address(ep: EndpointState) -> str | None:
    try:
        return address_of(ep)
    except ValueError:
        return None


async def pick(
    state: router_app.RouterState,
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    subset: frozenset[str] | None = None,
) -> Picked:
    """The pod for this request, or the router's own :class:`APIError` (400/401/404/429/503).

    ``subset``: the ``ip:port`` list the gateway allows (the protocol's subset hint); None: any pod.
    """
    if method != "POST" or path.split("?", 1)[0] not in ROUTED_PATHS:
        raise APIError(404, f"the endpoint picker routes POST {' and '.join(ROUTED_PATHS)} only")
    not_yet = state.not_serving_yet("picker")
    if not_yet is not None:
        raise not_yet
    request = _request(method, path, headers.items(), body)
    labels = ["", "", ""]
    adm = await router_app.admit(state, request, labels, id_prefix="epp")
    parsed, model, tenant, slo, tier, view = adm.body, adm.model, adm.tenant, adm.slo, adm.tier, adm.view
    request_id = view.request_id
    affinity = affinity_of(state, request, parsed, slo)
    endpoints = [ep for ep in state.endpoints.values() if subset is None or _safe_address(ep) in subset]
    result = router_app.route_once(
        state, view, endpoints, model=model, tier=tier, affinity=affinity, labels=labels
    )
    tier, view = labels[0], result.request
    ep = result.endpoint
    if ep is None:
        code = "no_capacity"
        state.metrics.rejects.labels(*labels, code).inc()
        raise APIError(
            503,
            f"no pod can serve this request in time: {result.decision.reason or 'no replica available'}",
            kind="overloaded_error",
            code=code,
            retry_after_s=result.decision.retry_after_s or 1.0,
        )
    state.metrics.chosen.labels(ep.spec.endpoint_id).inc()
    if result.affinity:
        state.metrics.affinity_hits.labels(result.affinity).inc()
    ep.note_sent(view, state.clock())
    started = program_start_unix_s(view, clock=state.clock)
    set_headers = upstream_headers(
        slo, tier, tenant, request_id, state.tag_keys, program_start_unix_s=started
    )
    forward = router_app.body_to_forward(state, adm)
    if ep.spec.mode == "engine":  # the gateway sends to vLLM itself: the SLO rides as signed tags
        out = tagged_body(forward, view, tier, state.tag_keys, clock=state.clock, stages=slo.stages)
    else:
        out = _json_bytes(forward)
    return Picked(
        endpoint=ep,
        address=address_of(ep),
        view=view,
        tier=tier,
        tenant=tenant.name,
        model=model,
        set_headers=set_headers,
        body=out,
    )


def _json_bytes(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def client_internal_headers(headers: Mapping[str, str]) -> list[str]:
    """Headers a client sent under slofleet's internal prefix: the gateway must drop them."""
    return [k for k in headers if k.lower().startswith(INTERNAL_PREFIX)]
