"""Status of the slofleet custom resources, written by the operator through the status subresource."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from slo_core.crd.autoscaling import AutoscalingStatus
from slo_core.crd.common import Condition, CRDModel, list_map

PolicyPhase = Literal["Pending", "Ready", "Invalid"]
DeploymentPhase = Literal["Pending", "Progressing", "Ready", "Degraded", "Failed"]


class SLOPolicyStatus(CRDModel):
    """What the operator observed about an SLOPolicy."""

    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation this status describes"
    )
    phase: PolicyPhase | None = Field(
        None, description="Ready: accepted and rendered; Invalid: see the Degraded condition's message"
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        json_schema_extra=list_map("type"),
        description="Ready / Progressing / Degraded conditions",
    )
    deployments: int | None = Field(None, ge=0, description="number of ModelDeployments that reference it")


class EndpointStatus(CRDModel):
    """One serving replica (pod) of a ModelDeployment, as the router reaches it."""

    pod: str = Field(..., min_length=1, max_length=253, description="pod name")
    address: str = Field(
        ..., min_length=1, max_length=512, description="sidecar HTTP address, host:port (e.g. 10.0.0.7:8080)"
    )
    ready: bool = Field(False, description="whether the pod passes its readiness probe")


class ModelDeploymentStatus(CRDModel):
    """What the operator observed about a ModelDeployment."""

    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation this status describes"
    )
    phase: DeploymentPhase | None = Field(
        None,
        description=(
            "Pending: nothing scheduled yet; Progressing: rolling out; Ready: all desired replicas serve; "
            "Degraded: serving with fewer replicas or a problem; Failed: cannot serve (see conditions)"
        ),
    )
    replicas: int | None = Field(None, ge=0, description="pods the operator currently wants (replicas)")
    ready_replicas: int | None = Field(None, ge=0, description="pods ready to serve (replicas)")
    updated_replicas: int | None = Field(
        None, ge=0, description="pods running the current spec and policy (replicas)"
    )
    endpoints: list[EndpointStatus] = Field(
        default_factory=list,
        max_length=1024,
        json_schema_extra=list_map("pod"),
        description="serving pods and their sidecar addresses",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        json_schema_extra=list_map("type"),
        description="Ready / Progressing / Degraded conditions",
    )
    policy_config_map: str | None = Field(
        None, max_length=253, description="name of the ConfigMap holding the rendered SLOPolicy"
    )
    autoscaling: AutoscalingStatus | None = Field(
        None, description="the operator's last scaling decision (absent before the first)"
    )
    profile: str | None = Field(
        None,
        max_length=1024,
        description="performance profile the sidecar and autoscaler use, and why; 'none: ...' says why none "
        "fits (the router then estimates with its fallback)",
    )
