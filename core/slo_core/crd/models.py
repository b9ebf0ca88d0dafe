"""The slofleet custom resources in one import: SLOPolicy and ModelDeployment, their specs and statuses."""

from __future__ import annotations

from slo_core.crd.common import (
    API_GROUP,
    API_VERSION,
    GROUP_VERSION,
    Condition,
    CRDModel,
    ObjectMeta,
    SecretKeyRef,
)
from slo_core.crd.deployment import (
    Capabilities,
    EngineSpec,
    GPUSpec,
    LoRAAdapter,
    ModelDeployment,
    ModelDeploymentSpec,
    ModelSource,
    ModelSpec,
    PVCSource,
    ReplicaRange,
    ResourceRequirements,
    SidecarSpec,
    Toleration,
)
from slo_core.crd.policy import (
    AdmissionSpec,
    GoodputSpec,
    PolicyRef,
    PriorityClassSpec,
    SLOPolicy,
    SLOPolicySpec,
    TenantSpec,
    TierSpec,
)
from slo_core.crd.status import EndpointStatus, ModelDeploymentStatus, SLOPolicyStatus

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "GROUP_VERSION",
    "AdmissionSpec",
    "CRDModel",
    "Capabilities",
    "Condition",
    "EndpointStatus",
    "EngineSpec",
    "GPUSpec",
    "GoodputSpec",
    "LoRAAdapter",
    "ModelDeployment",
    "ModelDeploymentSpec",
    "ModelDeploymentStatus",
    "ModelSource",
    "ModelSpec",
    "ObjectMeta",
    "PVCSource",
    "PolicyRef",
    "PriorityClassSpec",
    "ReplicaRange",
    "ResourceRequirements",
    "SLOPolicy",
    "SLOPolicySpec",
    "SLOPolicyStatus",
    "SecretKeyRef",
    "SidecarSpec",
    "TenantSpec",
    "TierSpec",
    "Toleration",
]
