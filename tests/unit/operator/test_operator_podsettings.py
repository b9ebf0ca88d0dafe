"""A ModelDeployment's platform fields on the engine pods: each rendered, the result valid for Kubernetes
1.32 (kubernetes-validate, strict), and the profile chosen from GPU and model or refused by name."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from repo_paths import ROOT

from slo_core.perf.profiles import choose_profile
from slo_operator import render
from slo_operator.model import view
from slo_operator.policy import policy_config
from slo_operator.settings import OperatorSettings
from slo_operator.status import Blocker, observe, status

EXAMPLES = ROOT / "examples"
SPREAD = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "ScheduleAnyway",
    "labelSelector": {"matchLabels": {"slofleet.io/model-deployment": "llama-8b"}},
}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu-a", "gpu-b"]}]}
            ]
        }
    }
}


def md_body(edit: dict[str, Any] | None = None, engine: dict[str, Any] | None = None) -> dict[str, Any]:
    body = yaml.safe_load((EXAMPLES / "modeldeployment-llama-8b-h100.yaml").read_text())
    body["metadata"]["uid"] = "u"
    body["spec"].update(edit or {})
    body["spec"]["engine"].update(engine or {})
    return body


def deployment(body: dict[str, Any]) -> dict[str, Any]:
    policy = policy_config(yaml.safe_load((EXAMPLES / "slopolicy-chat-agent.yaml").read_text()))
    dep = next(
        c
        for c in render.children(view(body), policy, OperatorSettings(priority=1))
        if c["kind"] == "Deployment"
    )
    kubernetes_validate.validate(dep, "1.32.0", strict=True)
    return dep


def pod(body: dict[str, Any]) -> dict[str, Any]:
    return deployment(body)["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in spec["containers"] if c["name"] == name)


def test_defaults_add_nothing_and_mount_no_token() -> None:
    spec = pod(md_body())
    for key in ("serviceAccountName", "imagePullSecrets", "priorityClassName", "affinity"):
        assert key not in spec
    assert spec["automountServiceAccountToken"] is False
    cache = next(v for v in spec["volumes"] if v["name"] == "model-cache")
    assert cache == {"name": "model-cache", "emptyDir": {"sizeLimit": "200Gi"}}


def test_pod_settings_are_rendered() -> None:
    settings = {
        "serviceAccountName": "llm-serving",
        "automountServiceAccountToken": True,
        "imagePullSecrets": ["registry-cred", "mirror.cred"],
        "priorityClassName": "inference-high",
        "affinity": AFFINITY,
        "topologySpreadConstraints": [SPREAD],
    }
    spec = pod(md_body({"pod": settings}))
    assert spec["serviceAccountName"] == "llm-serving" and spec["automountServiceAccountToken"] is True
    assert spec["imagePullSecrets"] == [{"name": "registry-cred"}, {"name": "mirror.cred"}]
    assert spec["priorityClassName"] == "inference-high"
    assert spec["affinity"] == AFFINITY and spec["topologySpreadConstraints"] == [SPREAD]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}  # still there


def test_engine_env_is_appended_to_vllm_only() -> None:
    env = [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}, {"name": "NCCL_DEBUG", "value": "WARN"}]
    spec = pod(md_body(engine={"env": env}))
    vllm = container(spec, "vllm")["env"]
    assert vllm[-2:] == env and [e["name"] for e in vllm].count("PYTHONPATH") == 1
    assert not any(e["name"] == "NCCL_DEBUG" for e in container(spec, "sidecar")["env"])


@pytest.mark.parametrize("name", ["HF_TOKEN", "PYTHONPATH", "SLOFLEET_POLICY"])
def test_engine_env_may_not_override_what_the_operator_sets(name: str) -> None:
    with pytest.raises(ValueError, match="set by the operator"):
        view(md_body(engine={"env": [{"name": name, "value": "x"}]}))


@pytest.mark.parametrize(
    ("cache", "volume"),
    [
        ({"pvc": "hf-cache"}, {"persistentVolumeClaim": {"claimName": "hf-cache"}}),
        ({"hostPath": "/var/cache/hf"}, {"hostPath": {"path": "/var/cache/hf", "type": "DirectoryOrCreate"}}),
    ],
)
def test_model_cache_is_a_pvc_or_a_node_path_kept_across_restarts(cache: dict, volume: dict) -> None:
    spec = pod(md_body(engine={"modelCache": cache}))
    assert next(v for v in spec["volumes"] if v["name"] == "model-cache") == {"name": "model-cache", **volume}
    vllm = container(spec, "vllm")
    assert {"name": "HF_HOME", "value": "/model-cache"} in vllm["env"]
    assert {"name": "model-cache", "mountPath": "/model-cache"} in vllm["volumeMounts"]


def test_the_profile_is_chosen_from_gpu_and_model_and_passed_to_the_sidecar() -> None:
    args = container(pod(md_body()), "sidecar")["args"]
    assert "--profile=h100-llama3-8b-tp1" in args
    a100 = md_body({"gpu": {"count": 1, "type": "A100-80GB"}})
    assert "--profile=a100-llama3-8b-tp1" in container(pod(a100), "sidecar")["args"]
    named = md_body({"profile": "a100-llama3-8b-tp1"})  # named beats chosen
    assert "--profile=a100-llama3-8b-tp1" in container(pod(named), "sidecar")["args"]


def test_no_fitting_profile_is_said_not_guessed() -> None:
    body = md_body({"gpu": {"count": 1, "type": "L4"}})
    assert not any(a.startswith("--profile") for a in container(pod(body), "sidecar")["args"])
    md = view(body)
    st = status(md, observe(md, Blocker(True), None), OperatorSettings(priority=1), None, "t")
    assert st["profile"].startswith("none: no shipped profile 'l4-llama3-8b-tp1'")
    assert choose_profile("H100", "Qwen/Qwen2-7B", 1)[0] is None
    with pytest.raises(ValueError, match="unknown performance profile 'h200-llama3-8b-tp1'"):
        view(md_body({"profile": "h200-llama3-8b-tp1"}))
