"""The operator (kopf) against the emulated API server, driven by the real kubectl as a user would.

One emulated cluster per module; each test starts its own operator (a few hundred milliseconds) under
its own ServiceAccount-like user, so the audit log tells its requests apart from kubectl's.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from kube import rbac
from kube.harness import Cluster, OperatorThread
from kube.operating import seed_namespace
from repo_paths import ROOT

from slo_operator.cli import operate
from slo_operator.settings import OperatorSettings

EXAMPLES = ROOT / "examples"
OPERATOR_TOKEN = "operator-token"
OPERATOR_USER = "system:serviceaccount:slofleet:slofleet-operator"
LEADER, STANDBY = "leader-token", "standby-token"  # two replicas electing a leader by kopf peering
NAMESPACED = "namespaced-token"
NS = "llm"
TAG_KEY = "slofleet-tag-key"
CHILDREN = [
    ("deployment", "llama-8b"),
    ("service", "llama-8b"),
    ("service", "llama-8b-peers"),
    ("configmap", "llama-8b-policy"),
    ("pdb", "llama-8b"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    users = {OPERATOR_TOKEN: OPERATOR_USER, LEADER: "leader", STANDBY: "standby", NAMESPACED: "namespaced"}
    with Cluster(tmp_path_factory.mktemp("kube"), users=users) as c:
        seed_namespace(c, NS, example_policy=False)
        # the chart's tag-key Secret (a key of unknown age: the operator rotates it at once)
        tag_key = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": TAG_KEY, "namespace": NS},
            "data": {"keys": base64.b64encode(b"k" * 48).decode()},
        }
        c.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(tag_key))
        yield c


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[OperatorThread]:
    thread = start_operator(cluster)
    yield thread
    thread.stop()
    cluster.kubectl("delete", "md,slo", "--all", "-n", NS, "--wait=false")


def start_operator(cluster: Cluster, token: str = OPERATOR_TOKEN, **settings: object) -> OperatorThread:
    config = str(cluster.kubeconfig(token, token))
    # as the chart runs it: signed tags, and the tag key rotated (its Secret in NS, the "release" one)
    chart_like = {"tag_key_secret": TAG_KEY, "tag_key_namespace": NS, "tag_key_check_s": 0.5}
    options = OperatorSettings(liveness_port=None, priority=1, request_timeout_s=10).model_copy(
        update={**chart_like, **settings}
    )
    return OperatorThread(
        lambda stop, ready: operate(options, stop_flag=stop, ready_flag=ready, kubeconfig=config)
    ).start()


def apply_example(cluster: Cluster, name: str, edit: dict | None = None) -> dict:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    for key, value in (edit or {}).items():
        doc["spec"][key] = value
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc))
    return doc


def md_status(cluster: Cluster, name: str = "llama-8b") -> dict:
    obj = cluster.get("md", name, NS)
    return (obj or {}).get("status") or {}


def condition(status: dict, ctype: str) -> dict:
    return next((c for c in status.get("conditions", []) if c["type"] == ctype), {})


def wait_phase(cluster: Cluster, phase: str, name: str = "llama-8b", timeout_s: float = 15) -> dict:
    return cluster.wait_for(
        lambda: (s := md_status(cluster, name)).get("phase") == phase and s, timeout_s, phase
    )


def set_ready(cluster: Cluster, name: str, replicas: int) -> None:
    """What the Deployment controller and kubelet would do once the pods pass their readiness probes."""
    dep = cluster.get("deployment", name, NS)
    assert dep is not None
    status = {
        "observedGeneration": dep["metadata"]["generation"],
        "replicas": replicas,
        "readyReplicas": replicas,
        "updatedReplicas": replicas,
        "availableReplicas": replicas,
    }
    cluster.kubectl(
        "patch",
        "deployment",
        name,
        "-n",
        NS,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def test_examples_become_owned_children_and_the_deployment_becomes_ready(cluster: Cluster, operator) -> None:
    apply_example(cluster, "slopolicy-chat-agent.yaml")
    apply_example(cluster, "modeldeployment-llama-8b-h100.yaml")
    status = wait_phase(cluster, "Progressing")
    md = cluster.get("md", "llama-8b", NS)
    for kind, name in CHILDREN:
        child = cluster.get(kind, name, NS)
        assert child is not None, f"{kind}/{name} missing"
        (ref,) = child["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"]) == (
            "ModelDeployment",
            "llama-8b",
            md["metadata"]["uid"],
        )
    assert condition(status, "Progressing")["reason"] == "RollingOut"
    assert status["observedGeneration"] == md["metadata"]["generation"]
    # the sidecar's /metrics (it names tenants) on its own named port, which the pods' Service leaves out
    deployment, service = cluster.get("deployment", "llama-8b", NS), cluster.get("service", "llama-8b", NS)
    assert deployment is not None and service is not None
    pod = deployment["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "sidecar")
    metrics_port = next(p["containerPort"] for p in sidecar["ports"] if p["name"] == "metrics")
    assert f"--metrics-port={metrics_port}" in sidecar["args"]
    assert all(p["targetPort"] in ("http", "grpc") for p in service["spec"]["ports"])
    assert status["policyConfigMap"] == "llama-8b-policy"

    set_ready(cluster, "llama-8b", 1)
    status = wait_phase(cluster, "Ready")
    assert status["readyReplicas"] == 1 and condition(status, "Ready")["status"] == "True"
    table = cluster.kubectl("get", "md", "-n", NS)
    assert "Ready" in table.splitlines()[1] and "llama-3.1-8b-instruct" in table
    events = cluster.wait_for(
        lambda: (
            "Ready" in (out := cluster.kubectl("get", "events", "-n", NS, "-o", "json")) and json.loads(out)
        ),
        what="a Ready event",
    )
    assert any(e["reason"] == "Ready" and e["involvedObject"]["name"] == "llama-8b" for e in events["items"])


def test_policy_edit_rerenders_the_config_map_and_leaves_vllm_alone(cluster: Cluster, operator) -> None:
    apply_example(cluster, "slopolicy-chat-agent.yaml")
    apply_example(cluster, "modeldeployment-llama-8b-h100.yaml")
    cluster.wait_for(lambda: cluster.get("configmap", "llama-8b-policy", NS), what="the policy ConfigMap")
    generation = cluster.get("deployment", "llama-8b", NS)["metadata"]["generation"]

    patch = [{"op": "replace", "path": "/spec/tiers/0/ttftS", "value": 2.5}]
    cluster.kubectl("patch", "slo", "chat-agent", "-n", NS, "--type=json", "-p", json.dumps(patch))
    data = cluster.wait_for(
        lambda: (
            "ttftS: 2.5" in (d := cluster.get("configmap", "llama-8b-policy", NS)["data"])["policy.yaml"]
            and d
        ),
        what="the edited policy in the ConfigMap",
    )
    assert "deep-research" in data["policy.yaml"]
    assert cluster.get("deployment", "llama-8b", NS)["metadata"]["generation"] == generation


def test_missing_or_invalid_policy_degrades_with_a_reason_and_recovers(cluster: Cluster, operator) -> None:
    apply_example(cluster, "modeldeployment-llama-8b-h100.yaml")
    status = wait_phase(cluster, "Degraded")
    degraded = condition(status, "Degraded")
    assert degraded["reason"] == "PolicyNotFound" and '"chat-agent" not found' in degraded["message"]
    assert cluster.get("deployment", "llama-8b", NS) is None

    apply_example(cluster, "slopolicy-chat-agent.yaml")
    wait_phase(cluster, "Progressing")
    assert cluster.get("deployment", "llama-8b", NS) is not None

    # Valid for the schema, wrong for the registry: only the operator's semantic check can tell.
    apply_example(cluster, "slopolicy-chat-agent.yaml", {"scheduling": {"name": "no-such-policy"}})
    status = wait_phase(cluster, "Degraded")
    assert condition(status, "Degraded")["reason"] == "PolicyInvalid"
    assert "no-such-policy" in condition(status, "Degraded")["message"]
    policy = cluster.wait_for(
        lambda: (p := cluster.get("slo", "chat-agent", NS))["status"].get("phase") == "Invalid" and p
    )
    assert "no-such-policy" in condition(policy["status"], "Degraded")["message"]

    apply_example(cluster, "slopolicy-chat-agent.yaml")
    wait_phase(cluster, "Progressing")


def test_deleting_the_model_deployment_collects_its_children(cluster: Cluster, operator) -> None:
    apply_example(cluster, "slopolicy-chat-agent.yaml")
    apply_example(cluster, "modeldeployment-llama-8b-h100.yaml")
    wait_phase(cluster, "Progressing")
    cluster.kubectl("delete", "md", "llama-8b", "-n", NS)
    for kind, name in CHILDREN:
        assert cluster.get(kind, name, NS) is None, f"{kind}/{name} survived its owner"


def test_a_restarted_operator_converges_without_duplicates(cluster: Cluster, operator) -> None:
    apply_example(cluster, "slopolicy-chat-agent.yaml")
    apply_example(cluster, "modeldeployment-llama-8b-h100.yaml")
    wait_phase(cluster, "Progressing")
    operator.stop()
    # While it is down: a child is lost, the policy changes, and the pods become ready.
    cluster.kubectl("delete", "service", "llama-8b", "-n", NS)
    apply_example(cluster, "slopolicy-chat-agent.yaml", {"fairness": 0.3})
    set_ready(cluster, "llama-8b", 1)

    restarted = start_operator(cluster)
    try:
        wait_phase(cluster, "Ready")
        cluster.wait_for(lambda: cluster.get("service", "llama-8b", NS), what="the Service re-created")
        cluster.wait_for(
            lambda: "fairness: 0.3" in cluster.get("configmap", "llama-8b-policy", NS)["data"]["policy.yaml"],
            what="the policy edit made while the operator was down",
        )
        selector = "slofleet.io/model-deployment=llama-8b"
        for kind in ("deployments", "services", "configmaps", "poddisruptionbudgets"):
            names = cluster.kubectl("get", kind, "-n", NS, "-l", selector, "-o", "name").split()
            assert len(names) == (2 if kind == "services" else 1), f"{kind}: {names}"
    finally:
        restarted.stop()

    # Once converged, another restart re-applies everything and changes nothing.
    versions = {kind: cluster.get(kind, name, NS)["metadata"]["resourceVersion"] for kind, name in CHILDREN}
    status = md_status(cluster)
    applied = len(applies(cluster))
    again = start_operator(cluster)
    try:
        cluster.wait_for(
            lambda: len(applies(cluster)) >= applied + len(CHILDREN), what="the resumed operator re-applying"
        )
    finally:
        again.stop()
    assert {
        kind: cluster.get(kind, name, NS)["metadata"]["resourceVersion"] for kind, name in CHILDREN
    } == versions
    assert md_status(cluster) == status


def applies(cluster: Cluster) -> list:
    """The operator's server-side applies of children (PATCH on the four child kinds)."""
    kinds = {"deployments", "services", "configmaps", "poddisruptionbudgets"}
    records = cluster.call(lambda: list(cluster.emulator.audit))
    return [r for r in records if r.user == OPERATOR_USER and r.verb == "patch" and r.resource in kinds]


