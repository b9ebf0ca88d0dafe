"""A ModelDeployment's platform settings on its engine pod: service account, pull secrets, priority class,
affinity, topology spread, the vLLM container's environment, the model cache and the performance profile.

Applied to the pod spec :func:`slo_operator.pod.pod_spec` renders (pure; a new dict, the input unchanged).
"""

from __future__ import annotations

import copy
from typing import Any

from slo_operator.model import ModelDeploymentView


def _container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in spec["containers"] if c["name"] == name)


def apply(pod_spec: dict[str, Any], md: ModelDeploymentView) -> dict[str, Any]:
    """``pod_spec`` with ``md``'s platform settings."""
    spec = copy.deepcopy(pod_spec)
    s = md.pod_settings
    if s.service_account_name:
        spec["serviceAccountName"] = s.service_account_name
    spec["automountServiceAccountToken"] = s.automount_service_account_token
    if s.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in s.image_pull_secrets]
    if s.priority_class_name:
        spec["priorityClassName"] = s.priority_class_name
    if s.affinity:
        spec["affinity"] = copy.deepcopy(s.affinity)
    if s.topology_spread_constraints:
        spec["topologySpreadConstraints"] = copy.deepcopy(s.topology_spread_constraints)
    vllm = _container(spec, "vllm")
    vllm["env"] = [*vllm["env"], *({"name": n, "value": v} for n, v in md.engine_env)]
    if md.model_cache is not None:
        kind, where = md.model_cache
        source: dict[str, Any] = (
            {"persistentVolumeClaim": {"claimName": where}}
            if kind == "pvc"
            else {"hostPath": {"path": where, "type": "DirectoryOrCreate"}}
        )
        spec["volumes"] = [
            {"name": "model-cache", **source} if v["name"] == "model-cache" else v for v in spec["volumes"]
        ]
    if md.profile:  # the sidecar reports it to routers, which estimate latencies with it
        sidecar = _container(spec, "sidecar")
        sidecar["args"] = [*sidecar["args"], f"--profile={md.profile}"]
    return spec
