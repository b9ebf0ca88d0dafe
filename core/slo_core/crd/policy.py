"""The SLOPolicy custom resource: priority classes, SLO tiers, tenants, admission, goodput and policies.

An SLOPolicy is what a ModelDeployment follows and what the router reads: which tiers exist (each a
request kind with its targets and a priority class, JITServe §3 / PROSERVE §2), which tenants may use
which tiers at which rates, and which engine scheduling and routing policies run with which
parameters. ``runtime`` turns the spec into the one :class:`slo_core.runtime_policy.RuntimePolicy` every
process runs (``tiers_runtime``: its tiers as ``slo_core.slo.SLOTier``); cross-references (names that
must exist elsewhere in the spec, policy names and parameters) are checked by ``slo_core.crd.semantics``,
which sits above this model (it imports the model, never the reverse).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from slo_core.crd.common import LIST_SET, CRDModel, Name, ObjectMeta, SecretKeyRef, ShortName, cel, list_map
from slo_core.crd.status import SLOPolicyStatus
from slo_core.gain import GainParams
from slo_core.objective import Objective
from slo_core.runtime_policy import AdmissionRule, PolicyChoice, RuntimePolicy, TenantRule
from slo_core.slo import PriorityClass, RequestKind, SLOTier

MAX_PRIORITY_CLASSES = 16
MAX_TIERS = 32
MAX_TENANTS = 256
MAX_STAGES = 32

StageShare = Annotated[float, Field(gt=0, le=1)]
TierKind = Literal["latency", "deadline", "compound", "best-effort"]


class PriorityClassSpec(CRDModel):
    """A named priority class; its weight multiplies every goodput function (PROSERVE §2)."""

    name: str = Name("name tiers refer to, e.g. gold")
    weight: float = Field(
        1.0, gt=0, le=1000, description="gain multiplier of requests in this class (dimensionless, > 0)"
    )


class TierSpec(CRDModel):
    """An SLO tier: a request kind, its targets (seconds from arrival) and a priority class."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "self.kind != 'latency' || (has(self.ttftS) && has(self.tbtS))",
                "a latency tier needs ttftS (seconds to first token) and tbtS (seconds between tokens)",
            ),
            (
                "!(self.kind in ['deadline', 'compound']) || has(self.deadlineS)",
                "a deadline or compound tier needs deadlineS (seconds from arrival to completion)",
            ),
            (
                "!has(self.stageDeadlineShare) || self.kind == 'compound'",
                "stageDeadlineShare applies only to compound tiers",
            ),
        )
    )

    name: str = Name("tier name clients ask for (x-slo-tier header or the body's slo.tier), e.g. chat")
    kind: TierKind = Field(
        ...,
        description=(
            "latency: streamed, counted per token against ttftS + i·tbtS; deadline: counted when done by "
            "deadlineS; compound: a DAG of calls with one deadline for the whole; best-effort: no SLO"
        ),
    )
    ttft_s: float | None = Field(None, gt=0, le=86400, description="time to first token target (seconds)")
    tbt_s: float | None = Field(None, gt=0, le=3600, description="time between tokens target (seconds)")
    deadline_s: float | None = Field(
        None,
        gt=0,
        le=604800,
        description=(
            "end-to-end deadline (seconds from arrival; for compound tiers the whole program's); "
            "best-effort tiers may set one, else 120 s keeps them from starving"
        ),
    )
    priority_class: str = Field(
        ..., min_length=1, max_length=63, description="name of one of spec.priorityClasses"
    )
    stage_deadline_share: list[StageShare] | None = Field(
        None,
        min_length=1,
        max_length=MAX_STAGES,
        description=(
            "compound tiers: fraction (0 to 1] of the program deadline each stage may use, in stage order; "
            "the fractions sum to at most 1"
        ),
    )

    @model_validator(mode="after")
    def _targets_match_kind(self) -> TierSpec:
        if self.kind == "latency":
            if self.ttft_s is None:
                raise ValueError("ttftS: a latency tier needs ttftS (seconds to first token)")
            if self.tbt_s is None:
                raise ValueError("tbtS: a latency tier needs tbtS (seconds between tokens)")
        if self.kind in ("deadline", "compound") and self.deadline_s is None:
            raise ValueError(
                f"deadlineS: a {self.kind} tier needs deadlineS (seconds from arrival to completion)"
            )
        share = self.stage_deadline_share
        if share is not None:
            if self.kind != "compound":
                raise ValueError("stageDeadlineShare: only compound tiers split their deadline by stage")
            if any(not 0 < s <= 1 for s in share) or sum(share) > 1 + 1e-9:
                raise ValueError(
                    f"stageDeadlineShare: each share must be in (0, 1] and they must sum to at most 1, "
                    f"got {share}"
                )
        return self