def test_the_slofleet_operator_command_runs_until_sigterm(cluster: Cluster, tmp_path: Path) -> None:
    """The real CLI in its own process: settings from the environment, /healthz, a clean stop on SIGTERM."""
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    port, metrics_port = ports
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig(OPERATOR_TOKEN, "operator-cli")),
        "SLOFLEET_OPERATOR_IMAGE": "registry.example/slofleet:test",
        "SLOFLEET_OPERATOR_DRAIN_S": "45",
        "SLOFLEET_OPERATOR_SCALE_PERIOD_S": "0.5",
    }
    log = (tmp_path / "operator.log").open("w")
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("slofleet")),
            "operator",
            "--standalone",
            f"--liveness-port={port}",
            f"--metrics-port={metrics_port}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        apply_example(cluster, "slopolicy-chat-agent.yaml")
        apply_example(cluster, "modeldeployment-llama-8b-h100.yaml")
        dep = cluster.wait_for(lambda: cluster.get("deployment", "llama-8b", NS), 60, "the engine Deployment")
        pod = dep["spec"]["template"]["spec"]
        assert pod["containers"][1]["image"] == "registry.example/slofleet:test"
        assert pod["terminationGracePeriodSeconds"] == 45 + 30
        health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert health.status == 200
        # the example scales between 1 and 4: the scaling loop reports its first decision as a metric
        gauge = (
            'slofleet_operator_autoscale_desired_replicas{model_deployment="llama-8b",namespace="llm"} 1.0'
        )
        cluster.wait_for(
            lambda: (
                gauge
                in urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
                .read()
                .decode()
            ),
            what="the scaling loop's metric",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        cluster.kubectl("delete", "md,slo", "--all", "-n", NS, "--wait=false")
    assert "standalone" in (tmp_path / "operator.log").read_text()


def chart_docs(template: str, values: dict | None = None) -> list[dict]:
    """One template of the chart as the real Helm library renders it."""
    chart = helm.Chart.load(str(ROOT / "charts" / "slofleet"))
    rendered = chart.render(values or {}, name="slofleet", namespace="slofleet")
    return [d for d in yaml.safe_load_all(rendered[f"slofleet/templates/{template}"]) if d]


def chart_operator_rules(values: dict | None = None) -> list[dict]:
    """The operator's rules in cluster-wide mode (the opt-in; these tests run it cluster-wide)."""
    values = {**(values or {}), "operator": {**(values or {}).get("operator", {}), "clusterWide": True}}
    (role,) = [d for d in chart_docs("operator-rbac.yaml", values) if d["kind"] == "ClusterRole"]
    return role["rules"]


def writes(cluster: Cluster, user: str) -> list:
    """The user's requests that change slofleet objects or their children (not reads, not peering)."""
    records = cluster.call(lambda: list(cluster.emulator.audit))
    return [r for r in records if r.user == user and r.verb in ("create", "patch") and r.group != "kopf.dev"]


def test_with_peering_one_replica_acts_and_the_standby_takes_over(cluster: Cluster) -> None:
    replicas = {"operator": {"replicas": 2}}
    (peering_crd,) = chart_docs("operator-peering.yaml", replicas)
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(peering_crd))
    peering = {"peering": "slofleet-operator"}
    leader = start_operator(cluster, LEADER, priority=20, **peering)
    standby = start_operator(cluster, STANDBY, priority=10, **peering)
    try:

        def peers() -> int:
            obj = cluster.get("clusterkopfpeering", "slofleet-operator", "")
            return len((obj or {}).get("status") or {})

        cluster.wait_for(lambda: peers() == 2, what="both replicas in the peering object")
        time.sleep(0.5)  # the standby pauses as it sees the higher-priority peer
        apply_example(cluster, "slopolicy-chat-agent.yaml")
        apply_example(cluster, "modeldeployment-llama-8b-h100.yaml")
        wait_phase(cluster, "Progressing")
        assert writes(cluster, "leader") and not writes(cluster, "standby")
        leader.stop()
        apply_example(cluster, "slopolicy-chat-agent.yaml", {"fairness": 0.4})
        cluster.wait_for(
            lambda: "fairness: 0.4" in cluster.get("configmap", "llama-8b-policy", NS)["data"]["policy.yaml"],
            what="the standby taking over",
        )
        assert writes(cluster, "standby")
    finally:
        leader.stop()
        standby.stop()
        cluster.kubectl("delete", "md,slo", "--all", "-n", NS, "--wait=false")
    records = [
        r for r in cluster.call(lambda: list(cluster.emulator.audit)) if r.user in ("leader", "standby")
    ]
    assert rbac.denied(records, chart_operator_rules(replicas)) == []


