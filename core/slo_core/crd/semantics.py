"""Cross-reference checks of an SLOPolicy spec: names that must exist, policy names and their parameters.

The CRD's CEL rules reject the most common mistakes at the API server; these checks cover the rest
(tenants' tiers, policy registry names, parameters each policy's own pydantic model rejects) and give
one readable line per problem, naming the YAML path to edit. This module sits above the model
(``slo_core.crd.policy``): it imports the model, the model never imports it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from slo_core.crd.errors import validation_problems
from slo_core.crd.policy import PolicyRef, SLOPolicySpec


def _duplicates(names: list[str]) -> list[str]:
    return sorted(n for n, c in Counter(names).items() if c > 1)


def _one_of(names: list[str]) -> str:
    return ", ".join(names) if names else "none defined"


def policy_spec_problems(spec: SLOPolicySpec) -> list[str]:
    """Every problem with names and policies in ``spec``, as ``path: message`` lines (empty: valid)."""
    problems: list[str] = []
    classes = [p.name for p in spec.priority_classes]
    tiers = [t.name for t in spec.tiers]
    tenants = [t.name for t in spec.tenants]
    for what, path, names in (
        ("priority class", "spec.priorityClasses", classes),
        ("tier", "spec.tiers", tiers),
        ("tenant", "spec.tenants", tenants),
    ):
        for dup in _duplicates(names):
            problems.append(f"{path}: {what} name {dup!r} appears more than once; names must be unique")
    for i, tier in enumerate(spec.tiers):
        if tier.priority_class not in classes:
            problems.append(
                f"spec.tiers[{i}].priorityClass: {tier.priority_class!r} is not a priority class; "
                f"use one of spec.priorityClasses ({_one_of(classes)})"
            )
    if spec.default_tier not in tiers:
        problems.append(
            f"spec.defaultTier: {spec.default_tier!r} is not a tier; use one of ({_one_of(tiers)})"
        )
    for i, tenant in enumerate(spec.tenants):
        for j, name in enumerate(tenant.allowed_tiers):
            if name not in tiers:
                problems.append(
                    f"spec.tenants[{i}].allowedTiers[{j}]: {name!r} is not a tier; "
                    f"use one of ({_one_of(tiers)})"
                )
        default = tenant.default_tier or spec.default_tier
        if default not in tenant.allowed_tiers:
            where = "defaultTier" if tenant.default_tier else "allowedTiers"
            problems.append(
                f"spec.tenants[{i}].{where}: the tenant's default tier {default!r} is not among its "
                f"allowedTiers ({_one_of(tenant.allowed_tiers)}); add it or set the tenant's defaultTier"
            )
    if spec.admission.on_overload == "best-effort" and not any(t.kind == "best-effort" for t in spec.tiers):
        problems.append(
            "spec.admission.onOverload: 'best-effort' needs a tier of kind best-effort to demote "
            "requests to; add one or use 'reject'"
        )
    from slo_core.policies import registry

    problems += _policy_problems(
        spec.scheduling, "spec.scheduling", registry.ENGINE_POLICIES, registry.make_engine_policy, "engine"
    )
    problems += _policy_problems(
        spec.routing, "spec.routing", registry.ROUTER_POLICIES, registry.make_router_policy, "routing"
    )
    return problems


def _policy_problems(
    ref: PolicyRef,
    path: str,
    table: Mapping[str, str],
    make: Callable[[str, Mapping[str, Any]], object],
    what: str,
) -> list[str]:
    """Unknown policy names, and parameters the policy's own params model rejects."""
    if ref.name not in table:
        return [f"{path}.name: unknown {what} policy {ref.name!r}; choose one of: {', '.join(sorted(table))}"]
    try:
        make(ref.name, ref.params)
    except ValidationError as exc:
        return validation_problems(exc, prefix=f"{path}.params")
    except (TypeError, ValueError, ImportError) as exc:
        return [f"{path}.params: {ref.name} rejects these parameters: {exc}"]
    return []
