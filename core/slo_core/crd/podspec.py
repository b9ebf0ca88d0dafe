"""What a platform team sets on engine pods: spec.pod (service account, pull secrets, priority class,
affinity, topology spread), spec.engine.env and spec.engine.modelCache of a ModelDeployment.

Affinity and topology spread constraints are Kubernetes' own types, kept verbatim (the API server
validates them when the operator applies the Deployment). Environment variables are literal values: a
``valueFrom`` could name any Secret of the namespace, which only labelled Secrets may be (hfTokenSecret).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator

from slo_core.crd.common import DNS_LABEL, CRDModel, cel

# Set by the operator on the vLLM container; a ModelDeployment may not override them.
RESERVED_ENV = (
    "PYTHONPATH",
    "HOME",
    "HF_HOME",
    "HF_TOKEN",
    "VLLM_CACHE_ROOT",
    "TRITON_CACHE_DIR",
    "PYTHONDONTWRITEBYTECODE",
    "VLLM_NO_USAGE_STATS",
    "DO_NOT_TRACK",
)
_RESERVED_CEL = "[" + ", ".join(f"'{n}'" for n in RESERVED_ENV) + "]"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
SecretName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]


class EnvVar(CRDModel):
    """One environment variable of the vLLM container (a literal value)."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                f"!self.name.startsWith('SLOFLEET_') && !(self.name in {_RESERVED_CEL})",
                "the operator sets this variable (SLOFLEET_* and vLLM's paths and token are reserved)",
            )
        )
    )

    name: str = Field(
        ..., min_length=1, max_length=253, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="variable name"
    )
    value: str = Field("", max_length=32768, description="literal value (never a credential: use a Secret)")

    @model_validator(mode="after")
    def _not_reserved(self) -> EnvVar:
        if self.name.startswith("SLOFLEET_") or self.name in RESERVED_ENV:
            raise ValueError(
                f"name: {self.name} is set by the operator (SLOFLEET_* and {', '.join(RESERVED_ENV)})"
            )
        return self


class ModelCache(CRDModel):
    """Where vLLM's download cache (HF_HOME) lives, shared across pod restarts: a PVC or a node path."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "[has(self.pvc), has(self.hostPath)].filter(x, x).size() == 1",
                "set exactly one of pvc or hostPath",
            )
        )
    )

    pvc: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="PersistentVolumeClaim (same namespace) mounted read-write; ReadWriteMany when replicas "
        "may land on several nodes",
    )
    host_path: str | None = Field(
        None,
        min_length=2,
        max_length=1024,
        pattern=r"^/.*$",
        description="node directory (created if missing); needs a namespace whose Pod Security level "
        "allows hostPath (privileged)",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelCache:
        if (self.pvc is None) == (self.host_path is None):
            raise ValueError("set exactly one of pvc or hostPath")
        return self


class PodSettings(CRDModel):
    """Scheduling and identity of the engine pods."""

    service_account_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="ServiceAccount the engine pods run as (its token is still not mounted unless "
        "automountServiceAccountToken is true)",
    )
    automount_service_account_token: bool = Field(
        False, description="mount the ServiceAccount's token (e.g. for workload identity to the weights)"
    )
    image_pull_secrets: list[SecretName] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets (same namespace) the kubelet pulls the vLLM and slofleet images with",
    )
    priority_class_name: str | None = Field(
        None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN, description="PriorityClass of the pods"
    )
    affinity: dict[str, Any] | None = Field(
        None, description="Kubernetes affinity (nodeAffinity, podAffinity, podAntiAffinity), verbatim"
    )
    topology_spread_constraints: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=8,
        description="Kubernetes topologySpreadConstraints, verbatim (labelSelector may use the pods' "
        "labels, e.g. slofleet.io/model-deployment)",
    )
