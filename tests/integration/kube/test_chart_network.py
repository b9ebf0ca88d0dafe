"""NetworkPolicies: engine pods admit only the router (sidecar ports) and Prometheus (metrics ports);
vLLM's own port admits nothing from outside the pod. A small evaluator of NetworkPolicy ingress rules
(podSelector/namespaceSelector matchLabels, named ports) checks the rendered policies against the engine
pod the operator renders. Also: the plugin's degraded metric is served and scraped."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from repo_paths import ROOT

from slo_operator import render
from slo_operator.model import view
from slo_operator.policy import policy_config
from slo_operator.settings import OperatorSettings

NS = "llm"


def chart_docs(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = helm.Chart.load(str(ROOT / "charts" / "slofleet")).render(values, name="slofleet", namespace=NS)
    return [
        d for p, t in sorted(out.items()) if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d
    ]


def engine_pod() -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples" / "modeldeployment-llama-8b-h100.yaml").read_text())
    body["metadata"]["uid"] = "u"
    policy = policy_config(yaml.safe_load((ROOT / "examples" / "slopolicy-chat-agent.yaml").read_text()))
    dep = next(
        c
        for c in render.children(view(body), policy, OperatorSettings(priority=1))
        if c["kind"] == "Deployment"
    )
    return dep["spec"]["template"]  # type: ignore[no-any-return]


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def admitted(
    policies: list[dict[str, Any]],
    pod: dict[str, Any],
    pod_ns: str,
    src: dict[str, str],
    src_ns: str,
    port: int,
) -> bool:
    """Whether ingress from a pod (labels ``src`` in ``src_ns``) to ``port`` of ``pod`` is allowed."""
    labels = pod["metadata"]["labels"]
    named = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == pod_ns and _matches(p["spec"]["podSelector"], labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            ports = [named.get(p["port"], p["port"]) for p in rule.get("ports") or []]
            if ports and port not in ports:
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                ns_ok = "namespaceSelector" not in peer or _matches(
                    peer["namespaceSelector"], {"kubernetes.io/metadata.name": src_ns}
                )
                pod_ok = "podSelector" not in peer or _matches(peer["podSelector"], src)
                # a podSelector alone selects pods of the policy's own namespace
                same_ns = "namespaceSelector" in peer or src_ns == pod_ns
                if ("namespaceSelector" in peer or "podSelector" in peer) and ns_ok and pod_ok and same_ns:
                    return True
    return False


@pytest.mark.parametrize("values", [{}, {"operator": {"watchNamespaces": ["llm", "batch"]}}])
def test_only_the_router_reaches_engine_pods_and_only_prometheus_their_metrics(
    values: dict[str, Any],
) -> None:
    docs = chart_docs(values)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for p in policies:
        kubernetes_validate.validate(p, "1.32.0", strict=True)
    (router,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "slofleet-router"]
    router_labels = router["spec"]["template"]["metadata"]["labels"]
    pod = engine_pod()
    s = OperatorSettings(priority=1)
    http, grpc, engine, plugin, metrics = (
        s.sidecar_http_port,
        s.sidecar_grpc_port,
        s.engine_port,
        s.plugin_metrics_port,
        s.sidecar_metrics_port,
    )
    for ns in values.get("operator", {}).get("watchNamespaces", [NS]):
        assert admitted(policies, pod, ns, router_labels, NS, http)
        assert admitted(policies, pod, ns, router_labels, NS, grpc)
        # engine mode: the router sends requests to vLLM itself (signed SLO tags), no sidecar relays them
        assert admitted(policies, pod, ns, router_labels, NS, engine)
        stranger = {"app": "curious"}
        for port in (http, grpc, engine, plugin, metrics):
            assert not admitted(policies, pod, ns, stranger, ns, port), f"any pod reaches port {port}"
        assert not admitted(policies, pod, ns, router_labels, NS, metrics), "metrics name tenants"
        # the sidecars share their bound calibration with the engine pods of their namespace , that port only
        calibration, engine_labels = s.sidecar_calibration_port, pod["metadata"]["labels"]
        assert admitted(policies, pod, ns, engine_labels, ns, calibration)
        assert not admitted(policies, pod, ns, stranger, ns, calibration)
        assert not admitted(policies, pod, ns, router_labels, NS, calibration)
        assert not admitted(policies, pod, ns, engine_labels, "elsewhere", calibration)
        for port in (http, grpc, engine, metrics):
            assert not admitted(policies, pod, ns, engine_labels, ns, port), port
        prometheus = {"app.kubernetes.io/name": "prometheus"}
        assert admitted(policies, pod, ns, prometheus, "monitoring", plugin)
        assert admitted(policies, pod, ns, prometheus, "monitoring", metrics)
        assert not admitted(policies, pod, ns, prometheus, "monitoring", http), "metrics left the API port"
        assert not admitted(policies, pod, ns, prometheus, "monitoring", engine)
        assert not admitted(policies, pod, ns, {"app": "x"}, "monitoring", grpc)
    (op,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "slofleet-operator"]
    assert not admitted(policies, op["spec"]["template"], NS, router_labels, NS, 8080)
    operator_labels = op["spec"]["template"]["metadata"]["labels"]
    op_metrics = next(
        p["containerPort"]
        for p in op["spec"]["template"]["spec"]["containers"][0]["ports"]
        if p["name"] == "metrics"
    )
    prom = {"app.kubernetes.io/name": "prometheus"}
    assert admitted(policies, op["spec"]["template"], NS, prom, "monitoring", op_metrics)
    assert not admitted(policies, op["spec"]["template"], NS, router_labels, NS, op_metrics)
    # the operator reads the sidecar's metrics (scaling loop) and the plugin's (plugin health), nothing else
    for ns in values.get("operator", {}).get("watchNamespaces", [NS]):
        assert admitted(policies, pod, ns, operator_labels, NS, metrics)
        assert admitted(policies, pod, ns, operator_labels, NS, plugin)
        for port in (http, grpc, engine):
            assert not admitted(policies, pod, ns, operator_labels, NS, port), port


def test_the_plugin_says_when_it_degrades_on_a_port_the_chart_scrapes() -> None:
    pod = engine_pod()
    vllm = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    ports = {p["name"]: p["containerPort"] for p in vllm["ports"]}
    assert env["SLOFLEET_METRICS_PORT"] == str(ports["plugin-metrics"])
    docs = chart_docs({"metrics": {"serviceMonitor": {"enabled": True}}})
    scraped = {e["port"] for d in docs if d["kind"] == "PodMonitor" for e in d["spec"]["podMetricsEndpoints"]}
    assert "plugin-metrics" in scraped
    from slo_vllm_plugin.metrics import PluginMetrics

    text = (ROOT / "vllm_plugin" / "slo_vllm_plugin" / "metrics.py").read_text()
    assert "slofleet_plugin_degraded" in text and PluginMetrics


def test_router_and_sidecar_metrics_ports_are_scraped_by_prometheus_alone_and_never_public() -> None:
    docs = chart_docs({"metrics": {"serviceMonitor": {"enabled": True}}})
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    (router,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "slofleet-router"]
    pod = router["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--metrics-port={ports['metrics']}" in container["args"] and ports["metrics"] != ports["http"]
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    client = {"app": "client"}
    assert admitted(policies, pod, NS, client, "apps", ports["http"])
    assert not admitted(policies, pod, NS, client, "apps", ports["metrics"])
    assert admitted(policies, pod, NS, prometheus, "monitoring", ports["metrics"])
    for service in (d for d in docs if d["kind"] == "Service"):
        exposed = {p.get("targetPort") for p in service["spec"]["ports"]}
        assert not exposed & {"metrics", ports["metrics"]}, service["metadata"]["name"]
    # every port the PodMonitors scrape is a named port of the pod they select
    engine = engine_pod()
    engine_ports = {p["name"] for c in engine["spec"]["containers"] for p in c.get("ports", [])}
    for monitor in (d for d in docs if d["kind"] == "PodMonitor"):
        scraped = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
        is_router = monitor["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
        assert scraped <= (set(ports) if is_router else engine_ports), monitor["metadata"]["name"]
        assert "http" not in scraped
