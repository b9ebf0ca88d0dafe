"""Shared by the operator's emulator tests: start an operator as a user, and the chart's operator rules."""

from __future__ import annotations

import helm_python as helm
import yaml
from kube.harness import Cluster, OperatorThread
from repo_paths import ROOT

from slo_operator.cli import operate
from slo_operator.settings import OperatorSettings


def start_operator(cluster: Cluster, token: str, **settings: object) -> OperatorThread:
    """An operator (standalone, cluster-wide) authenticating with ``token``; ``settings`` override."""
    config = str(cluster.kubeconfig(token, token))
    options = OperatorSettings(liveness_port=None, priority=1, request_timeout_s=10).model_copy(
        update=settings
    )
    return OperatorThread(
        lambda stop, ready: operate(options, stop_flag=stop, ready_flag=ready, kubeconfig=config)
    ).start()


def chart_operator_rules() -> list[dict]:
    """The chart's operator rules in cluster-wide mode, as the real Helm library renders them."""
    chart = helm.Chart.load(str(ROOT / "charts" / "slofleet"))
    rendered = chart.render({"operator": {"clusterWide": True}}, name="slofleet", namespace="slofleet")
    docs = [d for d in yaml.safe_load_all(rendered["slofleet/templates/operator-rbac.yaml"]) if d]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    return role["rules"]  # type: ignore[no-any-return]


def seed_namespace(cluster: Cluster, namespace: str, *, example_policy: bool = True) -> None:
    """What the operator's emulator tests start from: the CRDs, ``namespace``, the example's hfTokenSecret
    (labelled so the operator may mount it) and, by default, the example SLOPolicy."""
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    cluster.kubectl(
        "apply", "-f", "-", stdin=f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n"
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf-token", "namespace": namespace, "labels": {"slofleet.io/hf-token": "true"}},
        "stringData": {"token": "hf_x"},
    }
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(secret))
    if example_policy:
        cluster.kubectl("apply", "-f", str(ROOT / "examples" / "slopolicy-chat-agent.yaml"))
