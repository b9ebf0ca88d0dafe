"""Pure rendering of what one ModelDeployment becomes: a Deployment, two Services (the pods' and the
sidecars' headless peers Service), a ConfigMap and a PDB.

Deterministic functions of plain data (no clock, no I/O), so re-applying them changes nothing and golden
files pin them. Every child carries the same labels, which the router selects on, and a controller owner
reference to the ModelDeployment, so deleting it collects them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from slo_core.wire import k8s
from slo_core.wire.k8s import API_GROUP, API_VERSION, ENGINE_NAME, MANAGED_BY, MD_LABEL, POLICY_LABEL
from slo_operator import pod
from slo_operator.model import ModelDeploymentView
from slo_operator.settings import OperatorSettings


@dataclass(frozen=True)
class PolicyConfig:
    """An SLOPolicy ready for the pods: the sidecar's config file and the engine plugin's policy."""

    name: str
    text: str
    engine_policy: str
    engine_params: dict[str, Any] = field(default_factory=dict)
    engine_objective: dict[str, Any] = field(default_factory=dict)


def selector_labels(md: ModelDeploymentView) -> dict[str, str]:
    """The labels that select the engine pods of one ModelDeployment (the router uses them too)."""
    return {k8s.NAME_LABEL: ENGINE_NAME, MD_LABEL: md.name}


def pod_labels(md: ModelDeploymentView) -> dict[str, str]:
    """Labels of the engine pods (no policy name: switching policies must not restart vLLM)."""
    return {
        **selector_labels(md),
        "app.kubernetes.io/instance": md.name,
        "app.kubernetes.io/component": "engine",
        "app.kubernetes.io/part-of": "slofleet",
        k8s.MANAGED_BY_LABEL: MANAGED_BY,
    }


def labels(md: ModelDeploymentView) -> dict[str, str]:
    """Labels of the children: the pods' labels plus the policy they follow."""
    return {**pod_labels(md), POLICY_LABEL: md.policy}


def owner_reference(md: ModelDeploymentView) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "ModelDeployment",
        "name": md.name,
        "uid": md.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(md: ModelDeploymentView, name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": md.namespace,
        "labels": labels(md),
        "ownerReferences": [owner_reference(md)],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def config_map_name(md: ModelDeploymentView) -> str:
    return f"{md.name}-policy"


def pod_annotations(md: ModelDeploymentView, settings: OperatorSettings) -> dict[str, str]:
    """What the router reads about a pod besides its labels: ports, served model and capabilities.

    Engine mode: the router sends requests to vLLM's port (the plugin schedules them by the router's
    signed SLO tags) and follows the sidecar's gRPC state stream; no sidecar relays tokens."""
    notes = {
        k8s.SERVED_MODEL_ANNOTATION: md.served_name,
        k8s.HTTP_PORT_ANNOTATION: str(settings.engine_port),
        k8s.GRPC_PORT_ANNOTATION: str(settings.sidecar_grpc_port),
        k8s.MODE_ANNOTATION: "engine",
    }
    context = md.context_length or md.max_model_len
    if context:
        notes[k8s.CONTEXT_LENGTH_ANNOTATION] = str(context)
    if md.gpu_class or md.gpu_type:
        notes[k8s.GPU_CLASS_ANNOTATION] = str(md.gpu_class or md.gpu_type)
    if md.lora_adapters:
        notes[k8s.LORA_ADAPTERS_ANNOTATION] = ",".join(name for name, _ in md.lora_adapters)
    return notes


def deployment(
    md: ModelDeploymentView,
    settings: OperatorSettings,
    *,
    autoscaled: bool = False,
    replicas: int | None = None,
) -> dict[str, Any]:
    """The engine Deployment. Rolls one pod at a time without surging, since GPUs are the scarce resource.

    ``autoscaled``: an autoscaler (an HPA, KEDA's included) targets the Deployment, so ``replicas`` is
    left out of what the operator applies and the autoscaler's value stands. ``replicas``: the count the
    operator's own scaling loop chose (absent: ``replicas.min``).
    """
    count = {} if autoscaled else {"replicas": md.replicas if replicas is None else replicas}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(md, md.name),
        "spec": {
            **count,
            "selector": {"matchLabels": selector_labels(md)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "progressDeadlineSeconds": 1800,
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {"labels": pod_labels(md), "annotations": pod_annotations(md, settings)},
                "spec": pod.pod_spec(md, settings, config_map_name(md)),
            },
        },
    }


def service(md: ModelDeploymentView, settings: OperatorSettings) -> dict[str, Any]:
    """The pods' Service: the sidecar's HTTP front door and its gRPC state stream."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(md, md.name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(md),
            "ports": [
                {"name": "http", "port": settings.sidecar_http_port, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "grpc",
                    "port": settings.sidecar_grpc_port,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
            ],
        },
    }


def peers_service(md: ModelDeploymentView, settings: OperatorSettings) -> dict[str, Any]:
    """A headless Service over the same pods, only for the sidecars' calibration exchange: its DNS name
    resolves to every ready pod's address (``--calibration-peers=dns+http://…``), so the replicas of a
    ModelDeployment share one calibration without any pod reading the API server."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(md, pod.peers_service_name(md)),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(md),
            "ports": [
                {
                    "name": "calibration",
                    "port": settings.sidecar_calibration_port,
                    "targetPort": "calibration",
                    "protocol": "TCP",
                }
            ],
        },
    }


def _compact_json(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def config_map(md: ModelDeploymentView, policy: PolicyConfig) -> dict[str, Any]:
    """The rendered policy: the sidecar's hot-reloaded file and the engine plugin's policy, its parameters
    and the objective it maximizes."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(md, config_map_name(md)),
        "data": {
            pod.POLICY_FILE: policy.text,
            pod.ENGINE_POLICY_KEY: policy.engine_policy,
            pod.ENGINE_PARAMS_KEY: _compact_json(policy.engine_params),
            pod.ENGINE_OBJECTIVE_KEY: _compact_json(policy.engine_objective),
        },
    }


def pod_disruption_budget(md: ModelDeploymentView) -> dict[str, Any]:
    """At most one engine pod voluntarily evicted at a time (a single replica can still be drained)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(md, md.name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(md)}},
    }


def children(
    md: ModelDeploymentView,
    policy: PolicyConfig,
    settings: OperatorSettings,
    *,
    autoscaled: bool = False,
    replicas: int | None = None,
) -> list[dict[str, Any]]:
    """Every object the ModelDeployment owns, in apply order (the ConfigMap before the pods that mount it)."""
    return [
        config_map(md, policy),
        service(md, settings),
        peers_service(md, settings),
        pod_disruption_budget(md),
        deployment(md, settings, autoscaled=autoscaled, replicas=replicas),
    ]


def owned_by(obj: dict[str, Any], md: ModelDeploymentView) -> bool:
    """Whether ``obj`` names this ModelDeployment (by uid) as its controller."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(
        r.get("kind") == "ModelDeployment" and r.get("controller") and r.get("uid") == md.uid for r in refs
    )


def targets(hpa: dict[str, Any], md: ModelDeploymentView) -> bool:
    """Whether a HorizontalPodAutoscaler scales this ModelDeployment's engine Deployment."""
    ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
    return ref.get("kind") == "Deployment" and ref.get("name") == md.name
