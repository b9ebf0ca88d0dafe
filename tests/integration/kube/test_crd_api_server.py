"""The CRDs in crds/ as an API server applies them: kubectl apply of the examples and of a broken policy.

The emulated API server (tests/support/kube, kmock 0.8) runs the CRD's structural schema and its CEL
``x-kubernetes-validations``, so a user's ``kubectl apply`` gets the rule's message before any
operator sees the object.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from kube.harness import Cluster
from repo_paths import ROOT

NS = "llm"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("kube-crd")) as c:
        c.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        c.kubectl("apply", "-f", "-", stdin=f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n")
        yield c


def test_the_examples_apply_and_list_with_their_printer_columns(cluster: Cluster) -> None:
    for name in ("slopolicy-chat-agent.yaml", "modeldeployment-llama-8b-h100.yaml"):
        cluster.kubectl("apply", "-f", str(ROOT / "examples" / name))
    policies = cluster.kubectl("get", "slo", "-n", NS)
    assert "chat-agent" in policies and "TIERS" in policies.upper()
    assert "llama-8b" in cluster.kubectl("get", "md", "-n", NS)


def test_a_latency_tier_without_tbt_is_refused_with_the_rule_message(cluster: Cluster) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "slopolicy-chat-agent.yaml").read_text())
    doc["metadata"]["name"] = "broken"
    chat = next(t for t in doc["spec"]["tiers"] if t["name"] == "chat")
    del chat["tbtS"]
    out = cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc), check=False)
    assert "tbt" in out.lower(), out
    assert "broken" not in cluster.kubectl("get", "slo", "-n", NS, "-o", "name")
