"""Registry of engine and router policies keyed by kebab-case names (what an SLOPolicy names).

Entries point at ``module:factory`` strings and are imported only when used, so listing policies
stays cheap and one broken optional policy cannot break the others. A factory takes the policy's
parameters as keyword arguments (validated by the policy's own pydantic params model).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, cast

from slo_core.objective import Objective, merge_objective_params
from slo_core.policies.base import EnginePolicy, RouterPolicy

ENGINE_POLICIES: dict[str, str] = {
    # baselines (bench issue)
    "fcfs": "slo_core.policies.baselines:FCFS",
    "sarathi": "slo_core.policies.baselines:Sarathi",
    "edf": "slo_core.policies.baselines:EDF",
    "sjf-oracle": "slo_core.policies.baselines:SJFOracle",
    "ltr": "slo_core.policies.baselines:LTR",
    "autellix": "slo_core.policies.baselines:AutellixPLAS",
    "strict-priority": "slo_core.policies.baselines:StrictPriority",
    # JITServe default scheduler and its ablations (issue 4)
    "gmax": "slo_core.policies.gmax:GMAX",
    "gmax-oracle": "slo_core.policies.gmax:GMAXOracle",
    "gmax-no-analyzer": "slo_core.policies.gmax:GMAXNoAnalyzer",
    "gmax-no-gmax": "slo_core.policies.gmax:GMAXNoGMAX",
    # seed papers (issue 5)
    "slide-batching": "slo_core.policies.slide_batching:SlideBatching",
    "tempo": "slo_core.policies.tempo:Tempo",
    "slos-serve": "slo_core.policies.slos_serve:SLOsServe",
    "annealing": "slo_core.policies.annealing:Annealing",
}

ROUTER_POLICIES: dict[str, str] = {
    "round-robin": "slo_core.policies.routers:RoundRobin",
    "min-load": "slo_core.policies.routers:MinLoad",
    "p2c": "slo_core.policies.routers:PowerOfTwo",
    "power-of-k": "slo_core.policies.power_of_k:PowerOfK",  # JITServe §4.3 (issue 4)
    # seed papers (issue 5)
    "go-routing": "slo_core.policies.go_routing:GoRouting",
    "slos-serve-reroute": "slo_core.policies.slos_serve_router:SLOsServeReroute",
}


def _load(table: Mapping[str, str], kind: str, name: str) -> Callable[..., Any]:
    target = table.get(name)
    if target is None:
        raise ValueError(f"unknown {kind} policy {name!r}; choose one of: {', '.join(sorted(table))}")
    module_name, _, attr = target.partition(":")
    return cast(Callable[..., Any], getattr(importlib.import_module(module_name), attr))


def _with_objective(
    factory: Callable[..., Any], name: str, params: Mapping[str, Any] | None, objective: Objective | None
) -> dict[str, Any]:
    """``params`` plus what ``objective`` sets in an objective-aware policy (see slo_core.objective)."""
    out = dict(params or {})
    derive = getattr(factory, "objective_params", None)
    if objective is None or derive is None:
        return out
    return merge_objective_params(name, out, derive(objective))


def make_engine_policy(
    name: str, params: Mapping[str, Any] | None = None, objective: Objective | None = None
) -> EnginePolicy:
    """Build the engine policy ``name`` with ``params`` (unknown params are a clear error).

    ``objective``: what SLO-aware policies maximize (spec.goodput, spec.fairness); policies without
    an ``objective_params`` classmethod do not read it.
    """
    factory = _load(ENGINE_POLICIES, "engine", name)
    return cast(EnginePolicy, factory(**_with_objective(factory, name, params, objective)))


def make_router_policy(
    name: str, params: Mapping[str, Any] | None = None, objective: Objective | None = None
) -> RouterPolicy:
    """Build the router policy ``name`` with ``params`` (and ``objective``, as for engine policies)."""
    factory = _load(ROUTER_POLICIES, "router", name)
    return cast(RouterPolicy, factory(**_with_objective(factory, name, params, objective)))


def objective_params(name: str, objective: Objective, kind: str = "engine") -> dict[str, Any]:
    """The parameters ``objective`` sets in the policy ``name`` ({} for a policy that does not read
    it). Two objectives that give a policy the same parameters give it the same schedule: its
    decisions read the objective only through them (``observe`` feedback carries gains, but no
    policy's decisions read them: GMAX, the one that does, derives different parameters per goodput)."""
    table = ENGINE_POLICIES if kind == "engine" else ROUTER_POLICIES
    derive = getattr(_load(table, kind, name), "objective_params", None)
    return dict(derive(objective)) if derive is not None else {}


def objective_aware(name: str, kind: str = "engine") -> bool:
    """Whether the policy ``name`` takes its parameters from the objective."""
    table = ENGINE_POLICIES if kind == "engine" else ROUTER_POLICIES
    return hasattr(_load(table, kind, name), "objective_params")


def engine_policy_names() -> list[str]:
    return sorted(ENGINE_POLICIES)


def router_policy_names() -> list[str]:
    return sorted(ROUTER_POLICIES)
