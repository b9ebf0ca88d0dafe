"""The router's view of an SLOPolicy: tiers, tenants, admission, objective and the routing policy.

Built from the one :class:`~slo_core.runtime_policy.RuntimePolicy` (``from_runtime``) every process
uses; the router adds only its own process settings (keys required, retries, affinity, GPU classes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slo_core.objective import Objective
from slo_core.runtime_policy import OVERLOAD_ACTIONS, AdmissionRule, RuntimePolicy
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_router.tenants import Tenant

ANONYMOUS = "anonymous"
AFFINITIES = frozenset({"prefix", "session"})
__all__ = ["AFFINITIES", "ANONYMOUS", "OVERLOAD_ACTIONS", "RouterConfig", "from_policy", "from_runtime"]


@dataclass(frozen=True)
class RouterConfig:
    tiers: dict[str, SLOTier]
    default_tier: str
    tenants: dict[str, Tenant]
    routing_policy: str = "go-routing"
    routing_params: dict[str, Any] = field(default_factory=dict)
    objective: Objective = field(default_factory=Objective)
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
    # what the core routing pipeline enforces (RuntimePolicy.admission); None: from the three flags above
    admission_rule: AdmissionRule | None = None
    _admission: AdmissionRule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.default_tier not in self.tiers:
            raise ValueError(
                f"default tier {self.default_tier!r} is not one of the tiers {sorted(self.tiers)}"
            )
        unknown = set(self.affinity) - AFFINITIES
        if unknown:
            raise ValueError(f"unknown affinity {sorted(unknown)}; choose from {sorted(AFFINITIES)}")
        be = self.best_effort_tier
        if self.admission_rule is not None:
            rule = self.admission_rule
        elif self.overload_to_best_effort and be is not None and be in self.tiers:
            rule = AdmissionRule("best-effort", be, self.tiers[be])
        else:
            rule = AdmissionRule("reject" if self.reject_infeasible else "admit", be, None)
        object.__setattr__(self, "_admission", rule)

    @property
    def admission(self) -> AdmissionRule:
        """What the core routing pipeline does with a request no pod can serve in time."""
        return self._admission

    def anonymous(self) -> Tenant:
        """The tenant of requests without a key when keys are not required (local use)."""
        return Tenant(ANONYMOUS, tuple(self.tiers), self.default_tier)

    @staticmethod
    def single_tier(name: str = "standard") -> RouterConfig:
        """A minimal config: one latency tier, no keys (for quick local runs and tests)."""
        tier = SLOTier(name, RequestKind.LATENCY, PriorityClass("default", 1.0), ttft_s=2.0, tbt_s=0.1)
        return RouterConfig(tiers={name: tier}, default_tier=name, tenants={}, require_keys=False)


def from_policy(spec: Any, *, require_keys: bool = True) -> RouterConfig:
    """Build the router config from an ``SLOPolicySpec`` (slo_core.crd.policy), through its runtime form."""
    return from_runtime(spec.runtime(), require_keys=require_keys)


def from_runtime(rp: RuntimePolicy, *, require_keys: bool = True) -> RouterConfig:
    """The router config of a :class:`RuntimePolicy`.

    ``admission.onOverload: best-effort`` moves requests no pod can serve in time to the policy's
    best-effort tier; ``reject`` answers them 503. Goodput is accounted with the policy's objective,
    function and weights.
    """
    tiers = dict(rp.tiers)
    return RouterConfig(
        tiers=tiers,
        default_tier=rp.default_tier,
        tenants={
            t.name: Tenant(
                name=t.name,
                allowed_tiers=t.allowed_tiers,
                default_tier=t.default_tier,
                requests_per_s=t.requests_per_s,
                tokens_per_s=t.tokens_per_s,
            )
            for t in rp.tenants.values()
        },
        routing_policy=rp.routing.name,
        routing_params=rp.routing.kwargs(),
        objective=rp.objective,
        require_keys=require_keys,
        overload_to_best_effort=rp.admission.demotes,
        best_effort_tier=rp.admission.best_effort_tier,
        reject_infeasible=rp.admission.rejects,
        admission_rule=rp.admission,
        key_secrets={t.name: t.api_keys_secret for t in rp.tenants.values() if t.api_keys_secret},
    )