class TenantSpec(CRDModel):
    """A tenant: its API keys (in a Secret), the tiers it may use and its rate limits."""

    name: str = Name("tenant name (appears in metrics and fairness accounting)")
    api_keys_secret: SecretKeyRef | None = Field(
        None,
        description=(
            "Secret key holding this tenant's API keys, one per line; absent: the tenant has no keys "
            "(usable only where the router does not require keys)"
        ),
    )
    allowed_tiers: list[ShortName] = Field(
        ...,
        min_length=1,
        max_length=MAX_TIERS,
        json_schema_extra=LIST_SET,
        description="names of spec.tiers this tenant may ask for",
    )
    default_tier: str | None = Field(
        None,
        max_length=63,
        description="tier of this tenant's requests that name none (absent: spec.defaultTier)",
    )
    requests_per_second: float | None = Field(
        None, gt=0, description="request rate limit (requests per second; absent: unlimited)"
    )
    tokens_per_second: float | None = Field(
        None, gt=0, description="token rate limit, prompt plus output (tokens per second; absent: unlimited)"
    )


class AdmissionSpec(CRDModel):
    """What happens to requests that cannot be served in time."""

    max_wait_s: float = Field(
        30.0, gt=0, le=3600, description="longest a request may wait in a queue before rejection (seconds)"
    )
    on_overload: Literal["reject", "best-effort"] = Field(
        "reject",
        description="reject: answer 429/503; best-effort: demote the request to the best-effort tier",
    )


class GoodputSpec(CRDModel):
    """The goodput function schedulers maximize, and its weights (all dimensionless)."""

    name: Literal["token", "request", "tempo", "tdg"] = Field(
        "token",
        description=(
            "token: JITServe token goodput; request: requests meeting their SLO; tempo: Tempo service gain "
            "with decay; tdg: PROSERVE token-level deadline-aware gain"
        ),
    )
    input_weight: float = Field(1.0, ge=0, description="tempo w_i: gain per input token")
    output_weight: float = Field(2.0, ge=0, description="tempo w_o: gain per output token")
    alpha: float = Field(1.0, gt=0, le=10, description="tempo decay exponent α in min(1, (SLO/actual)^α)")
    first_token_weight: float = Field(1.0, ge=0, description="tdg w_p: gain of the first token")
    decode_token_weight: float = Field(1.0, ge=0, description="tdg w_d: gain of each later token")

    def gain_params(self) -> GainParams:
        """The weights as the core goodput functions take them."""
        return GainParams(**self.model_dump(exclude={"name"}))


class PolicyRef(CRDModel):
    """A policy chosen by its registry name, with parameters its own params model validates."""

    name: str = Field(..., min_length=1, max_length=63, description="registry name (kebab-case), e.g. gmax")
    params: dict[str, Any] = Field(
        default_factory=dict, description="parameters of that policy (units as the policy documents)"
    )


