"""The ModelDeployment custom resource: one served model as vLLM pods with the slofleet sidecar.

The operator turns a ModelDeployment into a Deployment of pods, each running vLLM (with the slofleet
scheduler plugin) next to the slofleet sidecar, following the SLOPolicy named by ``policyRef``. The
declared capabilities are what the router filters on before it routes (context length, GPU class,
LoRA adapters).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from slo_core.crd.autoscaling import AutoscalingSpec
from slo_core.crd.common import CRDModel, Name, ObjectMeta, SecretKeyRef, cel
from slo_core.crd.podspec import EnvVar, ModelCache, PodSettings
from slo_core.crd.status import ModelDeploymentStatus
from slo_core.perf.profiles import choose_profile, list_profiles

Quantity = int | str
Arg = Annotated[str, Field(max_length=4096)]


class PVCSource(CRDModel):
    """Model weights on a PersistentVolumeClaim in the same namespace."""

    claim_name: str = Name("name of the PersistentVolumeClaim")
    path: str = Field(
        "/", min_length=1, max_length=1024, description="directory inside the volume holding the weights"
    )


class ModelSource(CRDModel):
    """Where the weights come from: exactly one of a Hugging Face id, a PVC path or a URI."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "[has(self.hfId), has(self.pvc), has(self.uri)].filter(x, x).size() == 1",
                "set exactly one of hfId, pvc or uri",
            )
        )
    )

    hf_id: str | None = Field(
        None,
        max_length=256,
        pattern=r"^[A-Za-z0-9][-._A-Za-z0-9]*(/[-._A-Za-z0-9]+)?$",
        description="Hugging Face model id, e.g. meta-llama/Llama-3.1-8B-Instruct",
    )
    revision: str | None = Field(
        None, max_length=256, description="Hugging Face revision (branch, tag or commit)"
    )
    pvc: PVCSource | None = Field(None, description="weights on a PersistentVolumeClaim")
    uri: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^[a-z][a-z0-9+.-]*://.+$",
        description="weights at a URI vLLM can load, e.g. s3://bucket/llama-70b/",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        given = [n for n, v in (("hfId", self.hf_id), ("pvc", self.pvc), ("uri", self.uri)) if v is not None]
        if len(given) != 1:
            raise ValueError(f"set exactly one of hfId, pvc or uri (got {', '.join(given) or 'none'})")
        return self


class ModelSpec(CRDModel):
    """The model to serve."""

    served_name: str = Field(
        ...,
        min_length=1,
        max_length=256,
        description="name clients put in the OpenAI 'model' field, e.g. llama-3.1-8b-instruct",
    )
    source: ModelSource = Field(..., description="where the weights come from")
    hf_token_secret: SecretKeyRef | None = Field(
        None, description="Secret key holding a Hugging Face token (for gated models)"
    )


class ReplicaRange(CRDModel):
    """How many pods may serve the model; the operator scales between the bounds."""

    model_config = ConfigDict(
        json_schema_extra=cel(("self.min <= self.max", "replicas.min must not exceed replicas.max"))
    )

    min: int = Field(1, ge=0, le=1000, description="fewest pods (replicas)")
    max: int = Field(1, ge=1, le=1000, description="most pods (replicas)")

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaRange:
        if self.min > self.max:
            raise ValueError(f"min: replicas.min ({self.min}) must not exceed max ({self.max})")
        return self


class Toleration(CRDModel):
    """A Kubernetes toleration (as in a pod spec)."""

    key: str | None = Field(None, max_length=253, description="taint key (absent with Exists: every taint)")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="how key and value are matched")
    value: str | None = Field(None, max_length=253, description="taint value (with Equal)")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="taint effect to tolerate (absent: all)"
    )
    toleration_seconds: int | None = Field(
        None, ge=0, description="with NoExecute: how long the pod stays bound after the taint (seconds)"
    )


class GPUSpec(CRDModel):
    """GPUs per pod and where such GPUs are."""

    count: int = Field(1, ge=1, le=16, description="GPUs per pod (devices)")
    type: str = Field(
        ...,
        min_length=1,
        max_length=63,
        description="GPU model, e.g. H100-80GB (informational; nodeSelector places the pods)",
    )
    resource_name: str = Field(
        "nvidia.com/gpu", min_length=1, max_length=253, description="extended resource to request"
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="node labels the pods require, e.g. nvidia.com/gpu.product"
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="tolerations of GPU node taints"
    )


class ResourceRequirements(CRDModel):
    """Container resource requests and limits (Kubernetes quantities, e.g. 500m, 1Gi)."""

    requests: dict[str, Quantity] = Field(default_factory=dict, description="resources requested")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="resource limits")


class EngineSpec(CRDModel):
    """vLLM engine settings."""

    image: str = Field(
        "vllm/vllm-openai:v0.32.0", min_length=1, max_length=512, description="vLLM container image"
    )
    tensor_parallel_size: int = Field(1, ge=1, le=16, description="GPUs one model replica spans (devices)")
    max_model_len: int | None = Field(
        None, ge=1, description="longest prompt plus output the engine accepts (tokens; absent: the model's)"
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto", description="weight and activation dtype"
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="fraction of GPU memory vLLM may use, weights plus KV cache (0 to 1]"
    )
    max_num_seqs: int | None = Field(None, ge=1, description="most requests in one batch (requests)")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="most tokens in one step (tokens)")
    extra_args: list[Arg] = Field(
        default_factory=list, max_length=64, description="further vLLM command-line arguments, verbatim"
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="vLLM container CPU and memory (the GPUs come from spec.gpu); absent: 4 CPUs and "
        "32Gi requested, 64Gi memory limit",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="environment variables of the vLLM container (literal values)",
    )
    model_cache: ModelCache | None = Field(
        None,
        description="a PVC or node path for vLLM's download cache, kept across restarts (absent: an emptyDir "
        "of cacheSizeLimit)",
    )
    cache_size_limit: Quantity = Field(
        "200Gi",
        description="most disk the model-download cache (an emptyDir) may use; the pod is evicted beyond",
    )


