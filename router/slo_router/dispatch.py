"""Dispatch: capability filters first, then the routing policy over the survivors' state snapshots.

Filters (in order, each rejection reason counted): served model or LoRA adapter, context length ≥
prompt + output bound, usable (ready, circuit closed, healthy). The policy (GoRouting by default)
then picks among the survivors from their sidecars' streamed snapshots, which carry their own
timestamps so the policy can compensate for their age. No survivor → a reject with a reason.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from slo_core.policies.base import RequestView, RouteDecision, RouterPolicy
from slo_router.endpoints import EndpointState


@dataclass(frozen=True, slots=True)
class DispatchResult:
    endpoint: EndpointState | None
    decision: RouteDecision
    filtered: dict[str, int]


def serves_model(ep: EndpointState, model: str) -> bool:
    spec = ep.spec
    return not spec.models or model in spec.models or model in spec.lora_adapters


def dispatch(
    request: RequestView,
    model: str,
    endpoints: Sequence[EndpointState],
    policy: RouterPolicy,
    *,
    now_s: float,
    rng: random.Random,
    exclude: frozenset[str] = frozenset(),
) -> DispatchResult:
    filtered = {"model": 0, "context": 0, "unhealthy": 0, "excluded": 0}
    need = request.prompt_tokens + (request.output_bound or request.max_tokens)
    survivors: list[EndpointState] = []
    for ep in endpoints:
        if ep.spec.endpoint_id in exclude:
            filtered["excluded"] += 1
        elif not serves_model(ep, model):
            filtered["model"] += 1
        elif ep.spec.max_context_tokens < need:
            filtered["context"] += 1
        elif not ep.usable:
            filtered["unhealthy"] += 1
        else:
            survivors.append(ep)
    if not survivors:
        reason = _no_survivor_reason(filtered, model, need)
        return DispatchResult(None, RouteDecision(None, reason=reason, retry_after_s=1.0), filtered)
    views = [ep.replica_view(now_s) for ep in survivors]
    decision = policy.route(request, views, now_s, rng)
    chosen = next((ep for ep in survivors if ep.spec.endpoint_id == decision.replica_id), None)
    if decision.replica_id is not None and chosen is None:
        raise RuntimeError(f"routing policy {policy.name!r} chose unknown replica {decision.replica_id!r}")
    return DispatchResult(chosen, decision, filtered)


def _no_survivor_reason(filtered: dict[str, int], model: str, need: int) -> str:
    if filtered["unhealthy"] or filtered["excluded"]:
        return "no healthy replica can take this request now"
    if filtered["context"]:
        return f"no replica serves a context of {need} tokens (prompt + max output) for model {model!r}"
    return f"no replica serves model {model!r}"