class SLOPolicySpec(CRDModel):
    """Desired SLO behaviour for the ModelDeployments that reference this policy."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "self.tiers.all(t, self.tiers.exists_one(u, u.name == t.name))",
                "tier names must be unique",
            ),
            (
                "self.priorityClasses.all(p, self.priorityClasses.exists_one(q, q.name == p.name))",
                "priority class names must be unique",
            ),
            (
                "self.tiers.all(t, self.priorityClasses.exists(p, p.name == t.priorityClass))",
                "every tier's priorityClass must name one of spec.priorityClasses",
            ),
            (
                "self.tiers.exists(t, t.name == self.defaultTier)",
                "defaultTier must name one of spec.tiers",
            ),
        )
    )

    priority_classes: list[PriorityClassSpec] = Field(
        ...,
        min_length=1,
        max_length=MAX_PRIORITY_CLASSES,
        json_schema_extra=list_map("name"),
        description="priority classes and their weights",
    )
    tiers: list[TierSpec] = Field(
        ..., min_length=1, max_length=MAX_TIERS, json_schema_extra=list_map("name"), description="SLO tiers"
    )
    default_tier: str = Field(
        ..., min_length=1, max_length=63, description="tier of requests that name none (one of spec.tiers)"
    )
    tenants: list[TenantSpec] = Field(
        default_factory=list,
        max_length=MAX_TENANTS,
        json_schema_extra=list_map("name"),
        description="tenants allowed to send requests",
    )
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec, description="admission control")
    goodput: GoodputSpec = Field(default_factory=GoodputSpec, description="goodput function to maximize")
    scheduling: PolicyRef = Field(
        default_factory=lambda: PolicyRef(name="gmax"), description="engine-level scheduling policy"
    )
    routing: PolicyRef = Field(
        default_factory=lambda: PolicyRef(name="power-of-k"), description="router policy across replicas"
    )
    fairness: float = Field(
        0.0,
        ge=0,
        le=1,
        description="per-tenant fairness weight f in (1−f)·priority + f·fair share (0 to 1; 0: none)",
    )

    def tiers_runtime(self) -> dict[str, SLOTier]:
        """The tiers as core ``SLOTier`` objects keyed by name (ValueError on an unknown priority class)."""
        classes = {p.name: PriorityClass(p.name, p.weight) for p in self.priority_classes}
        out: dict[str, SLOTier] = {}
        for tier in self.tiers:
            pc = classes.get(tier.priority_class)
            if pc is None:
                raise ValueError(
                    f"tier {tier.name!r}: priority class {tier.priority_class!r} "
                    f"is not one of {sorted(classes)}"
                )
            share = tier.stage_deadline_share
            out[tier.name] = SLOTier(
                name=tier.name,
                kind=RequestKind(tier.kind),
                priority_class=pc,
                ttft_s=tier.ttft_s,
                tbt_s=tier.tbt_s,
                deadline_s=tier.deadline_s,
                stage_deadline_share=tuple(share) if share is not None else None,
            )
        return out

    def runtime(self) -> RuntimePolicy:
        """The spec as every process runs it (ValueError on an unknown priority class or goodput name).

        Built here and nowhere else: the router, the sidecar, the vLLM plugin, the operator, the fleet
        simulator and the local fleet all take this object.
        """
        tiers = self.tiers_runtime()
        default = self.default_tier
        be_name = RuntimePolicy.best_effort_tier_of(tiers)
        on_overload = self.admission.on_overload
        if on_overload == "best-effort" and be_name is None:
            on_overload = (
                "reject"  # semantics reports it; a process never demotes to a tier that is not there
            )
        return RuntimePolicy(
            tiers=tiers,
            default_tier=default,
            tenants={
                t.name: TenantRule(
                    name=t.name,
                    allowed_tiers=tuple(t.allowed_tiers) or (t.default_tier or default,),
                    default_tier=t.default_tier or default,
                    requests_per_s=t.requests_per_second,
                    tokens_per_s=t.tokens_per_second,
                    api_keys_secret=(
                        (t.api_keys_secret.name, t.api_keys_secret.key) if t.api_keys_secret else None
                    ),
                )
                for t in self.tenants
            },
            admission=AdmissionRule(
                on_overload=on_overload,
                best_effort_tier=be_name,
                best_effort=tiers[be_name] if be_name is not None else None,
                max_wait_s=float(self.admission.max_wait_s),
            ),
            objective=Objective(
                goodput=self.goodput.name, gain=self.goodput.gain_params(), fairness=self.fairness
            ),
            scheduling=PolicyChoice(self.scheduling.name, self.scheduling.params),
            routing=PolicyChoice(self.routing.name, self.routing.params),
            fairness=self.fairness,
        )


class SLOPolicy(CRDModel):
    """An SLOPolicy object as stored in Kubernetes (apiVersion slofleet.io/v1alpha1)."""

    api_version: Literal["slofleet.io/v1alpha1"] = Field(
        "slofleet.io/v1alpha1", description="API group and version"
    )
    kind: Literal["SLOPolicy"] = Field("SLOPolicy", description="object kind")
    metadata: ObjectMeta = Field(..., description="object metadata")
    spec: SLOPolicySpec = Field(..., description="desired SLO behaviour")
    status: SLOPolicyStatus | None = Field(None, description="observed state, written by the operator")
