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
from slo_core.wire.openai import APIError
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
    # False until the key Secrets the policy in force names have been read once (a failed read counts:
    # it keeps the last good keys): before, a valid key would get 401 instead of "retry shortly"
    keys_loaded: bool = True
    # False until the engine pods have been listed once (Kubernetes discovery): not ready before
    endpoints_listed: bool = True
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

    def not_serving_yet(self, who: str = "router") -> APIError | None:
        """Why no request can be bound yet (the 503 to answer with Retry-After), or None.

        A router follows its SLOPolicy and its tenants' key Secrets from the API server: until both
        have been read once it cannot tell a valid key from an unknown one, and a 401 then would be a
        wrong answer to a valid caller."""
        if not self.policy_loaded:  # no tiers or tenants to bind the caller to yet
            what, code = f"SLOPolicy {self.policy_source or '(unnamed)'}", "policy_not_loaded"
        elif not self.keys_loaded:
            what, code = "its tenants' API-key Secrets", "keys_not_loaded"
        else:
            return None
        return APIError(
            503,
            f"the {who} has not read {what} yet; retry shortly",
            kind="server_error",
            code=code,
            retry_after_s=5.0,
        )

    def settled(self) -> bool:
        """Startup is over: policy and keys read, engine pods listed, and either one pod usable or no
        listed pod still making its first state-stream connection (then the router's own 503 +
        Retry-After is the answer, not a missing Service endpoint)."""
        if not (self.policy_loaded and self.keys_loaded and self.endpoints_listed):
            return False
        if self.usable_endpoints():
            return True
        return not any(
            ep.ready and ep.spec.grpc_target and ep.feed_ok is None for ep in self.endpoints.values()
        )

    def apply_config(self, config: RouterConfig, source: str = "") -> None:
        """Switch to a new policy (tiers, tenants, routing); requests already dispatched are unaffected.

        The routing policy is built first, so a config it rejects (``ValueError``) changes nothing.
        """
        policy = make_router_policy(config.routing_policy, config.routing_params)
        self.config, self.policy = config, policy
        self.policy_loaded = True
        self.policy_source = source
