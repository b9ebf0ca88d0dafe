"""What the router's handlers share: config, keys, endpoints, metrics and the routing pipeline.

Its own module so the request path (``app``, ``intake``, ``accounting``) depends on it, and none of them
on another one for its type.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slo_core.policies.base import RouterPolicy
from slo_core.policies.registry import make_router_policy
from slo_core.routing import ProgramClock, RoutingPipeline, SessionTable
from slo_core.wire.keyring import KeyRing
from slo_core.wire.limits import RequestLimits
from slo_net.upstream import UpstreamPool
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointState
from slo_router.metrics import RouterMetrics
from slo_router.ratelimit import RateLimiter
from slo_router.tenants import KeyStore


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
    client: UpstreamPool | None = None  # upstream pool, built in the lifespan when not given
    upstream_timeout_s: float = 600.0
    clock: Callable[[], float] = time.monotonic
    background: list[Any] = field(default_factory=list)
    sessions: SessionTable = field(default_factory=SessionTable)
    programs: ProgramClock = field(default_factory=ProgramClock)  # compound programs' first calls
    catalog: dict[str, str] = field(default_factory=dict)
    # False while a policy the router must follow (``--policy-name``) has not been read yet: not ready
    policy_loaded: bool = True
    policy_source: str = ""
    limits: RequestLimits = field(default_factory=RequestLimits)
    # engine mode: the first signs the SLO tags sent to engines (--tag-key-file); none: tags go unsigned
    tag_keys: Callable[[], KeyRing] | None = None
    _pipeline: RoutingPipeline | None = field(default=None, repr=False)

    @property
    def pipeline(self) -> RoutingPipeline:
        """The core routing pipeline for the current policy and admission rule (rebuilt when they change)."""
        p = self._pipeline
        if p is None or p.policy is not self.policy or p.admission is not self.config.admission:
            p = self._pipeline = RoutingPipeline(
                self.policy, self.config.admission, shuffle=self.config.shuffle_ties
            )
        return p

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
