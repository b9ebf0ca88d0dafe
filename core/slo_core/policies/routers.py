"""Baseline routers: round-robin, least outstanding tokens (min-load) and power-of-two choices.

Each chooses among the replicas the routing pipeline's filters let through (``slo_core.routing``:
model, context, GPU class, health); offered none, it rejects the request.
``min-load`` is PROSERVE §5.1's multi-node baseline: the replica with the fewest
outstanding tokens (unprefilled prompt plus expected remaining output). ``p2c`` samples two distinct
replicas with the injected generator and keeps the less loaded (Mitzenmacher's power of two
choices). None needs the replicas' request lists: ``needs_request_snapshots = False``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from slo_core.policies.base import BaseRouterPolicy, ReplicaView, RequestView, RouteDecision


class _NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _reject() -> RouteDecision:
    return RouteDecision(None, reason="no replica offered", retry_after_s=1.0)


class RoundRobin(BaseRouterPolicy):
    """Cycle over the replicas in id order."""

    name = "round-robin"
    needs_request_snapshots = False

    def __init__(self, **params: Any) -> None:
        self.params = _NoParams.model_validate(params)
        self._next = 0

    def route(
        self, request: RequestView, replicas: Sequence[ReplicaView], now_s: float, rng: random.Random
    ) -> RouteDecision:
        ok = list(replicas)
        if not ok:
            return _reject()
        ok.sort(key=lambda rep: rep.replica_id)
        pick = ok[self._next % len(ok)]
        self._next += 1
        return RouteDecision(pick.replica_id, reason="round-robin")


class MinLoad(BaseRouterPolicy):
    """The replica with the fewest outstanding tokens (ties: first in the given order)."""

    name = "min-load"
    needs_request_snapshots = False

    def __init__(self, **params: Any) -> None:
        self.params = _NoParams.model_validate(params)

    def route(
        self, request: RequestView, replicas: Sequence[ReplicaView], now_s: float, rng: random.Random
    ) -> RouteDecision:
        ok = list(replicas)
        if not ok:
            return _reject()
        loads = [(rep.outstanding_tokens, i) for i, rep in enumerate(ok)]
        load, i = min(loads)
        return RouteDecision(
            ok[i].replica_id,
            reason=f"min-load {load} tokens",
            scores=tuple((rep.replica_id, float(-lo)) for rep, (lo, _) in zip(ok, loads, strict=True)),
        )


class PowerOfTwo(BaseRouterPolicy):
    """Sample two distinct replicas; send to the one with fewer outstanding tokens."""

    name = "p2c"
    needs_request_snapshots = False

    def __init__(self, **params: Any) -> None:
        self.params = _NoParams.model_validate(params)

    def route(
        self, request: RequestView, replicas: Sequence[ReplicaView], now_s: float, rng: random.Random
    ) -> RouteDecision:
        ok = list(replicas)
        if not ok:
            return _reject()
        if len(ok) == 1:
            return RouteDecision(ok[0].replica_id, reason="p2c: one replica")
        a, b = rng.sample(range(len(ok)), 2)
        pick = ok[a] if ok[a].outstanding_tokens <= ok[b].outstanding_tokens else ok[b]
        return RouteDecision(pick.replica_id, reason="p2c")
