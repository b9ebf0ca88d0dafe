"""An SLOPolicy as every process runs it: one :class:`RuntimePolicy`, built once from the spec.

The router (tiers, tenants, admission, routing policy, goodput accounting), the sidecar (tiers, admission
wait, goodput, engine policy), the vLLM plugin, the operator (what it renders for the pods), the fleet
simulator and the local fleet all read the same object, so a setting cannot mean one thing in one
process and another elsewhere. ``SLOPolicySpec.runtime()`` (slo_core.crd.policy) builds it; this module
holds only the plain, frozen types (no pydantic models of the CRD, no registry imports), so policies
may take the :class:`~slo_core.objective.Objective` as an input without importing the CRD layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from slo_core.objective import Objective
from slo_core.slo import PriorityClass, RequestKind, SLOTier

OverloadAction = Literal["reject", "best-effort", "admit"]
OVERLOAD_ACTIONS: tuple[OverloadAction, ...] = ("reject", "best-effort", "admit")


@dataclass(frozen=True, slots=True)
class PolicyChoice:
    """A registry name and its parameters (engine scheduling or routing policy)."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    def kwargs(self) -> dict[str, Any]:
        """A fresh mutable copy of the parameters, for a policy factory."""
        return dict(self.params)


@dataclass(frozen=True, slots=True)
class TenantRule:
    """A tenant as the runtime enforces it: the tiers it may use and its rate limits."""

    name: str
    allowed_tiers: tuple[str, ...]
    default_tier: str
    requests_per_s: float | None = None
    tokens_per_s: float | None = None
    api_keys_secret: tuple[str, str] | None = None  # (Secret name, key): where its API keys live


@dataclass(frozen=True, slots=True)
class AdmissionRule:
    """What happens to a request no replica can serve in time, and how long one may wait in a queue.

    ``on_overload``: ``reject`` answers an early 503 with a retry hint; ``best-effort`` demotes the
    request to ``best_effort_tier`` (then it is routed again there); ``admit`` routes it anyway.
    """

    on_overload: OverloadAction = "reject"
    best_effort_tier: str | None = None
    best_effort: SLOTier | None = None
    max_wait_s: float = 30.0

    def __post_init__(self) -> None:
        if self.on_overload not in OVERLOAD_ACTIONS:
            raise ValueError(
                f"unknown overload action {self.on_overload!r}; choose one of {OVERLOAD_ACTIONS}"
            )
        if self.on_overload == "best-effort" and self.best_effort is None:
            raise ValueError("demoting to best effort needs a best-effort tier")

    @property
    def demotes(self) -> bool:
        return self.on_overload == "best-effort"

    @property
    def rejects(self) -> bool:
        return self.on_overload == "reject"


def _default_tier() -> dict[str, SLOTier]:
    return {"standard": SLOTier("standard", RequestKind.LATENCY, PriorityClass("default", 1.0), 2.0, 0.1)}


@dataclass(frozen=True, slots=True)
class RuntimePolicy:
    """Everything an SLOPolicy sets, in the form the processes run it (see the module docstring)."""

    tiers: Mapping[str, SLOTier] = field(default_factory=_default_tier)
    default_tier: str = "standard"
    tenants: Mapping[str, TenantRule] = field(default_factory=dict)
    admission: AdmissionRule = field(default_factory=AdmissionRule)
    objective: Objective = field(default_factory=Objective)
    scheduling: PolicyChoice = field(default_factory=lambda: PolicyChoice("gmax"))
    routing: PolicyChoice = field(default_factory=lambda: PolicyChoice("power-of-k"))
    fairness: float = 0.0

    def __post_init__(self) -> None:
        if self.default_tier not in self.tiers:
            raise ValueError(
                f"defaultTier {self.default_tier!r} is not one of the tiers {sorted(self.tiers)}"
            )
        object.__setattr__(self, "tiers", MappingProxyType(dict(self.tiers)))
        object.__setattr__(self, "tenants", MappingProxyType(dict(self.tenants)))

    @staticmethod
    def best_effort_tier_of(tiers: Mapping[str, SLOTier]) -> str | None:
        """The first tier of kind best-effort (where ``onOverload: best-effort`` demotes to), if any."""
        return next((n for n, t in tiers.items() if t.kind is RequestKind.BEST_EFFORT), None)
