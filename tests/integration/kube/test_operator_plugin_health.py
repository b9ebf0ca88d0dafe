"""A vLLM scheduler plugin that falls back to stock order is reported on its ModelDeployment.

The operator (kopf) against the emulated API server with the real kubectl; the engine pod is an object
whose ``plugin-metrics`` port is the plugin's own metrics server (``PluginMetrics``) on loopback. When
the plugin degrades the ModelDeployment gets ``PluginDegraded=True`` naming the pod and a Warning Event;
when it recovers, ``False`` and a Normal Event. The operator needs no permission beyond the chart's
(pods only read), and nothing in the pod writes to the API server.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import helm_python as helm
import pytest
import yaml
from kube import rbac
from kube.harness import Cluster, OperatorThread
from kube.operating import seed_namespace
from repo_paths import ROOT

from slo_operator.cli import operate
from slo_operator.settings import OperatorSettings
from slo_vllm_plugin.metrics import PluginMetrics

NS, MD = "llm", "llama-8b"
TOKEN, USER = "ph-token", "system:serviceaccount:slofleet:slofleet-operator"


def chart_operator_rules() -> list[dict]:
    """The operator's rules in the chart's cluster-wide mode (this operator runs cluster-wide)."""
    chart = helm.Chart.load(str(ROOT / "charts" / "slofleet"))
    rendered = chart.render({"operator": {"clusterWide": True}}, name="slofleet", namespace="slofleet")
    docs = yaml.safe_load_all(rendered["slofleet/templates/operator-rbac.yaml"])
    (role,) = [d for d in docs if d and d["kind"] == "ClusterRole"]
    return list(role["rules"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("kube"), users={TOKEN: USER}) as c:
        seed_namespace(c, NS, example_policy=False)
        yield c


def condition(cluster: Cluster) -> dict:
    status = (cluster.get("md", MD, NS) or {}).get("status") or {}
    return next((c for c in status.get("conditions", []) if c["type"] == "PluginDegraded"), {})


def events(cluster: Cluster, reason: str) -> list[dict]:
    items = json.loads(cluster.kubectl("get", "events", "-n", NS, "-o", "json"))["items"]
    return [e for e in items if e["reason"] == reason and e["involvedObject"]["name"] == MD]


def test_a_degraded_plugin_becomes_a_condition_and_an_event_and_its_recovery_too(cluster: Cluster) -> None:
    port = free_port()
    plugin = PluginMetrics(port)  # the plugin's own metrics server, as in the vLLM container
    plugin.degraded(True)
    settings = OperatorSettings(liveness_port=None, priority=1, request_timeout_s=10, plugin_check_s=0.3)
    config = str(cluster.kubeconfig(TOKEN, "ph"))
    operator = OperatorThread(
        lambda stop, ready: operate(settings, stop_flag=stop, ready_flag=ready, kubeconfig=config)
    ).start()
    try:
        cluster.kubectl("apply", "-f", str(ROOT / "examples" / "slopolicy-chat-agent.yaml"))
        cluster.kubectl("apply", "-f", str(ROOT / "examples" / "modeldeployment-llama-8b-h100.yaml"))
        dep = cluster.wait_for(lambda: cluster.get("deployment", MD, NS), what="the engine Deployment")
        ports = [p for c in dep["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
        assert "plugin-metrics" in {p["name"] for p in ports}, "the operator names the port it reads"
        # what the kubelet would make of the Deployment: one pod, its plugin port on loopback
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{MD}-0",
                "namespace": NS,
                "labels": dep["spec"]["selector"]["matchLabels"],
            },
            "spec": {
                "containers": [
                    {
                        "name": "vllm",
                        "image": "vllm",
                        "ports": [{"name": "plugin-metrics", "containerPort": port}],
                    }
                ]
            },
        }
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(pod))
        status = {
            "podIP": "127.0.0.1",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        cluster.kubectl(
            "patch", "pod", f"{MD}-0", "-n", NS, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip
        bad = cluster.wait_for(lambda: condition(cluster).get("status") == "True" and condition(cluster))
        assert bad["reason"] == "StockOrder" and f"{MD}-0" in bad["message"]
        cluster.wait_for(lambda: events(cluster, "PluginDegraded"), what="a Warning Event")
        assert events(cluster, "PluginDegraded")[0]["type"] == "Warning"
        plugin.degraded(False)
        good = cluster.wait_for(lambda: condition(cluster).get("status") == "False" and condition(cluster))
        assert good["reason"] == "AsExpected"
        cluster.wait_for(lambda: events(cluster, "PluginRecovered"), what="a Normal Event")
        # a converge (e.g. the policy changed) keeps the condition: it is part of every status write
        cluster.kubectl("annotate", "md", MD, "-n", NS, "touched=1")
        cluster.kubectl("apply", "-f", str(ROOT / "examples" / "slopolicy-chat-agent.yaml"))
        assert condition(cluster).get("status") == "False"
    finally:
        operator.stop()
    records = [r for r in cluster.call(lambda: list(cluster.emulator.audit)) if r.user == USER]
    assert records and rbac.denied(records, chart_operator_rules()) == []
    assert not [r for r in records if r.resource == "pods" and r.verb != "list"], "pods are only listed"
