"""The operator's pure rendering: golden files for the examples, and the properties users rely on.

Regenerate the golden files after an intended change with ``SLOFLEET_UPDATE_GOLDEN=1 pytest <this file>``
and review the diff.
"""

from __future__ import annotations

import ast
import copy
import json
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from repo_paths import ROOT

from slo_operator import model, policy, render
from slo_operator.settings import OperatorSettings

EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "tests" / "golden" / "operator"
SETTINGS = OperatorSettings(priority=1)
DEPLOYMENTS = ["modeldeployment-llama-8b-h100.yaml", "modeldeployment-llama-70b-h100x4.yaml"]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the rendered policy) as readable ``|`` blocks in the golden files."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def load(name: str) -> dict:
    body = yaml.safe_load((EXAMPLES / name).read_text())
    body["metadata"].update(uid="00000000-0000-4000-8000-000000000001", generation=1)
    return body


def rendered(md_file: str, policy_body: dict | None = None) -> list[dict]:
    md = model.view(load(md_file))
    config = policy.policy_config(policy_body or load("slopolicy-chat-agent.yaml"))
    return render.children(md, config, SETTINGS)


@pytest.mark.parametrize("md_file", DEPLOYMENTS)
def test_children_match_golden_files(md_file: str) -> None:
    text = yaml.dump_all(rendered(md_file), Dumper=_Dumper, sort_keys=False)
    golden = GOLDEN / md_file.replace("modeldeployment-", "children-")
    if os.environ.get("SLOFLEET_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"rendering changed; if intended, regenerate {golden.name}"


@pytest.mark.parametrize("md_file", DEPLOYMENTS)
def test_children_are_valid_kubernetes_objects_owned_by_the_model_deployment(md_file: str) -> None:
    objs = rendered(md_file)
    kinds = ["ConfigMap", "Service", "Service", "PodDisruptionBudget", "Deployment"]
    assert [o["kind"] for o in objs] == kinds
    for obj in objs:
        kubernetes_validate.validate(obj, "1.32.0", strict=True)
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == "00000000-0000-4000-8000-000000000001"
        assert ref["controller"] is True and ref["kind"] == "ModelDeployment"
        assert obj["metadata"]["namespace"] == "llm"


def test_pod_runs_vllm_with_the_plugin_copied_in_and_the_sidecar_in_front() -> None:
    dep = rendered("modeldeployment-llama-8b-h100.yaml")[-1]
    spec = dep["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    vllm, sidecar = spec["containers"]
    plugin_mount = next(m for m in vllm["volumeMounts"] if m["name"] == "plugin")
    env = {e["name"]: e for e in vllm["env"]}
    assert env["PYTHONPATH"]["value"] == plugin_mount["mountPath"]
    assert init["volumeMounts"][0]["name"] == "plugin" and init["image"] == sidecar["image"]
    assert f"--scheduler-cls={render.pod.SCHEDULER_CLS}" in vllm["args"]
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert env["SLOFLEET_POLICY"]["valueFrom"]["configMapKeyRef"]["name"] == "llama-8b-policy"
    assert vllm["resources"]["limits"] == {"memory": "64Gi", "nvidia.com/gpu": "1"}
    assert any(m["mountPath"] == "/dev/shm" for m in vllm["volumeMounts"])
    assert {p["name"] for p in sidecar["ports"]} == {"http", "grpc", "metrics", "calibration"}
    assert "--policy-file=/etc/slofleet/policy/policy.yaml" in sidecar["args"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["terminationGracePeriodSeconds"] > SETTINGS.drain_s
    for container in (init, sidecar):
        ctx = container["securityContext"]
        assert ctx["runAsNonRoot"] and ctx["readOnlyRootFilesystem"] and not ctx["allowPrivilegeEscalation"]


def test_scheduler_class_path_names_the_plugin_class() -> None:
    module, _, cls = render.pod.SCHEDULER_CLS.rpartition(".")
    source = ROOT / "vllm_plugin" / Path(*module.split(".")).with_suffix(".py")
    tree = ast.parse(source.read_text())
    assert cls in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}


def test_pvc_weights_are_mounted_read_only_and_passed_as_the_model_path() -> None:
    dep = rendered("modeldeployment-llama-70b-h100x4.yaml")[-1]
    spec = dep["spec"]["template"]["spec"]
    vllm = spec["containers"][0]
    assert "--model=/models/meta-llama/Llama-3.1-70B-Instruct" in vllm["args"]
    assert "--tensor-parallel-size=4" in vllm["args"]
    claim = next(v for v in spec["volumes"] if v["name"] == "model-weights")["persistentVolumeClaim"]
    assert claim == {"claimName": "model-weights", "readOnly": True}


def test_service_and_pods_carry_the_labels_the_router_selects() -> None:
    _cm, svc, peers, pdb, dep = rendered("modeldeployment-llama-8b-h100.yaml")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    for selector in (
        svc["spec"]["selector"],
        peers["spec"]["selector"],
        pdb["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pod_labels.items()
    assert pod_labels[render.MD_LABEL] == "llama-8b"
    notes = dep["spec"]["template"]["metadata"]["annotations"]
    assert notes["slofleet.io/served-model"] == "llama-3.1-8b-instruct"
    assert notes["slofleet.io/context-length"] == "32768"


def test_a_policy_edit_changes_the_config_map_but_not_the_pod_template() -> None:
    edited = load("slopolicy-chat-agent.yaml")
    edited["spec"]["tiers"][0]["ttftS"] = 2.5
    edited["spec"]["scheduling"]["params"]["frame_steps"] = 20
    before = rendered("modeldeployment-llama-8b-h100.yaml")
    after = rendered("modeldeployment-llama-8b-h100.yaml", edited)
    assert before[3] == after[3], "a policy edit must not restart vLLM"
    assert before[0]["data"] != after[0]["data"]
    assert "ttftS: 2.5" in after[0]["data"]["policy.yaml"]
    assert after[0]["data"]["engine-policy-params"] == '{"frame_steps":20,"p_initial":0.95}'


def test_the_engine_gets_the_policy_objective() -> None:
    edited = load("slopolicy-chat-agent.yaml")
    edited["spec"]["goodput"] = {"name": "request"}
    children = rendered("modeldeployment-llama-8b-h100.yaml", edited)
    objective = json.loads(children[0]["data"]["engine-objective"])
    assert objective["goodput"] == "request" and objective["fairness"] == 0.1
    (engines,) = [c for c in children if c["kind"] in ("StatefulSet", "Deployment")]
    containers = engines["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for c in containers for e in c.get("env", [])}
    assert env["SLOFLEET_OBJECTIVE"]["valueFrom"]["configMapKeyRef"]["key"] == "engine-objective"


def test_rendering_is_deterministic() -> None:
    body = load("modeldeployment-llama-8b-h100.yaml")
    first = rendered("modeldeployment-llama-8b-h100.yaml")
    assert model.view(copy.deepcopy(body)) == model.view(body)
    assert first == rendered("modeldeployment-llama-8b-h100.yaml")


def test_invalid_policy_is_refused_with_the_field_to_change() -> None:
    bad = load("slopolicy-chat-agent.yaml")
    del bad["spec"]["tiers"][0]["tbtS"]
    with pytest.raises(policy.PolicyInvalid, match="tbtS"):
        policy.policy_config(bad)
    unknown = load("slopolicy-chat-agent.yaml")
    unknown["spec"]["scheduling"]["name"] = "no-such-policy"
    with pytest.raises(policy.PolicyInvalid, match="no-such-policy"):
        policy.policy_config(unknown)


def test_invalid_model_deployment_spec_names_the_field() -> None:
    body = load("modeldeployment-llama-8b-h100.yaml")
    body["spec"]["engine"]["tensorParallelSize"] = 2
    with pytest.raises(ValueError, match="tensorParallelSize"):
        model.view(body)


def test_sidecar_arguments_are_accepted_by_the_sidecar_command() -> None:
    import argparse

    from slo_sidecar.cli import register

    parser = argparse.ArgumentParser()
    register(parser)
    sidecar = rendered("modeldeployment-llama-8b-h100.yaml")[-1]["spec"]["template"]["spec"]["containers"][1]
    assert sidecar["args"][0] == "sidecar"
    args = parser.parse_args(sidecar["args"][1:])
    assert args.mode == "engine" and args.grpc_port == SETTINGS.sidecar_grpc_port
    assert args.drain_timeout_s == SETTINGS.drain_s and args.model_name == "llama-3.1-8b-instruct"


def test_sidecar_metrics_are_on_their_own_named_port_that_the_service_leaves_out() -> None:
    import argparse

    from slo_sidecar.cli import register

    children = rendered("modeldeployment-llama-8b-h100.yaml")
    (deployment,) = [c for c in children if c["kind"] == "Deployment"]
    (service,) = [c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == "llama-8b"]
    sidecar = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "sidecar")
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    parser = argparse.ArgumentParser()
    register(parser)
    args = parser.parse_args(sidecar["args"][1:])
    # /metrics names tenants: served apart from the API port the router (and the Service) use
    assert args.metrics_port == ports["metrics"] == SETTINGS.sidecar_metrics_port
    assert args.metrics_port not in (args.port, args.grpc_port)
    exposed = {p["targetPort"] for p in service["spec"]["ports"]}
    assert "metrics" not in exposed and ports["metrics"] not in exposed
    assert sidecar["readinessProbe"]["httpGet"]["port"] == "http"


def test_images_default_to_the_operators_unless_the_spec_chooses_one() -> None:
    body = load("modeldeployment-llama-8b-h100.yaml")
    settings = OperatorSettings(
        priority=1, image="registry.example/slofleet:9", engine_image="registry.example/vllm:9"
    )
    # What the API server stores after CRD defaulting: the schema's default images written in.
    body["spec"]["sidecar"]["image"] = "ghcr.io/slofleet/slofleet:0.1.0"
    body["spec"]["engine"]["image"] = "vllm/vllm-openai:v0.32.0"
    vllm, sidecar = render.deployment(model.view(body), settings)["spec"]["template"]["spec"]["containers"]
    assert (vllm["image"], sidecar["image"]) == ("registry.example/vllm:9", "registry.example/slofleet:9")
    body["spec"]["sidecar"]["image"] = "mine/sidecar:1"
    body["spec"]["engine"]["image"] = "mine/vllm:1"
    vllm, sidecar = render.deployment(model.view(body), settings)["spec"]["template"]["spec"]["containers"]
    assert (vllm["image"], sidecar["image"]) == ("mine/vllm:1", "mine/sidecar:1")


def test_replicas_share_calibration_through_a_headless_service_on_a_port_of_its_own() -> None:
    import argparse

    from slo_sidecar.cli import register

    children = rendered("modeldeployment-llama-8b-h100.yaml")
    (peers,) = [c for c in children if c["metadata"]["name"] == "llama-8b-peers"]
    (service,) = [c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == "llama-8b"]
    deployment = children[-1]
    sidecar = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "sidecar")
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    parser = argparse.ArgumentParser()
    register(parser)
    args = parser.parse_args(sidecar["args"][1:])
    # a headless Service over exactly the ModelDeployment's pods: its DNS name lists every pod
    assert peers["spec"]["clusterIP"] == "None"
    assert peers["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [p["targetPort"] for p in peers["spec"]["ports"]] == ["calibration"]
    assert args.calibration_port == ports["calibration"] == SETTINGS.sidecar_calibration_port
    assert args.calibration_port not in (args.port, args.grpc_port, args.metrics_port)
    assert args.calibration_peers == f"dns+http://llama-8b-peers.llm.svc:{ports['calibration']}"
    # the router's Service does not carry it
    assert "calibration" not in {p["targetPort"] for p in service["spec"]["ports"]}
