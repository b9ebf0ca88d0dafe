"""The chart's InferencePool (off by default): rendered by the real Helm library, validated against the
inference extension's InferencePool v1 schema (a subset written from the published CRD, see
tests/data/inference-extension/README.md), with the picker Service on the router's ext_proc port and the
pool selecting exactly the labels the operator puts on engine pods."""

from __future__ import annotations

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from repo_paths import ROOT

from slo_operator import model, policy, render
from slo_operator.settings import OperatorSettings

SCHEMAS = ROOT / "tests" / "data" / "inference-extension"
K8S = "1.32.0"
ON = {"inferencePool": {"enabled": True, "parentRefs": [{"name": "inference-gateway"}]}}


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return helm.Chart.load(str(ROOT / "charts" / "slofleet"))


def render_chart(chart: helm.Chart, values: dict) -> list[dict]:
    out = chart.render(values, name="slofleet", namespace="llm")
    return [
        d for p, t in sorted(out.items()) if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d
    ]


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def schema(name: str) -> dict:
    import json

    return json.loads((SCHEMAS / name).read_text())


def test_off_by_default(chart: helm.Chart) -> None:
    docs = render_chart(chart, {})
    assert not of_kind(docs, "InferencePool") and not of_kind(docs, "HTTPRoute")
    router = next(d for d in of_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-router"))
    assert not any(
        a.startswith("--ext-proc-port") for a in router["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_pool_picker_service_and_route_validate_and_point_at_each_other(chart: helm.Chart) -> None:
    docs = render_chart(chart, ON)
    (pool,) = of_kind(docs, "InferencePool")
    jsonschema.validate(pool, schema("inferencepool-v1.schema.json"))
    (route,) = of_kind(docs, "HTTPRoute")
    jsonschema.validate(route, schema("httproute-backendref.schema.json"))
    assert route["spec"]["rules"][0]["backendRefs"][0] == {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": pool["metadata"]["name"],
    }
    epp = next(
        s
        for s in of_kind(docs, "Service")
        if s["metadata"]["name"] == pool["spec"]["endpointPickerRef"]["name"]
    )
    kubernetes_validate.validate(epp, K8S, strict=True)
    assert epp["spec"]["ports"][0]["port"] == pool["spec"]["endpointPickerRef"]["port"]["number"]
    router = next(d for d in of_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-router"))
    kubernetes_validate.validate(router, K8S, strict=True)
    pod = router["spec"]["template"]
    assert epp["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    container = pod["spec"]["containers"][0]
    port = next(p for p in container["ports"] if p["name"] == epp["spec"]["ports"][0]["targetPort"])
    assert f"--ext-proc-port={port['containerPort']}" in container["args"]


def test_pool_selects_the_engine_pods_the_operator_renders(chart: helm.Chart) -> None:
    body = yaml.safe_load((ROOT / "examples" / "modeldeployment-llama-8b-h100.yaml").read_text())
    body["metadata"].update(uid="00000000-0000-4000-8000-000000000001", generation=1)
    pol = policy.policy_config(yaml.safe_load((ROOT / "examples" / "slopolicy-chat-agent.yaml").read_text()))
    settings = OperatorSettings(priority=1)
    children = render.children(model.view(body), pol, settings)
    dep = next(c for c in children if c["kind"] == "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    ports = [
        p["containerPort"] for c in dep["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
    ]
    for values in (ON, {"inferencePool": {"enabled": True, "modelDeployment": body["metadata"]["name"]}}):
        (pool,) = of_kind(render_chart(chart, values), "InferencePool")
        assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        # engine mode: the gateway sends to vLLM's port, where the router's discovery points too
        notes = dep["spec"]["template"]["metadata"]["annotations"]
        assert pool["spec"]["targetPorts"][0]["number"] == settings.engine_port in ports
        assert notes["slofleet.io/http-port"] == str(settings.engine_port)
    other = {"inferencePool": {"enabled": True, "modelDeployment": "another-model"}}
    (pool,) = of_kind(render_chart(chart, other), "InferencePool")
    assert not pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_the_schema_subset_rejects_what_the_crd_rejects() -> None:
    bad = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "targetPorts": [{"number": 8000}, {"number": 8001}],
            "endpointPickerRef": {"name": "epp", "failureMode": "Maybe"},
        },
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema("inferencepool-v1.schema.json"))


def test_values_schema_rejects_a_bad_failure_mode(chart: helm.Chart) -> None:
    with pytest.raises(Exception, match="failureMode"):
        render_chart(chart, {"inferencePool": {"enabled": True, "failureMode": "Sometimes"}})
