"""Do a router and the engine pods behind it agree on the tiers? One check, used everywhere.

The router binds every request to a tier of *its* SLOPolicy and forwards the tier's name; the sidecar
of each engine pod answers ``400 unknown SLO tier`` for a name *its* ModelDeployment's policy lacks.
So every tier of the router's policy must exist in the policy of each ModelDeployment behind it. The
operator reports a mismatch on the ModelDeployment (a condition and an Event) and ``slofleet validate``
checks it offline; both call :func:`missing_tiers`.
"""

from __future__ import annotations

from typing import Any


def tier_names(spec: Any) -> list[str]:
    """Tier names of an ``SLOPolicySpec`` (or of its plain ``spec`` mapping), in order."""
    tiers = spec.get("tiers") if isinstance(spec, dict) else getattr(spec, "tiers", None)
    names = []
    for tier in tiers or []:
        name = tier.get("name") if isinstance(tier, dict) else getattr(tier, "name", None)
        if isinstance(name, str):
            names.append(name)
    return names


def missing_tiers(router_spec: Any, engine_spec: Any) -> list[str]:
    """Tiers the router may forward that the engine pods' policy does not define (sorted)."""
    return sorted(set(tier_names(router_spec)) - set(tier_names(engine_spec)))


def mismatch_message(router_policy: str, engine_policy: str, missing: list[str]) -> str:
    """What to tell the user, with the fix."""
    return (
        f"the router follows SLOPolicy {router_policy!r}, whose tiers {', '.join(missing)} SLOPolicy "
        f"{engine_policy!r} lacks: the engine pods would answer 400 unknown SLO tier. Set spec.policyRef "
        f"to {router_policy!r}, or add those tiers to {engine_policy!r}"
    )
