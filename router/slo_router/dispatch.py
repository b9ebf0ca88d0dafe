"""Dispatch: capability filters first, then the routing policy over the survivors' state snapshots.

Filters (in order, each rejection reason counted): served model or LoRA adapter, context length ≥
prompt + output bound, GPU class (when the tier restricts it), usable (ready, circuit closed, state
stream live, healthy, not draining). The policy (GoRouting by default) then picks among the survivors
from their sidecars' streamed snapshots, which carry their own timestamps so the policy can compensate
for their age. A policy that scores pods by estimated gain (GoRouting's Δ_p) also tells when *no* pod
gains from the request; a policy may also decline it (no replica) or send it to best effort itself
(SLOs-Serve's re-routing backup). Then the request is infeasible (``infeasible=True``) and the caller
answers an honest early 503 or moves it to the best-effort tier (SLOs-Serve §4.2's backup policy).

Affinity (optional) keeps a session, or requests sharing a prompt prefix, on one pod as long as that
pod is among the policy's candidates (Δ_p ≥ α·Δ_max, or any survivor for policies without scores).
The prefix pod is chosen by rendezvous hashing, so router replicas agree without talking.
Survivors are offered to the policy in a random order (the injected rng), so a policy's ties (GoRouting's
argmin over equally idle pods) do not send every request to the first pod listed.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from slo_core.policies.base import ReplicaCapabilities, RequestView, RouteDecision, RouterPolicy
from slo_core.slo import RequestKind
from slo_router.endpoints import EndpointState

FILTERS = ("excluded", "model", "context", "gpu_class", "unhealthy")
# Policies whose RouteDecision.scores are estimated gains Δ_p (others score load, priority, ...).
GAIN_SCORED_POLICIES = frozenset({"go-routing"})


@dataclass(frozen=True, slots=True)
class Affinity:
    """What a request may stick to: a session key and/or a prompt-prefix key (either may be None)."""

    session: str | None = None
    prefix: str | None = None


@dataclass(frozen=True, slots=True)
class DispatchResult:
    endpoint: EndpointState | None
    decision: RouteDecision
    filtered: dict[str, int]
    infeasible: bool = False
    affinity: str | None = None


def capabilities(ep: EndpointState) -> ReplicaCapabilities:
    """What the pod's sidecar reports it serves, else what discovery declared."""
    reported = ep.reported_capabilities()
    if reported is not None and reported.models:
        return reported
    return ep.spec.capabilities()


def serves_model(ep: EndpointState, model: str) -> bool:
    caps = capabilities(ep)
    return not caps.models or model in caps.models or model in caps.lora_adapters


