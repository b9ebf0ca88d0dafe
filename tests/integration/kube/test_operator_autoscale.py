"""The operator's scaling loop against the emulated API server, driven by the real kubectl.

The emulator has no Deployment controller and no kubelet: the test plays both (it creates the engine pods
the Deployment asks for and marks them ready), and each pod's sidecar is a real ``SidecarMetrics``
registry served over loopback, so the operator scrapes the same exposition a sidecar serves.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest
import yaml
from kube import rbac
from kube.harness import Cluster, OperatorThread
from kube.operating import chart_operator_rules, seed_namespace, start_operator
from prometheus_client import generate_latest
from repo_paths import ROOT

from slo_core.wire.k8s import ENGINE_NAME, MD_LABEL, NAME_LABEL
from slo_operator.autoscaler import DELETION_COST
from slo_sidecar.metrics import SidecarMetrics

EXAMPLES = ROOT / "examples"
OPERATOR_TOKEN = "operator-token"
OPERATOR_USER = "system:serviceaccount:slofleet:slofleet-operator"
NS = "llm"
MD = "llama-8b"


class FakeSidecar:
    """A sidecar's /metrics (the real metrics class) on a loopback port."""

    def __init__(self) -> None:
        self.metrics = SidecarMetrics()
        registry = self.metrics.registry

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def load(self, outstanding: float, programs: int = 0) -> None:
        self.metrics.outstanding_tokens.set(outstanding)
        self.metrics.program_requests.set(programs)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("kube"), users={OPERATOR_TOKEN: OPERATOR_USER}) as c:
        seed_namespace(c, NS)
        yield c


@pytest.fixture
def sidecars() -> Iterator[dict[str, FakeSidecar]]:
    fakes: dict[str, FakeSidecar] = {}
    yield fakes
    for fake in fakes.values():
        fake.close()


def apply_md(cluster: Cluster, autoscaling: dict, replicas: dict | None = None) -> None:
    doc = yaml.safe_load((EXAMPLES / "modeldeployment-llama-8b-h100.yaml").read_text())
    doc["spec"]["replicas"] = replicas or {"min": 1, "max": 4}
    doc["spec"]["autoscaling"] = autoscaling
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc))


