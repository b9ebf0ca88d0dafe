"""The operator's view of a ModelDeployment: the fields rendering needs, read from the custom resource body.

``slo_core.crd``'s pydantic model validates the spec (and fills its defaults); this module maps it to the
plain values the renderer uses, so the renderer stays a pure function of plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from slo_core.crd.deployment import ModelDeploymentSpec
from slo_core.crd.errors import validation_problems
from slo_core.crd.podspec import PodSettings

MD_PLURAL = "modeldeployments"
POLICY_PLURAL = "slopolicies"


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from: exactly one of a Hugging Face id, a PVC path or a URI."""

    hf_id: str | None = None
    hf_revision: str | None = None
    hf_token_secret: str | None = None
    hf_token_key: str = "token"  # noqa: S105 - the key inside the Secret, not a credential
    pvc_claim: str | None = None
    pvc_path: str = ""
    uri: str | None = None


@dataclass(frozen=True)
class ModelDeploymentView:
    """Everything the desired children of one ModelDeployment depend on."""

    name: str
    namespace: str
    uid: str
    generation: int
    served_name: str
    source: ModelSource
    policy: str
    replicas: int = 1
    max_replicas: int = 1  # above replicas (the min): the operator's autoscaler owns the count
    gpu_count: int = 1
    gpu_type: str | None = None
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    engine_image: str | None = None
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    dtype: str | None = None
    kv_cache_fraction: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    extra_args: list[str] = field(default_factory=list)
    sidecar_image: str | None = None
    sidecar_resources: dict[str, Any] = field(default_factory=dict)
    engine_resources: dict[str, Any] = field(default_factory=dict)
    cache_size_limit: str = "200Gi"
    predictor: tuple[str, str] | None = None  # (ConfigMap, sha256) of a retrained length predictor
    context_length: int | None = None
    gpu_class: str | None = None
    lora_adapters: list[tuple[str, str]] = field(default_factory=list)  # (name, source)
    pod_settings: PodSettings = field(default_factory=PodSettings)
    engine_env: list[tuple[str, str]] = field(default_factory=list)  # (name, literal value)
    model_cache: tuple[str, str] | None = None  # ("pvc", claim) or ("hostPath", path)
    profile: str | None = None  # performance profile (None: none fits)
    profile_reason: str = ""


def _chosen(section: BaseModel, field_name: str) -> Any:
    """A value the user chose, or ``None`` where the spec holds the schema's default.

    The API server writes CRD defaults into stored objects, so a default image cannot be told from a
    chosen one by presence; an image equal to the default defers to the operator's configured image.
    """
    value = getattr(section, field_name)
    return None if value == type(section).model_fields[field_name].default else value


def view(body: dict[str, Any]) -> ModelDeploymentView:
    """Read a ModelDeployment body into a :class:`ModelDeploymentView` (``ValueError`` on an invalid spec)."""
    meta = body.get("metadata", {})
    try:
        spec = ModelDeploymentSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        raise ValueError("; ".join(validation_problems(exc, "spec"))) from None
    src = spec.model.source
    token = spec.model.hf_token_secret
    profile, profile_reason = spec.chosen_profile()
    return ModelDeploymentView(
        name=meta["name"],
        namespace=meta.get("namespace") or "default",
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 1),
        served_name=spec.model.served_name,
        source=ModelSource(
            hf_id=src.hf_id,
            hf_revision=src.revision,
            hf_token_secret=token.name if token else None,
            hf_token_key=token.key if token else "token",
            pvc_claim=src.pvc.claim_name if src.pvc else None,
            pvc_path=src.pvc.path if src.pvc else "",
            uri=src.uri,
        ),
        policy=spec.policy_ref,
        replicas=spec.replicas.min,
        max_replicas=spec.replicas.max,
        gpu_count=spec.gpu.count,
        gpu_type=spec.gpu.type,
        gpu_resource=spec.gpu.resource_name,
        node_selector=dict(spec.gpu.node_selector),
        tolerations=[t.model_dump(by_alias=True, exclude_none=True) for t in spec.gpu.tolerations],
        engine_image=_chosen(spec.engine, "image"),
        tensor_parallel_size=spec.engine.tensor_parallel_size,
        max_model_len=spec.engine.max_model_len,
        dtype=spec.engine.dtype,
        kv_cache_fraction=spec.engine.gpu_memory_utilization,
        max_num_seqs=spec.engine.max_num_seqs,
        max_num_batched_tokens=spec.engine.max_num_batched_tokens,
        extra_args=list(spec.engine.extra_args),
        sidecar_image=_chosen(spec.sidecar, "image"),
        sidecar_resources=spec.sidecar.resources.model_dump(exclude_defaults=True),
        engine_resources=spec.engine.resources.model_dump(exclude_defaults=True),
        cache_size_limit=str(spec.engine.cache_size_limit),
        predictor=(spec.sidecar.predictor.config_map, spec.sidecar.predictor.sha256)
        if spec.sidecar.predictor
        else None,
        context_length=spec.context_tokens(),
        gpu_class=spec.gpu_class(),
        lora_adapters=[(a.name, a.source) for a in spec.capabilities.lora_adapters],
        pod_settings=spec.pod,
        engine_env=[(e.name, e.value) for e in spec.engine.env],
        model_cache=_cache(spec),
        profile=profile,
        profile_reason=profile_reason,
    )


def _cache(spec: ModelDeploymentSpec) -> tuple[str, str] | None:
    cache = spec.engine.model_cache
    if cache is None:
        return None
    return ("pvc", cache.pvc) if cache.pvc else ("hostPath", str(cache.host_path))