class SessionTable:
    """Bounded map of session key → endpoint id (least recently used entries drop first)."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self._map: OrderedDict[str, str] = OrderedDict()
        self._max = max_entries

    def get(self, key: str) -> str | None:
        ep = self._map.get(key)
        if ep is not None:
            self._map.move_to_end(key)
        return ep

    def put(self, key: str, endpoint_id: str) -> None:
        self._map[key] = endpoint_id
        self._map.move_to_end(key)
        while len(self._map) > self._max:
            self._map.popitem(last=False)


def rendezvous(key: str, endpoint_ids: Sequence[str]) -> str | None:
    """The endpoint with the highest hash of (key, id): stable as pods come and go."""
    best, best_h = None, b""
    for ep_id in endpoint_ids:
        h = hashlib.blake2b(f"{key}\x00{ep_id}".encode(), digest_size=8).digest()
        if best is None or h > best_h:
            best, best_h = ep_id, h
    return best


def _filter(
    request: RequestView,
    model: str,
    endpoints: Sequence[EndpointState],
    exclude: frozenset[str],
    gpu_classes: frozenset[str],
) -> tuple[list[EndpointState], dict[str, int]]:
    filtered = dict.fromkeys(FILTERS, 0)
    need = request.prompt_tokens + (request.output_bound or request.max_tokens)
    survivors: list[EndpointState] = []
    for ep in endpoints:
        caps = capabilities(ep)
        if ep.spec.endpoint_id in exclude:
            filtered["excluded"] += 1
        elif not serves_model(ep, model):
            filtered["model"] += 1
        elif caps.max_context_tokens < need:
            filtered["context"] += 1
        elif gpu_classes and caps.gpu_class not in gpu_classes:
            filtered["gpu_class"] += 1
        elif not ep.usable:
            filtered["unhealthy"] += 1
        else:
            survivors.append(ep)
    return survivors, filtered


def _affine(
    decision: RouteDecision,
    survivors: list[EndpointState],
    affinity: Affinity,
    sessions: SessionTable | None,
    alpha: float,
) -> tuple[str | None, str | None]:
    """The pod affinity prefers, if the policy counts it among its candidates; and which affinity."""
    ids = [ep.spec.endpoint_id for ep in survivors]
    wanted: list[tuple[str, str]] = []
    if affinity.session and sessions is not None:
        sticky = sessions.get(affinity.session)
        if sticky in ids:
            wanted.append(("session", sticky))
    if affinity.prefix:
        pick = rendezvous(affinity.prefix, ids)
        if pick is not None:
            wanted.append(("prefix", pick))
    if not wanted:
        return None, None
    scores = dict(decision.scores)
    best = max(scores.values(), default=None)
    for kind, ep_id in wanted:
        if best is None or ep_id not in scores:
            return ep_id, kind
        if (best > 0 and scores[ep_id] >= alpha * best) or (best <= 0 and ep_id == decision.replica_id):
            return ep_id, kind
    return None, None


def dispatch(
    request: RequestView,
    model: str,
    endpoints: Sequence[EndpointState],
    policy: RouterPolicy,
    *,
    now_s: float,
    rng: random.Random,
    exclude: frozenset[str] = frozenset(),
    gpu_classes: frozenset[str] = frozenset(),
    affinity: Affinity | None = None,
    sessions: SessionTable | None = None,
    affinity_alpha: float = 0.9,
    shuffle: bool = True,
) -> DispatchResult:
    survivors, filtered = _filter(request, model, endpoints, exclude, gpu_classes)
    if not survivors:
        reason = _no_survivor_reason(filtered, model, request)
        return DispatchResult(None, RouteDecision(None, reason=reason, retry_after_s=1.0), filtered)
    if shuffle:  # policies break ties by order: without this every router herds onto the first pod
        rng.shuffle(survivors)
    views = [ep.replica_view(now_s) for ep in survivors]
    decision = policy.route(request, views, now_s, rng)
    if decision.replica_id is None:
        return DispatchResult(None, decision, filtered, infeasible=True)
    gains = [g for _, g in decision.scores] if policy.name in GAIN_SCORED_POLICIES else []
    infeasible = bool(gains) and max(gains) <= 0 and request.kind is not RequestKind.BEST_EFFORT
    if decision.to_best_effort and request.kind is not RequestKind.BEST_EFFORT:
        infeasible = True  # the policy's own backup decision (SLOs-Serve §4.2)
    pick, kind = decision.replica_id, None
    if affinity is not None and not infeasible:
        sticky, kind = _affine(decision, survivors, affinity, sessions, affinity_alpha)
        pick = sticky or pick
    chosen = next((ep for ep in survivors if ep.spec.endpoint_id == pick), None)
    if chosen is None:
        raise RuntimeError(f"routing policy {policy.name!r} chose unknown replica {pick!r}")
    if affinity is not None and affinity.session and sessions is not None and not infeasible:
        sessions.put(affinity.session, chosen.spec.endpoint_id)
    return DispatchResult(chosen, decision, filtered, infeasible=infeasible, affinity=kind)


def _no_survivor_reason(filtered: dict[str, int], model: str, request: RequestView) -> str:
    need = request.prompt_tokens + (request.output_bound or request.max_tokens)
    why = {
        "model": f"{{}} do not serve model {model!r}",
        "context": f"{{}} cannot hold a context of {need} tokens (prompt + max output)",
        "gpu_class": "{} run on a GPU class this tier does not allow",
        "unhealthy": "{} are unhealthy, draining or failing",
        "excluded": "{} already failed this request",
    }
    parts = [why[k].format(n) for k in FILTERS if (n := filtered[k]) and k in why]
    if not parts or parts == [why["model"].format(filtered["model"])]:
        return f"no replica serves model {model!r}"
    return "no replica can take this request: " + "; ".join(p for p in parts if "serve model" not in p)
