"""SLOs-Serve's SLO-driven sequential re-routing across replicas (SLOs-Serve §4.2, Fig. 7).

A one-shot round-robin dispatcher picks the first replica; that replica's scheduler decides with the
admission DP of §3.2 (run here on the replica's snapshot: its SLO requests are forced, the new request
is the only candidate) whether the request's SLO is attainable. If not, the request moves on to the next
replica in order, at most ``routing_limit`` replicas in all. When the limit is reached the backup policy
either declines the request (reject, with a retry hint) or offloads it to the best-effort tier of the
least-loaded replica it tried (``to_best_effort``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from slo_core.policies.base import BaseRouterPolicy, ReplicaView, RequestView, RouteDecision
from slo_core.policies.seed_estimates import profile_or_fallback
from slo_core.policies.slos_serve import SLOsServeParams, dp_view, to_item
from slo_core.policies.slos_serve_dp import plan_admission
from slo_core.slo import RequestKind


class SLOsServeRerouteParams(BaseModel):
    """Parameters of SLO-driven re-routing (SLOs-Serve §4.2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    routing_limit: int = Field(3, ge=1, description="replicas tried before the backup policy (replicas)")
    fallback: Literal["best-effort", "decline"] = Field(
        "best-effort", description="backup policy once the routing limit is reached"
    )
    retry_after_s: float = Field(1.0, gt=0, description="retry hint sent with a declined request (seconds)")
    scheduler: SLOsServeParams = Field(
        default_factory=SLOsServeParams, description="parameters of the per-replica admission DP"
    )


class SLOsServeReroute(BaseRouterPolicy):
    """Round-robin first pick, then sequential re-routing by SLO attainability (see the module docstring)."""

    name = "slos-serve-reroute"

    def __init__(self, params: SLOsServeRerouteParams | None = None, **kwargs: object) -> None:
        self.params = params if params is not None else SLOsServeRerouteParams.model_validate(kwargs)
        self._next = 0

    def attainable(self, request: RequestView, replica: ReplicaView, now_s: float) -> bool:
        """Would the replica's admission DP admit ``request`` next to everything it already guarantees?"""
        if request.kind is RequestKind.BEST_EFFORT:
            return True
        prof = profile_or_fallback(replica.profile)
        sp = self.params.scheduler
        forced = [r for r in (*replica.running, *replica.waiting) if r.kind is not RequestKind.BEST_EFFORT]
        view = dp_view(
            forced,
            now_s,
            prof,
            sp,
            kv_tokens_total=replica.kv_blocks_total * replica.block_size,
            max_num_seqs=replica.max_num_seqs,
            max_num_batched_tokens=replica.max_num_batched_tokens,
        )
        cand = to_item(request, now_s, prof, sp, view.unit_tokens, forced=False)
        return plan_admission(view.forced, [cand], now_s, view.capacity).admitted == (request.request_id,)

    def route(
        self,
        request: RequestView,
        replicas: Sequence[ReplicaView],
        now_s: float,
        rng: random.Random,
    ) -> RouteDecision:
        usable = list(replicas)
        if not usable:
            return RouteDecision(None, reason="no replica offered", retry_after_s=self.params.retry_after_s)
        start = self._next % len(usable)
        self._next += 1
        tried = [
            usable[(start + k) % len(usable)] for k in range(min(self.params.routing_limit, len(usable)))
        ]
        for hops, replica in enumerate(tried):
            if self.attainable(request, replica, now_s):
                return RouteDecision(replica.replica_id, reason=f"SLO attainable after {hops} re-route(s)")
        if self.params.fallback == "decline":
            return RouteDecision(
                None,
                reason=f"SLO unattainable on {len(tried)} replica(s)",
                retry_after_s=self.params.retry_after_s,
            )
        spare = min(tried, key=lambda p: p.outstanding_tokens)
        return RouteDecision(
            spare.replica_id,
            reason=f"SLO unattainable on {len(tried)} replica(s): best-effort tier",
            to_best_effort=True,
        )
