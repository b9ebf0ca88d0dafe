"""The router's view of an SLOPolicy: tiers, tenants, the routing policy and its parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_router.tenants import Tenant

ANONYMOUS = "anonymous"
AFFINITIES = frozenset({"prefix", "session"})
OVERLOAD_ACTIONS = ("reject", "best-effort", "admit")


@dataclass(frozen=True)
class RouterConfig:
    tiers: dict[str, SLOTier]
    default_tier: str
    tenants: dict[str, Tenant]
    routing_policy: str = "go-routing"
    routing_params: dict[str, Any] = field(default_factory=dict)
    goodput: str = "token"
    require_keys: bool = True
    overload_to_best_effort: bool = False
    best_effort_tier: str | None = None
    reject_infeasible: bool = True
    max_retries: int = 2
    retry_budget_s: float = 10.0
    shuffle_ties: bool = True
    affinity: tuple[str, ...] = ()
    tier_gpu_classes: dict[str, frozenset[str]] = field(default_factory=dict)
    key_secrets: dict[str, tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.default_tier not in self.tiers:
            raise ValueError(
                f"default tier {self.default_tier!r} is not one of the tiers {sorted(self.tiers)}"
            )
        unknown = set(self.affinity) - AFFINITIES
        if unknown:
            raise ValueError(f"unknown affinity {sorted(unknown)}; choose from {sorted(AFFINITIES)}")

    def anonymous(self) -> Tenant:
        """The tenant of requests without a key when keys are not required (local use)."""
        return Tenant(ANONYMOUS, tuple(self.tiers), self.default_tier)

    @staticmethod
    def single_tier(name: str = "standard") -> RouterConfig:
        """A minimal config: one latency tier, no keys (for quick local runs and tests)."""
        tier = SLOTier(name, RequestKind.LATENCY, PriorityClass("default", 1.0), ttft_s=2.0, tbt_s=0.1)
        return RouterConfig(tiers={name: tier}, default_tier=name, tenants={}, require_keys=False)


def from_policy(spec: Any, *, require_keys: bool = True) -> RouterConfig:
    """Build the router config from an ``SLOPolicySpec`` (slo_core.crd.policy).

    ``admission.onOverload: best-effort`` moves requests no pod can serve in time to the policy's
    best-effort tier; ``reject`` answers them 503.
    """
    tiers = spec.tiers_runtime()
    tenants = {
        t.name: Tenant(
            name=t.name,
            allowed_tiers=tuple(t.allowed_tiers) or (t.default_tier or spec.default_tier,),
            default_tier=t.default_tier or spec.default_tier,
            requests_per_s=t.requests_per_second,
            tokens_per_s=t.tokens_per_second,
        )
        for t in spec.tenants
    }
    key_secrets = {
        t.name: (t.api_keys_secret.name, t.api_keys_secret.key) for t in spec.tenants if t.api_keys_secret
    }
    best_effort = next((n for n, t in tiers.items() if t.kind is RequestKind.BEST_EFFORT), None)
    return RouterConfig(
        tiers=tiers,
        default_tier=spec.default_tier,
        tenants=tenants,
        routing_policy=spec.routing.name,
        routing_params=dict(spec.routing.params or {}),
        goodput=spec.goodput.name,
        require_keys=require_keys,
        overload_to_best_effort=spec.admission.on_overload == "best-effort" and best_effort is not None,
        best_effort_tier=best_effort,
        key_secrets=key_secrets,
    )
