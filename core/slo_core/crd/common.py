"""Shared pieces of the slofleet custom resources: base model, metadata, Secret references, conditions.

Every model forbids unknown fields and names its YAML keys in camelCase (``ttftS``) while Python code
uses snake_case attributes (``ttft_s``); both spellings are accepted on input. A model's
``x-kubernetes-validations`` (CEL rules) live in its ``json_schema_extra`` so that the generated CRD
and the pydantic validators state the same cross-field rules side by side.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

API_GROUP = "slofleet.io"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"

# Kubernetes object names (RFC 1123 labels) and the names slofleet uses inside a spec.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX_CHARS = 63


def cel(*rules: tuple[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` holding CEL rules as (rule, message) pairs."""
    return {"x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in rules]}


class CRDModel(BaseModel):
    """Base of every spec/status model: unknown fields are errors; YAML keys are camelCase."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        alias_generator=to_camel,
        validate_default=False,
    )


def list_map(*keys: str) -> dict[str, Any]:
    """``json_schema_extra`` of a list of objects keyed (and made unique) by ``keys`` (server-side apply)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


LIST_SET: dict[str, Any] = {"x-kubernetes-list-type": "set"}
ShortName = Annotated[str, Field(min_length=1, max_length=NAME_MAX_CHARS)]


def Name(description: str) -> Any:
    """A required RFC 1123 label (lower-case letters, digits and '-'; at most 63 characters)."""
    return Field(..., min_length=1, max_length=NAME_MAX_CHARS, pattern=DNS_LABEL, description=description)


class ObjectMeta(BaseModel):
    """The part of Kubernetes object metadata slofleet reads; server-set fields are ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, alias_generator=to_camel)

    name: str = Field(..., min_length=1, max_length=253, description="object name")
    namespace: str | None = Field(None, description="namespace (absent: the current one)")
    labels: dict[str, str] = Field(default_factory=dict, description="labels")
    annotations: dict[str, str] = Field(default_factory=dict, description="annotations")
    generation: int | None = Field(None, description="set by the API server; bumps on every spec change")


class SecretKeyRef(CRDModel):
    """A key inside a Secret in the object's namespace (never a literal credential)."""

    name: str = Name("name of the Secret")
    key: str = Field(
        ...,
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="key inside the Secret's data",
    )


ConditionType = Literal["Ready", "Progressing", "Degraded", "PluginDegraded"]


class Condition(CRDModel):
    """One observation of the object's state, in the Kubernetes condition convention."""

    type: ConditionType = Field(
        ...,
        description="Ready: serving or accepted; Progressing: a rollout is under way; Degraded: a problem; "
        "PluginDegraded: the vLLM scheduler plugin of some engine pods fell back to vLLM's stock order",
    )
    status: Literal["True", "False", "Unknown"] = Field(..., description="whether the condition holds")
    reason: str = Field(
        ...,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="CamelCase machine-readable reason, e.g. ReplicasReady, PolicyNotFound",
    )
    message: str = Field("", max_length=32768, description="human-readable explanation and what to change")
    last_transition_time: str | None = Field(
        None, description="RFC 3339 time (UTC) when the status last changed, e.g. 2026-01-01T00:00:00Z"
    )
    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation the condition was computed from"
    )