def add_pod(cluster: Cluster, name: str, fake: FakeSidecar) -> None:
    """What the ReplicaSet and the kubelet would do: an engine pod, ready, its sidecar on ``fake``."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {NAME_LABEL: ENGINE_NAME, MD_LABEL: MD}},
        "spec": {
            "containers": [
                {"name": "sidecar", "image": "x", "ports": [{"name": "http", "containerPort": fake.port}]}
            ]
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(pod))
    status = {
        "phase": "Running",
        "podIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    cluster.kubectl(
        "patch",
        "pod",
        name,
        "-n",
        NS,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def replicas(cluster: Cluster) -> int:
    dep = cluster.get("deployment", MD, NS)
    return int(dep["spec"]["replicas"]) if dep else -1


def autoscaling_status(cluster: Cluster) -> dict:
    return ((cluster.get("md", MD, NS) or {}).get("status") or {}).get("autoscaling") or {}


def events(cluster: Cluster, reason: str) -> list[dict]:
    """Events about the current ModelDeployment (not one an earlier test deleted)."""
    uid = (cluster.get("md", MD, NS) or {"metadata": {}})["metadata"].get("uid")
    items = json.loads(cluster.kubectl("get", "events", "-n", NS, "-o", "json"))["items"]
    return [e for e in items if e["reason"] == reason and e["involvedObject"].get("uid") == uid]


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[OperatorThread]:
    thread = start_operator(cluster, OPERATOR_TOKEN, scale_period_s=0.3)
    yield thread
    thread.stop()
    # the emulator stores each API version apart: the HPA by the version it was created with
    cluster.kubectl("delete", "md,pods,horizontalpodautoscalers.v2.autoscaling", "--all", "-n", NS)


SCALING = {"capacityTokensPerS": 1000, "utilization": 1.0, "drainS": 1, "downWindowS": 1.5}


def test_scales_up_on_admitted_work_then_down_removing_the_least_loaded_pod(
    cluster: Cluster, operator, sidecars: dict[str, FakeSidecar]
) -> None:
    apply_md(cluster, SCALING)
    cluster.wait_for(lambda: replicas(cluster) == 1, what="the Deployment at replicas.min")
    sidecars["e-0"] = FakeSidecar()
    add_pod(cluster, "e-0", sidecars["e-0"])
    # 3500 admitted tokens to drain in 1 s at 1000 tokens/s per replica: 4 replicas (max, step 4)
    sidecars["e-0"].load(3500)
    cluster.wait_for(lambda: replicas(cluster) == 4, what="a scale-up to 4")
    status = cluster.wait_for(lambda: (s := autoscaling_status(cluster)).get("desiredReplicas") == 4 and s)
    assert status["mode"] == "Goodput" and status["capacityTokensPerS"] == 1000
    assert status["lastScaleTime"] and "load 3500 tok/s" in status["reason"]
    up = cluster.wait_for(lambda: events(cluster, "ScaledUp"), what="a ScaledUp event")
    assert "1 → 4 replicas" in up[0]["message"]

    # a spec edit re-applies the Deployment: the new template, and the loop's count (not replicas.min)
    doc = yaml.safe_load((EXAMPLES / "modeldeployment-llama-8b-h100.yaml").read_text())
    doc["spec"]["replicas"], doc["spec"]["autoscaling"] = {"min": 1, "max": 4}, SCALING
    doc["spec"]["engine"]["extraArgs"] = ["--enable-prefix-caching", "--seed=7"]
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc))
    dep = cluster.wait_for(
        lambda: (
            "--seed=7"
            in (d := cluster.get("deployment", MD, NS))["spec"]["template"]["spec"]["containers"][0]["args"]
            and d
        ),
        what="the edited Deployment",
    )
    assert dep["spec"]["replicas"] == 4

    # the ReplicaSet's pods come up; the load falls; one pod holds calls of an in-flight program
    loads = {"e-0": (500, 0), "e-1": (10, 1), "e-2": (0, 0), "e-3": (300, 0)}
    for name in ("e-1", "e-2", "e-3"):
        sidecars[name] = FakeSidecar()
        sidecars[name].load(*loads[name])
        add_pod(cluster, name, sidecars[name])
    sidecars["e-0"].load(*loads["e-0"])
    # 810 tokens: one replica's worth, and the pod running a program is protected: one step down per
    # period once the down window holds no higher recommendation
    cluster.wait_for(lambda: replicas(cluster) == 1, timeout_s=15, what="a scale-down to 1")
    costs = {n: cluster.get("pod", n, NS)["metadata"]["annotations"][DELETION_COST] for n in loads}
    assert costs == {"e-0": "500", "e-1": str(1_000_000_000 + 10), "e-2": "0", "e-3": "300"}
    down = cluster.wait_for(lambda: len(d := events(cluster, "ScaledDown")) == 3 and d, what="3 ScaledDown")
    assert sorted(e["message"].split(":")[0] for e in down) == [
        "2 → 1 replicas",
        "3 → 2 replicas",
        "4 → 3 replicas",
    ]
    status = autoscaling_status(cluster)
    assert status["admittedTokens"] == 810 and status["desiredReplicas"] == 1


def test_steps_back_entirely_when_an_hpa_targets_the_deployment(
    cluster: Cluster, operator, sidecars: dict[str, FakeSidecar]
) -> None:
    apply_md(cluster, SCALING)
    cluster.wait_for(lambda: replicas(cluster) == 1, what="the Deployment at replicas.min")
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "mine", "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": MD},
            "minReplicas": 1,
            "maxReplicas": 2,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(hpa))
    sidecars["e-0"] = FakeSidecar()
    add_pod(cluster, "e-0", sidecars["e-0"])
    sidecars["e-0"].load(3500)
    status = cluster.wait_for(
        lambda: (s := autoscaling_status(cluster)).get("mode") == "External" and s, what="mode External"
    )
    assert "HorizontalPodAutoscaler" in status["reason"]
    # the HPA sets replicas; the operator neither scales nor re-applies a count over it
    cluster.kubectl("scale", "deployment", MD, "-n", NS, "--replicas=2")
    apply_md(cluster, {**SCALING, "drainS": 2})
    threading.Event().wait(1.5)  # five periods of the loop
    assert replicas(cluster) == 2
    assert not events(cluster, "ScaledUp")


def test_fixed_and_blocked_are_reported(cluster: Cluster, operator) -> None:
    apply_md(cluster, {}, replicas={"min": 2, "max": 2})
    cluster.wait_for(lambda: autoscaling_status(cluster).get("mode") == "Fixed", what="mode Fixed")
    assert replicas(cluster) == 2
    doc = {"capacityTokensPerS": None}
    apply_md(cluster, {k: v for k, v in doc.items() if v is not None})
    # the example's GPU and model have a shipped profile: the capacity comes from it
    status = cluster.wait_for(
        lambda: (s := autoscaling_status(cluster)).get("mode") == "Goodput" and s, what="mode Goodput"
    )
    assert status["desiredReplicas"] == 2
    md = yaml.safe_load((EXAMPLES / "modeldeployment-llama-8b-h100.yaml").read_text())
    md["spec"]["gpu"]["type"] = "L4"
    md["spec"]["replicas"] = {"min": 1, "max": 3}
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(md))
    status = cluster.wait_for(
        lambda: (s := autoscaling_status(cluster)).get("mode") == "Blocked" and s, what="mode Blocked"
    )
    assert "capacityTokensPerS" in status["reason"] and "l4-llama3-8b-tp1" in status["reason"]


def test_zz_every_request_of_the_scaling_loop_is_allowed_by_the_chart(cluster: Cluster) -> None:
    records = [r for r in cluster.call(lambda: list(cluster.emulator.audit)) if r.user == OPERATOR_USER]
    rules = chart_operator_rules()
    assert rbac.denied(records, rules) == []
    used = {need for record in records for need in rbac.needed(record)}
    assert {("", "pods", "patch"), ("apps", "deployments/scale", "patch")} <= used
