"""spec.autoscaling of a ModelDeployment and status.autoscaling: how the operator scales between
replicas.min and replicas.max, and what it last decided.

The operator scales only when ``replicas.max > replicas.min`` and no HorizontalPodAutoscaler targets the
engine Deployment; both it and the simulator turn these fields into one
:class:`slo_core.scaling.ScalingParams` through :meth:`AutoscalingSpec.params`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from slo_core.crd.common import CRDModel
from slo_core.scaling import ScalingParams

Fraction = float


class AutoscalingSpec(CRDModel):
    """Goodput-driven scaling between replicas.min and replicas.max (see slo_core.scaling)."""

    metric: Literal["goodput", "queue"] = Field(
        "goodput",
        description="goodput: tiers' SLO attainment, rejections, admitted work and demand against a "
        "replica's goodput capacity; queue: waiting requests per ready replica (the HPA baseline)",
    )
    attainment_target: Fraction = Field(
        0.9, gt=0, le=1, description="share of a tier's requests that must meet its SLO (fraction)"
    )
    tier_targets: dict[str, Fraction] = Field(
        default_factory=dict, description="per-tier attainment targets overriding attainmentTarget (fraction)"
    )
    utilization: Fraction = Field(
        0.75, gt=0, le=1, description="share of a replica's goodput capacity to plan for (fraction)"
    )
    capacity_tokens_per_s: float | None = Field(
        None,
        gt=0,
        description="tokens per second one replica serves within the tightest tier's TBT (absent: from "
        "the performance profile; without a profile the operator does not scale and says so)",
    )
    drain_s: float = Field(30.0, gt=0, le=3600, description="admitted work should drain within this (s)")
    min_samples: int = Field(
        20, ge=1, le=100000, description="outcomes a tier needs in a period before its attainment counts"
    )
    target_queue: float = Field(
        4.0, gt=0, description="queue metric: waiting requests per ready replica to aim for (requests)"
    )
    up_window_s: float = Field(0.0, ge=0, le=3600, description="scale-up stabilization window (s)")
    down_window_s: float = Field(300.0, ge=0, le=86400, description="scale-down stabilization window (s)")
    max_step_up: int = Field(4, ge=1, le=1000, description="most replicas added by one decision (replicas)")
    max_step_down: int = Field(
        1, ge=1, le=1000, description="most replicas removed by one decision (replicas)"
    )

    def params(self, min_replicas: int, max_replicas: int) -> ScalingParams:
        """The decision's parameters, bounded by the ModelDeployment's replica range."""
        return ScalingParams(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            metric=self.metric,
            utilization=self.utilization,
            drain_s=self.drain_s,
            min_samples=self.min_samples,
            target_queue=self.target_queue,
            up_window_s=self.up_window_s,
            down_window_s=self.down_window_s,
            max_step_up=self.max_step_up,
            max_step_down=self.max_step_down,
        )

    def target(self, tier: str) -> float:
        return self.tier_targets.get(tier, self.attainment_target)


AutoscalingMode = Literal["Fixed", "Goodput", "Queue", "External", "Blocked"]


class TierAttainment(CRDModel):
    """One tier's outcomes in the last scaling period."""

    tier: str = Field(..., min_length=1, max_length=63, description="tier name")
    finished: int = Field(0, ge=0, description="requests that ended in the period (requests)")
    met: int = Field(0, ge=0, description="of which met their SLO (requests)")
    target: Fraction = Field(..., ge=0, le=1, description="attainment target (fraction)")


class AutoscalingStatus(CRDModel):
    """The operator's last scaling decision and the signals it was made from."""

    mode: AutoscalingMode = Field(
        ...,
        description="Fixed: replicas.min == replicas.max; Goodput/Queue: the operator scales by that "
        "metric; External: an HPA targets the Deployment, the operator does not touch replicas; "
        "Blocked: it cannot scale (reason says why)",
    )
    desired_replicas: int | None = Field(None, ge=0, description="replicas the last decision asked for")
    recommendation: int | None = Field(
        None, ge=0, description="replicas the signals asked for before stabilization and bounds"
    )
    reason: str = Field("", max_length=1024, description="why, in words")
    last_scale_time: str | None = Field(None, description="RFC 3339 time of the last replica change")
    ready: int | None = Field(None, ge=0, description="ready replicas at the decision")
    starting: int | None = Field(None, ge=0, description="replicas started but not ready")
    demand_tokens_per_s: float | None = Field(None, ge=0, description="work arriving (tokens/s)")
    admitted_tokens: float | None = Field(None, ge=0, description="outstanding admitted work (tokens)")
    capacity_tokens_per_s: float | None = Field(None, ge=0, description="one replica's capacity (tokens/s)")
    rejected: int | None = Field(None, ge=0, description="requests the sidecars rejected in the period")
    tiers: list[TierAttainment] = Field(
        default_factory=list, max_length=64, description="per-tier attainment in the period"
    )
