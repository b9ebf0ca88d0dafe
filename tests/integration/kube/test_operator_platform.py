"""Platform fields of a ModelDeployment through the operator, against the emulated API server with the
real kubectl: only a ServiceAccount labelled for it runs engine pods, and the fields reach the
Deployment; every request the operator made is allowed by the chart's RBAC."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from kube import rbac
from kube.harness import Cluster
from kube.operating import chart_operator_rules, seed_namespace, start_operator
from repo_paths import ROOT

EXAMPLES = ROOT / "examples"
TOKEN, USER = "operator-token", "system:serviceaccount:slofleet:slofleet-operator"
NS = "llm"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("kube"), users={TOKEN: USER}) as c:
        seed_namespace(c, NS)
        yield c


def degraded_reason(cluster: Cluster) -> str | None:
    status = (cluster.get("md", "llama-8b", NS) or {}).get("status") or {}
    if status.get("phase") != "Degraded":
        return None
    return next(c["reason"] for c in status["conditions"] if c["type"] == "Degraded")


def test_a_service_account_must_be_labelled_and_the_fields_reach_the_pods(cluster: Cluster) -> None:
    operator = start_operator(cluster, TOKEN)
    try:
        md = yaml.safe_load((EXAMPLES / "modeldeployment-llama-8b-h100.yaml").read_text())
        md["spec"]["pod"] = {
            "serviceAccountName": "s3-reader",
            "imagePullSecrets": ["registry-cred"],
            "priorityClassName": "inference-high",
        }
        md["spec"]["engine"]["env"] = [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]
        md["spec"]["engine"]["modelCache"] = {"pvc": "hf-cache"}
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(md))
        cluster.wait_for(lambda: degraded_reason(cluster) == "ServiceAccountNotAllowed", what="refused SA")
        assert cluster.get("deployment", "llama-8b", NS) is None
        sa = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": "s3-reader",
                "namespace": NS,
                "labels": {"slofleet.io/engine-service-account": "true"},
            },
        }
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(sa))
        cluster.kubectl("annotate", "md", "llama-8b", "-n", NS, "retry=1")  # an edit re-converges
        dep = cluster.wait_for(lambda: cluster.get("deployment", "llama-8b", NS), what="the Deployment")
        pod = dep["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "s3-reader" and pod["automountServiceAccountToken"] is False
        assert pod["imagePullSecrets"] == [{"name": "registry-cred"}]
        assert pod["priorityClassName"] == "inference-high"
        vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
        assert {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"} in vllm["env"]
        cache = next(v for v in pod["volumes"] if v["name"] == "model-cache")
        assert cache["persistentVolumeClaim"] == {"claimName": "hf-cache"}
        status = cluster.get("md", "llama-8b", NS)["status"]
        assert status["profile"] == "h100-llama3-8b-tp1"
    finally:
        operator.stop()
        cluster.kubectl("delete", "md", "--all", "-n", NS)
    records = [r for r in cluster.call(lambda: list(cluster.emulator.audit)) if r.user == USER]
    assert rbac.denied(records, chart_operator_rules()) == []
    assert ("", "serviceaccounts", "get") in {need for r in records for need in rbac.needed(r)}
