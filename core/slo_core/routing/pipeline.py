"""The routing pipeline: filters → policy (scorer) → picker → feasibility and admission → affinity.

One implementation, run by the router service for every request and by the fleet simulator for every
simulated arrival, so a routing or admission decision measured in simulation is the one a pod sees.
In the spirit of the Gateway API inference extension's endpoint picker, each stage has one job:

1. **Filters** (in order, each rejection counted): not excluded (this request already failed there),
   serves the model or LoRA adapter (when a model is named), context ≥ prompt + output bound (the bound,
   else max_tokens), GPU class (when the tier restricts it), usable (ready, circuit closed, state stream
   live, healthy, not draining). Policies never filter: they see survivors only.
2. **Policy** (scorer and picker): the router policy picks among the survivors' snapshots, offered in a
   random order (the injected rng) so a policy's ties do not send every request to the first one.
3. **Feasibility**: the request is infeasible when the policy declines it, sends it to best effort
   itself (SLOs-Serve §4.2's backup policy), or, for a policy that declares ``gain_scored`` (its scores
   are estimated gains Δ_p, GoRouting), when no replica gains from it (Δ_max ≤ 0). Best-effort requests
   are never infeasible by gain.
4. **Admission** (:class:`~slo_core.runtime_policy.AdmissionRule`, from the SLOPolicy): an infeasible
   request is rejected early (503 with a retry hint of about one TTFT), demoted to the best-effort tier
   and routed again there, or admitted anyway. Only a request's first pass is checked; passes that retry
   after pods refused it take what the policy picks.
5. **Affinity** (optional): a session, or requests sharing a prompt prefix (rendezvous hashing, so
   router replicas agree without talking), stay on one pod while it is among the policy's candidates:
   bounded score ≥ α, or the policy's own pick.

Scores are bounded before affinity compares them: ``max(0, s) / max_s`` in [0, 1] (all 0 when no score
is positive, so only the policy's pick is a candidate); for a gain-scored policy that is exactly
GoRouting's candidate set Δ_p ≥ α·Δ_max.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from slo_core.policies.base import ReplicaCapabilities, ReplicaView, RequestView, RouteDecision, RouterPolicy
from slo_core.runtime_policy import AdmissionRule
from slo_core.slo import RequestKind

FILTERS = ("excluded", "model", "context", "gpu_class", "unhealthy")

E = TypeVar("E", bound="Endpoint")

Outcome = Literal["routed", "no-replica", "admitted-infeasible", "rejected", "demoted"]


class Endpoint(Protocol):
    """What the pipeline needs of a replica: identity, capabilities, health and a snapshot on demand."""

    @property
    def endpoint_id(self) -> str: ...

    @property
    def usable(self) -> bool: ...

    def capabilities(self) -> ReplicaCapabilities: ...

    def replica_view(self, now_s: float) -> ReplicaView: ...


@dataclass(frozen=True, slots=True)
class SnapshotEndpoint:
    """An endpoint that is just a snapshot (the simulator's replicas, tests)."""

    view: ReplicaView

    @property
    def endpoint_id(self) -> str:
        return self.view.replica_id

    @property
    def usable(self) -> bool:
        return self.view.healthy

    def capabilities(self) -> ReplicaCapabilities:
        return self.view.capabilities

    def replica_view(self, now_s: float) -> ReplicaView:
        return self.view


@dataclass(frozen=True, slots=True)
class Affinity:
    """What a request may stick to: a session key and/or a prompt-prefix key (either may be None)."""

    session: str | None = None
    prefix: str | None = None


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


class ProgramClock:
    """When each compound program's first call arrived, as a router sees its calls (bounded: the least
    recently seen programs drop first, and a program is forgotten once its deadline is long past).

    A call's due time is reckoned from its program's first call (core's ``routing_deadline_at_s``), as
    the simulator and the pod's sidecar reckon it; keyed by tenant and program id, so no tenant can move
    another tenant's program's clock.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self._map: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()
        self._max = max_entries

    def arrival_s(self, tenant: str, program_id: str, now_s: float, deadline_s: float) -> float:
        """The program's first-call arrival (``now_s`` for a program not seen, or seen and expired)."""
        key = (tenant, program_id)
        seen = self._map.get(key)
        if seen is None or now_s > seen[1]:
            seen = (now_s, now_s + 2.0 * deadline_s)  # kept until well after the program's deadline
        self._map[key] = seen
        self._map.move_to_end(key)
        while len(self._map) > self._max:
            self._map.popitem(last=False)
        return seen[0]

    def __len__(self) -> int:
        return len(self._map)


@dataclass(frozen=True, slots=True)
class Routed(Generic[E]):
    """The pipeline's answer for one request.

    ``endpoint`` is where to send ``request`` (None: answer 503 with ``decision.reason`` and
    ``decision.retry_after_s``). ``request`` is the request as routed: after a demotion it carries the
    best-effort tier's targets. ``outcome``: routed; no-replica (the filters left none); rejected
    (infeasible, early 503); demoted (infeasible, moved to best effort; ``endpoint`` may still be None if
    no replica takes it there); admitted-infeasible (infeasible, routed anyway: ``admit`` or a retry pass).
    """

    endpoint: E | None
    decision: RouteDecision
    filtered: dict[str, int]
    request: RequestView
    outcome: Outcome = "routed"
    infeasible: bool = False
    affinity: str | None = None


def rendezvous(key: str, endpoint_ids: Sequence[str]) -> str | None:
    """The endpoint with the highest hash of (key, id): stable as pods come and go."""
    best, best_h = None, b""
    for ep_id in endpoint_ids:
        h = hashlib.blake2b(f"{key}\x00{ep_id}".encode(), digest_size=8).digest()
        if best is None or h > best_h:
            best, best_h = ep_id, h
    return best


def bounded_scores(decision: RouteDecision) -> dict[str, float]:
    """The policy's scores mapped into [0, 1]: ``max(0, s) / max_s`` (all 0 when none is positive)."""
    best = max((s for _, s in decision.scores), default=0.0)
    if best <= 0:
        return {rid: 0.0 for rid, _ in decision.scores}
    return {rid: max(0.0, s) / best for rid, s in decision.scores}


def with_sent(view: ReplicaView, sent: Sequence[RequestView]) -> ReplicaView:
    """A replica's last reported snapshot plus the requests routed to it since (queued at its end):
    what a router knows of a pod between two reports."""
    if not sent:
        return view
    reported = view.reported_outstanding_tokens
    if reported is not None:
        reported += sum(r.prompt_tokens + (r.output_bound or r.max_tokens) for r in sent)
    return dataclasses.replace(view, waiting=(*view.waiting, *sent), reported_outstanding_tokens=reported)


def retry_hint_s(request: RequestView) -> float:
    """Retry-After for an infeasible request: about one TTFT (or a deadline's tenth), at least 1 s."""
    slo = request.slo
    hint = slo.ttft_s if slo.kind is RequestKind.LATENCY else (slo.deadline_s or 10.0) / 10.0
    return max(1.0, hint or 1.0)


def demote(request: RequestView, admission: AdmissionRule) -> RequestView:
    """``request`` moved to the admission rule's best-effort tier (its targets and default deadline)."""
    assert admission.best_effort is not None
    targets = admission.best_effort.targets()
    return dataclasses.replace(
        request, slo=targets, deadline_at_s=request.arrival_s + targets.effective_deadline_s
    )


class RoutingPipeline:
    """Filters, one router policy, feasibility, admission and affinity (see the module docstring)."""

    def __init__(
        self,
        policy: RouterPolicy,
        admission: AdmissionRule | None = None,
        *,
        affinity_alpha: float = 0.9,
        shuffle: bool = True,
    ) -> None:
        self.policy = policy
        self.admission = admission if admission is not None else AdmissionRule()
        self.affinity_alpha = affinity_alpha
        self.shuffle = shuffle

    @property
    def needs_request_snapshots(self) -> bool:
        return self.policy.needs_request_snapshots

    def route(
        self,
        request: RequestView,
        endpoints: Sequence[E],
        *,
        now_s: float,
        rng: random.Random,
        model: str | None = None,
        exclude: frozenset[str] = frozenset(),
        gpu_classes: frozenset[str] = frozenset(),
        demoted_gpu_classes: frozenset[str] = frozenset(),
        affinity: Affinity | None = None,
        sessions: SessionTable | None = None,
        check_admission: bool = True,
    ) -> Routed[E]:
        """Route one request (``check_admission=False`` on retry passes: take what the policy picks)."""
        first = self._pick(
            request, endpoints, now_s=now_s, rng=rng, model=model, exclude=exclude, gpu_classes=gpu_classes
        )
        if isinstance(first, Routed):
            return first
        survivors, decision, filtered, infeasible = first
        if infeasible and check_admission:
            return self._admit(
                request,
                decision,
                filtered,
                endpoints,
                now_s=now_s,
                rng=rng,
                model=model,
                demoted_gpu_classes=demoted_gpu_classes,
            )
        if decision.replica_id is None:
            return Routed(None, decision, filtered, request, "admitted-infeasible", infeasible=True)
        pick, kind = decision.replica_id, None
        if affinity is not None and not infeasible:
            sticky, kind = self._affine(decision, survivors, affinity, sessions)
            pick = sticky or pick
        chosen = next((ep for ep in survivors if ep.endpoint_id == pick), None)
        if chosen is None:
            raise RuntimeError(f"routing policy {self.policy.name!r} chose unknown replica {pick!r}")
        if affinity is not None and affinity.session and sessions is not None and not infeasible:
            sessions.put(affinity.session, chosen.endpoint_id)
        outcome: Outcome = "admitted-infeasible" if infeasible else "routed"
        return Routed(chosen, decision, filtered, request, outcome, infeasible=infeasible, affinity=kind)

    # ---- stages -----------------------------------------------------------------------------------------

    def _pick(
        self,
        request: RequestView,
        endpoints: Sequence[E],
        *,
        now_s: float,
        rng: random.Random,
        model: str | None,
        exclude: frozenset[str],
        gpu_classes: frozenset[str],
    ) -> Routed[E] | tuple[list[E], RouteDecision, dict[str, int], bool]:
        """Filters, policy and feasibility: a final answer when no replica survives, else the pieces."""
        survivors, filtered = filter_endpoints(request, endpoints, model, exclude, gpu_classes)
        if not survivors:
            reason = _no_survivor_reason(filtered, model, request)
            decision = RouteDecision(None, reason=reason, retry_after_s=1.0)
            return Routed(None, decision, filtered, request, "no-replica")
        if self.shuffle:  # policies break ties by order: without this every router herds onto the first pod
            rng.shuffle(survivors)
        views = [ep.replica_view(now_s) for ep in survivors]
        decision = self.policy.route(request, views, now_s, rng)
        return survivors, decision, filtered, self._infeasible(request, decision)

    def _infeasible(self, request: RequestView, decision: RouteDecision) -> bool:
        if decision.replica_id is None:
            return True
        if request.kind is RequestKind.BEST_EFFORT:
            return False
        if decision.to_best_effort:
            return True  # the policy's own backup decision (SLOs-Serve §4.2)
        if self.policy.gain_scored and decision.scores:
            return max(g for _, g in decision.scores) <= 0
        return False

    def _admit(
        self,
        request: RequestView,
        decision: RouteDecision,
        filtered: dict[str, int],
        endpoints: Sequence[E],
        *,
        now_s: float,
        rng: random.Random,
        model: str | None,
        demoted_gpu_classes: frozenset[str],
    ) -> Routed[E]:
        rule = self.admission
        if rule.demotes and request.kind is not RequestKind.BEST_EFFORT:
            demoted = demote(request, rule)
            again = self._pick(
                demoted,
                endpoints,
                now_s=now_s,
                rng=rng,
                model=model,
                exclude=frozenset(),
                gpu_classes=demoted_gpu_classes,
            )
            if isinstance(again, Routed):
                return dataclasses.replace(again, outcome="demoted", infeasible=True)
            survivors, decision2, filtered2, _ = again
            chosen = None
            if decision2.replica_id is not None:
                chosen = next((ep for ep in survivors if ep.endpoint_id == decision2.replica_id), None)
                if chosen is None:
                    raise RuntimeError(
                        f"routing policy {self.policy.name!r} chose unknown replica {decision2.replica_id!r}"
                    )
            return Routed(chosen, decision2, filtered2, demoted, "demoted", infeasible=True)
        if rule.rejects:
            rejected = dataclasses.replace(
                decision,
                replica_id=None,
                reason="no replica can meet this request's SLO now (estimated from the pods' state)",
                retry_after_s=retry_hint_s(request),
            )
            return Routed(None, rejected, filtered, request, "rejected", infeasible=True)
        chosen = None
        if decision.replica_id is not None:
            chosen = next((ep for ep in endpoints if ep.endpoint_id == decision.replica_id), None)
        return Routed(chosen, decision, filtered, request, "admitted-infeasible", infeasible=True)

    def _affine(
        self,
        decision: RouteDecision,
        survivors: list[E],
        affinity: Affinity,
        sessions: SessionTable | None,
    ) -> tuple[str | None, str | None]:
        """The pod affinity prefers, if the policy counts it among its candidates; and which affinity."""
        ids = [ep.endpoint_id for ep in survivors]
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
        scores = bounded_scores(decision)
        for kind, ep_id in wanted:
            if not scores or ep_id not in scores:
                return ep_id, kind
            if ep_id == decision.replica_id or scores[ep_id] >= self.affinity_alpha:
                return ep_id, kind
        return None, None


def filter_endpoints(
    request: RequestView,
    endpoints: Sequence[E],
    model: str | None,
    exclude: frozenset[str] = frozenset(),
    gpu_classes: frozenset[str] = frozenset(),
) -> tuple[list[E], dict[str, int]]:
    """The one eligibility filter: survivors in the given order and the count each filter rejected."""
    filtered = dict.fromkeys(FILTERS, 0)
    need = request.prompt_tokens + (request.output_bound or request.max_tokens)
    survivors: list[E] = []
    for ep in endpoints:
        if exclude and ep.endpoint_id in exclude:
            filtered["excluded"] += 1
            continue
        caps = ep.capabilities()
        if model and caps.models and model not in caps.models and model not in caps.lora_adapters:
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


def _no_survivor_reason(filtered: dict[str, int], model: str | None, request: RequestView) -> str:
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
        return f"no replica serves model {model!r}" if model else "no replica can take this request"
    return "no replica can take this request: " + "; ".join(p for p in parts if "serve model" not in p)