class PredictorRef(CRDModel):
    """A length-predictor artefact (``slofleet predictor train --from-history --configmap``) to serve."""

    config_map: str = Field(
        ...,
        min_length=1,
        max_length=253,
        description="ConfigMap (same namespace) with predictor.npz and its .sha256",
    )
    sha256: str = Field(
        ...,
        pattern="^[0-9a-f]{64}$",
        description="SHA-256 the artefact must have (hex); pods refuse any other",
    )


class SidecarSpec(CRDModel):
    """The slofleet sidecar next to vLLM."""

    image: str = Field(
        "ghcr.io/slofleet/slofleet:0.1.0", min_length=1, max_length=512, description="sidecar container image"
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="sidecar container resources"
    )
    predictor: PredictorRef | None = Field(
        None, description="length predictor to serve instead of the shipped one (absent: shipped)"
    )


class LoRAAdapter(CRDModel):
    """A LoRA adapter served next to the base model."""

    name: str = Field(..., min_length=1, max_length=256, description="name clients put in the 'model' field")
    source: str = Field(
        ..., min_length=1, max_length=2048, description="Hugging Face id or path of the adapter"
    )


class Capabilities(CRDModel):
    """What this deployment offers, for the router's filters."""

    max_context_tokens: int | None = Field(
        None, ge=1, description="longest prompt plus output (tokens; absent: engine.maxModelLen)"
    )
    gpu_class: str | None = Field(
        None, max_length=63, description="GPU class routers filter on (absent: gpu.type)"
    )
    lora_adapters: list[LoRAAdapter] = Field(
        default_factory=list, max_length=64, description="LoRA adapters served"
    )


class ModelDeploymentSpec(CRDModel):
    """Desired state of one served model."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "!has(self.engine) || self.engine.tensorParallelSize <= self.gpu.count",
                "engine.tensorParallelSize must not exceed gpu.count",
            )
        )
    )

    model: ModelSpec = Field(..., description="the model to serve")
    replicas: ReplicaRange = Field(default_factory=ReplicaRange, description="pod count bounds")
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec,
        description="how the operator scales between replicas.min and replicas.max (when they differ)",
    )
    gpu: GPUSpec = Field(..., description="GPUs per pod")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="vLLM engine settings")
    sidecar: SidecarSpec = Field(default_factory=SidecarSpec, description="slofleet sidecar settings")
    policy_ref: str = Field(
        "default", min_length=1, max_length=253, description="SLOPolicy (same namespace) it follows"
    )
    capabilities: Capabilities = Field(default_factory=Capabilities, description="declared capabilities")
    pod: PodSettings = Field(
        default_factory=PodSettings,
        description="engine pods' service account, pull secrets, priority class, affinity, topology spread",
    )
    profile: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description="performance profile the sidecar, router and autoscaler estimate with (a shipped name, "
        "e.g. h100-llama3-8b-tp1); absent: chosen from gpu.type, the model and "
        "engine.tensorParallelSize, and status.profile says which, or that none fits",
    )

    @model_validator(mode="after")
    def _tp_fits(self) -> ModelDeploymentSpec:
        if self.engine.tensor_parallel_size > self.gpu.count:
            raise ValueError(
                f"engine: tensorParallelSize ({self.engine.tensor_parallel_size}) must not exceed "
                f"gpu.count ({self.gpu.count})"
            )
        return self

    @model_validator(mode="after")
    def _profile_known(self) -> ModelDeploymentSpec:
        if self.profile is not None and self.profile not in list_profiles():
            shipped = ", ".join(list_profiles())
            raise ValueError(f"profile: unknown performance profile {self.profile!r}; shipped: {shipped}")
        return self

    def chosen_profile(self) -> tuple[str | None, str]:
        """The profile to use and why (named in the spec, else chosen from GPU, model and TP size)."""
        if self.profile is not None:
            return self.profile, "named in spec.profile"
        model = self.model.source.hf_id or self.model.source.uri or self.model.served_name
        return choose_profile(self.gpu.type, model, self.engine.tensor_parallel_size)

    def context_tokens(self) -> int | None:
        """The context length the router should assume (declared, else the engine's limit)."""
        return self.capabilities.max_context_tokens or self.engine.max_model_len

    def gpu_class(self) -> str:
        """The GPU class routers filter on (declared, else the GPU type)."""
        return self.capabilities.gpu_class or self.gpu.type


class ModelDeployment(CRDModel):
    """A ModelDeployment object as stored in Kubernetes (apiVersion slofleet.io/v1alpha1)."""

    api_version: Literal["slofleet.io/v1alpha1"] = Field(
        "slofleet.io/v1alpha1", description="API group and version"
    )
    kind: Literal["ModelDeployment"] = Field("ModelDeployment", description="object kind")
    metadata: ObjectMeta = Field(..., description="object metadata")
    spec: ModelDeploymentSpec = Field(..., description="desired state")
    status: ModelDeploymentStatus | None = Field(None, description="observed state, written by the operator")