def test_watching_one_namespace_needs_only_roles_there(cluster: Cluster) -> None:
    values = {"operator": {"watchNamespaces": [NS]}}
    docs = chart_docs("operator-rbac.yaml", values)
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    roles = {d["metadata"]["namespace"]: d["rules"] for d in docs if d["kind"] == "Role"}
    # in the release namespace only the tag-key Secret it rotates (the copy in NS follows it)
    assert set(roles) == {NS, "slofleet"}
    assert roles.pop("slofleet") == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [TAG_KEY], "verbs": ["get", "update"]}
    ]
    assert {r for rule in cluster_role["rules"] for r in rule["resources"]} == {
        "customresourcedefinitions",
        "namespaces",
    }
    operator = start_operator(cluster, NAMESPACED, namespaces=(NS,))
    try:
        apply_example(cluster, "modeldeployment-llama-8b-h100.yaml")
        wait_phase(cluster, "Degraded")
        apply_example(cluster, "slopolicy-chat-agent.yaml")
        wait_phase(cluster, "Progressing")
        set_ready(cluster, "llama-8b", 1)
        wait_phase(cluster, "Ready")
    finally:
        operator.stop()
        cluster.kubectl("delete", "md,slo", "--all", "-n", NS, "--wait=false")
    records = [r for r in cluster.call(lambda: list(cluster.emulator.audit)) if r.user == "namespaced"]
    assert records and rbac.denied_in_scope(records, cluster_role["rules"], roles) == []


