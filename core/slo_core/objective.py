"""What an SLO-aware policy maximizes: the goodput function, its weights and per-tenant fairness.

An :class:`Objective` is built from an SLOPolicy (``spec.goodput`` and ``spec.fairness``) or from
``slofleet bench --objective/--fairness`` and handed to every SLO-aware engine and router policy
through the registry (``make_engine_policy(name, params, objective=...)``). Each such policy class
declares how the objective sets its own parameters in ``objective_params(objective)``; parameters
that the objective sets may not also be given in the policy's ``params`` with a different value (one
place decides what is maximized). Priority weights are not part of the objective object: each
request carries its class's weight (``SLOTargets.priority_weight``), and every goodput function
multiplies by it (PROSERVE §2).

Fairness (``spec.fairness`` = f, 0..1): with f > 0, GMAX blends each request's priority with its
tenant's fair share, (1 − f)·priority + f·Fair·max priority, where Fair = 1 − S(tenant)/max S over
the tenants in the queue (S = decayed attained service in tokens, half-life
``fairness_half_life_s``). A tenant that has taken the most service thus loses up to f of its
priority against the others; f = 1 orders purely by least attained service, so no tenant can take
the whole engine while another waits.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from slo_core.gain import Delivery, GainParams, GoodputFunction, goodput_function


class _GoodputSpec(Protocol):
    @property
    def name(self) -> str: ...

    def gain_params(self) -> GainParams: ...


class _PolicySpec(Protocol):
    """What ``from_spec`` reads of an SLOPolicySpec (slo_core.crd.policy), without importing the CRD layer."""

    @property
    def goodput(self) -> _GoodputSpec: ...

    @property
    def fairness(self) -> float: ...


GoodputName = Literal["token", "request", "tempo", "tdg"]
GOODPUT_NAMES: tuple[str, ...] = ("token", "request", "tempo", "tdg")


class Objective(BaseModel):
    """The goodput function a policy maximizes, its weights and the fairness weight (pure, frozen)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    goodput: GoodputName = Field("token", description="goodput function (slo_core.gain name)")
    gain: GainParams = Field(default_factory=GainParams, description="weights of the goodput functions")
    fairness: float = Field(
        0.0, ge=0, le=1, description="per-tenant fairness weight f in (1−f)·priority + f·Fair (0: none)"
    )
    fairness_half_life_s: float = Field(
        300.0, gt=0, description="half-life (s) of a tenant's attained service behind Fair"
    )

    @classmethod
    def from_spec(cls, spec: _PolicySpec) -> Objective:
        """The objective an SLOPolicy configures (spec.goodput and spec.fairness)."""
        name = spec.goodput.name
        if name not in GOODPUT_NAMES:
            raise ValueError(f"unknown goodput {name!r}; one of {', '.join(GOODPUT_NAMES)}")
        return cls(goodput=name, gain=spec.goodput.gain_params(), fairness=spec.fairness)

    def function(self) -> GoodputFunction:
        """The goodput function itself (takes a Delivery and this objective's GainParams)."""
        return goodput_function(self.goodput)

    def __call__(self, delivery: Delivery) -> float:
        """The gain of ``delivery`` under this objective (its function with its weights)."""
        return goodput_function(self.goodput)(delivery, self.gain)


class ObjectiveAware(Protocol):
    """A policy class whose parameters the objective sets."""

    @classmethod
    def objective_params(cls, objective: Objective) -> dict[str, object]: ...


def merge_objective_params(
    policy: str, params: dict[str, object], derived: dict[str, object]
) -> dict[str, object]:
    """``params`` with the objective-derived values added; a conflicting explicit value is an error."""
    out = dict(params)
    for key, value in derived.items():
        mine = params.get(key)
        if isinstance(mine, dict) and isinstance(value, dict):  # nested params (a router's gmax)
            out[key] = merge_objective_params(f"{policy}.{key}", mine, value)
            continue
        if key in params and mine != value:
            raise ValueError(
                f"{policy}: parameter {key!r} = {params[key]!r} contradicts the objective's {value!r}; "
                "set what is maximized in spec.goodput / spec.fairness (or bench --objective/--fairness), "
                "not in the policy's params"
            )
        out[key] = value
    return out
