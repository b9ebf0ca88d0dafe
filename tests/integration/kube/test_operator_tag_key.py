"""The operator rotates the tag-key Secret (emulated API server, the real kubectl, the chart's RBAC).

The release namespace holds the source Secret; a managed namespace holds a copy. A hand-made key (of
unknown age) is rotated at once, the copy follows; a key older than the period is rotated again and the
oldest key leaves both Secrets. Every request the operator made is allowed by the chart's namespaced
Roles, and the only Secret it may write is the tag key.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import helm_python as helm
import pytest
import yaml
from kube import rbac
from kube.harness import Cluster, OperatorThread
from repo_paths import ROOT

from slo_core.wire.keyring import MIN_PERIOD_S, KeyRing, parse_keyring, render_keyring
from slo_operator.cli import operate
from slo_operator.settings import OperatorSettings

RELEASE_NS, NS, NAME = "slofleet", "llm", "slofleet-tag-key"
TOKEN, USER = "op-token", "system:serviceaccount:slofleet:slofleet-operator"
K0, K1 = b"0" * 32, b"1" * 32


def secret(namespace: str, text: str) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": NAME, "namespace": namespace},
        "data": {"keys": base64.b64encode(text.encode()).decode()},
    }
    return yaml.safe_dump(doc)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("kube"), users={TOKEN: USER}) as c:
        c.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        for ns in (RELEASE_NS, NS):
            c.kubectl("apply", "-f", "-", stdin=f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n")
        yield c


def ring(cluster: Cluster, namespace: str) -> KeyRing:
    obj = cluster.get("secret", NAME, namespace)
    assert obj is not None
    return parse_keyring(base64.b64decode(obj["data"]["keys"]).decode())


def test_the_operator_rotates_the_key_keeps_copies_in_step_and_drops_the_oldest(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=secret(RELEASE_NS, K0.decode() + "\n"))
    cluster.kubectl("apply", "-f", "-", stdin=secret(NS, K0.decode() + "\n"))
    settings = OperatorSettings(
        liveness_port=None,
        priority=1,
        request_timeout_s=10,
        namespaces=(NS,),
        tag_key_secret=NAME,
        tag_key_namespace=RELEASE_NS,
        tag_key_rotation_s=MIN_PERIOD_S,
        tag_key_check_s=0.2,
    )
    config = str(cluster.kubeconfig(TOKEN, "op"))
    operator = OperatorThread(
        lambda stop, ready: operate(settings, stop_flag=stop, ready_flag=ready, kubeconfig=config)
    ).start()
    try:
        # a key of unknown age (hand-made, or the chart's first) is rotated at once; the copy follows
        first = cluster.wait_for(
            lambda: (r := ring(cluster, RELEASE_NS)).previous == K0 and r, what="rotation"
        )
        assert first.current != K0 and first.rotated_at_s == pytest.approx(time.time(), abs=30)
        cluster.wait_for(lambda: ring(cluster, NS) == first, what="the copy to follow")
        time.sleep(1.0)
        assert ring(cluster, RELEASE_NS) == first, "a fresh key is not rotated again"
        # the current key grows older than the period: rotated again, K0 (older than previous) is gone
        aged = KeyRing(K1, first.current, time.time() - MIN_PERIOD_S - 10)
        cluster.kubectl("apply", "-f", "-", stdin=secret(RELEASE_NS, render_keyring(aged)))
        second = cluster.wait_for(
            lambda: (r := ring(cluster, RELEASE_NS)).previous == K1 and r, what="the second rotation"
        )
        assert K0 not in second.verify_keys and first.current not in second.verify_keys
        cluster.wait_for(lambda: ring(cluster, NS) == second, what="the copy to follow again")
    finally:
        operator.stop()
    # the chart's namespaced Roles allow every request the operator made, and it wrote no other Secret
    chart = helm.Chart.load(str(ROOT / "charts" / "slofleet"))
    values = {"operator": {"watchNamespaces": [NS]}}
    rendered = chart.render(values, name="slofleet", namespace=RELEASE_NS)
    docs = [d for d in yaml.safe_load_all(rendered["slofleet/templates/operator-rbac.yaml"]) if d]
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    roles = {d["metadata"]["namespace"]: d["rules"] for d in docs if d["kind"] == "Role"}
    assert set(roles) == {NS, RELEASE_NS}
    records = [r for r in cluster.call(lambda: list(cluster.emulator.audit)) if r.user == USER]
    assert records and rbac.denied_in_scope(records, cluster_role["rules"], roles) == []
    updates = [r for r in records if r.resource == "secrets" and r.verb == "update"]
    assert updates and {r.name for r in updates} == {NAME}
    writable = [r for rules in roles.values() for r in rules if "secrets" in r["resources"]]
    assert all(r.get("resourceNames") == [NAME] for r in writable if "update" in r["verbs"])