def test_zz_every_request_of_the_operator_is_allowed_by_the_chart_and_no_more(
    cluster: Cluster, operator
) -> None:
    """Runs last so it sees every earlier test's requests too; its own scenario covers every handler."""
    apply_example(cluster, "modeldeployment-llama-8b-h100.yaml")
    wait_phase(cluster, "Degraded")
    apply_example(cluster, "slopolicy-chat-agent.yaml")
    wait_phase(cluster, "Progressing")
    set_ready(cluster, "llama-8b", 1)
    wait_phase(cluster, "Ready")
    cluster.kubectl("delete", "md", "llama-8b", "-n", NS)

    records = [r for r in cluster.call(lambda: list(cluster.emulator.audit)) if r.user == OPERATOR_USER]
    rules = chart_operator_rules()
    assert not rbac.wildcards(rules)
    assert rbac.denied(records, rules) == [], "the chart's ClusterRole lacks permissions the operator uses"
    # A cluster with the OwnerReferencesPermission admission plugin (OpenShift) refuses every child
    # apply without this permission; the audit records it as needed for each blockOwnerDeletion.
    assert ("slofleet.io", "modeldeployments/finalizers", "update") in {
        need for record in records for need in rbac.needed(record)
    }
    # the scaling loop's writes need engine pods with live sidecars (test_operator_autoscale.py), the
    # ServiceAccount check a ModelDeployment that names one (test_operator_platform.py)
    scaling = [("", "pods", "patch"), ("apps", "deployments/scale", "patch"), ("", "serviceaccounts", "get")]
    assert [u for u in rbac.unused(records, rules) if u not in scaling] == [], (
        "the chart's ClusterRole grants permissions the operator never uses"
    )
