"""The Helm chart, rendered, linted and installed with the real Helm library (helm-python-sdk, offline).

Every rendered manifest is validated: built-in kinds with kubernetes-validate (strict), custom resources
with their CRD schemas (OpenAPI and CEL) and slofleet's own semantic checks. The install runs against
the emulated API server, and then the operator runs with the settings the chart gives it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from kube import rbac, schemas
from kube.harness import Cluster, OperatorThread
from repo_paths import ROOT

from slo_core.crd.policy import SLOPolicy
from slo_core.crd.semantics import policy_spec_problems
from slo_operator import cli
from slo_operator.cli import operate

CHART = ROOT / "charts" / "slofleet"
NS = "llm"
K8S = "1.32.0"
MONITORING = "monitoring.coreos.com/v1"  # prometheus-operator kinds: no schema offline, checked by shape
VALUE_SETS = {
    "defaults": {},
    "ha-namespaced-monitored": {
        "operator": {"replicas": 2, "watchNamespaces": ["llm", "batch"]},
        "router": {"namespace": "llm", "replicas": 3},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        "imagePullSecrets": [{"name": "registry"}],
    },
    "named-policy": {
        "router": {"policyName": "chat-agent", "apiKeySecrets": ["product-keys", "ops-keys"]},
        "defaultPolicy": {"enabled": False},
    },
    "operator-only": {
        "router": {"enabled": False},
        "defaultPolicy": {"enabled": False},
        "metrics": {"grafanaDashboard": {"enabled": False}},
    },
}


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return helm.Chart.load(str(CHART))


def render(chart: helm.Chart, values: dict, namespace: str = NS) -> list[dict]:
    out = chart.render(values, name="slofleet", namespace=namespace)
    return [
        doc
        for path, text in sorted(out.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def crd_schema(kind: str) -> dict:
    for path in (ROOT / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    raise AssertionError(f"no CRD for {kind}")


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_chart_lints_clean_in_strict_mode(values: dict) -> None:
    report = helm.lint(str(CHART), values, strict=True, namespace=NS, kube_version="v1.32.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == []


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"podSecurityContext": {"runAsNonRoot": False}}, "runAsNonRoot"),
        (
            {"securityContext": {"allowPrivilegeEscalation": True, "readOnlyRootFilesystem": True}},
            "allowPrivilegeEscalation",
        ),
        (
            {"securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": False}},
            "readOnlyRootFilesystem",
        ),
        ({"operator": {"replicas": 0}}, "replicas"),
        ({"operator": {"watchNamespaces": ["Not_A_Namespace"]}}, "watchNamespaces"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"router": {"servce": {"port": 80}}}, "servce"),
        ({"defaultPolicy": {"spec": {"tiers": []}}}, "defaultPolicy"),
    ],
)
def test_values_schema_refuses_unsafe_or_misspelled_values(
    chart: helm.Chart, values: dict, complaint: str
) -> None:
    chart.validate_schema({})
    with pytest.raises(helm.HelmValuesError, match=complaint):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError):
        chart.render(values, name="slofleet", namespace=NS)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_manifest_is_valid(chart: helm.Chart, values: dict) -> None:
    docs = render(chart, values)
    assert docs
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "SLOPolicy":
            schema = crd_schema("SLOPolicy")
            assert schemas.schema_violations(doc, schema) == [], where
            assert schemas.cel_violations({k: v for k, v in doc.items() if k != "metadata"}, schema) == [], (
                where
            )
            assert policy_spec_problems(SLOPolicy.model_validate(doc).spec) == [], where
        elif doc["apiVersion"] == MONITORING:
            assert doc["spec"]["selector"]["matchLabels"], where
        else:
            kubernetes_validate.validate(doc, K8S, strict=True)


def test_chart_ships_the_generated_crds(chart: helm.Chart) -> None:
    shipped = {Path(c["name"]).name: c["data"] for c in chart.crds}
    generated = {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}
    assert shipped == generated
    for text in shipped.values():
        kubernetes_validate.validate(yaml.safe_load(text), K8S, strict=True)


def test_operator_and_router_pods_are_locked_down(chart: helm.Chart) -> None:
    deployments = [d for d in render(chart, {}) if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"slofleet-operator", "slofleet-router"}
    for dep in deployments:
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["serviceAccountName"]
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"]["drop"] == ["ALL"] and not ctx.get("privileged")
            assert container["resources"]["limits"]["memory"] and container["livenessProbe"]


def test_rbac_is_least_privilege(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["ha-namespaced-monitored"])
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    assert {r["kind"] for r in roles} == {"Role", "ClusterRole"}
    for role in roles:
        assert rbac.wildcards(role["rules"]) == [], role["metadata"]["name"]
    (router,) = [r for r in roles if r["kind"] == "Role" and r["metadata"]["name"].endswith("-router")]
    assert router["metadata"]["namespace"] == "llm"
    verbs = {v for rule in router["rules"] for v in rule["verbs"]}
    assert verbs <= {"get", "list", "watch"}, "the router only reads"
    (secrets,) = [rule for rule in router["rules"] if "secrets" in rule["resources"]]
    assert secrets["resourceNames"] == ["slofleet-api-keys"], "the router reads only its tenants' key Secrets"
    # Watching two namespaces: the operator's namespaced permissions are Roles there, peering included.
    operator = {
        r["metadata"].get("namespace"): r for r in roles if r["metadata"]["name"].endswith("-operator")
    }
    assert set(operator) == {None, "llm", "batch"}
    assert {res for rule in operator[None]["rules"] for res in rule["resources"]} == {
        "customresourcedefinitions",
        "namespaces",
    }
    for ns in ("llm", "batch"):
        assert any("kopfpeerings" in rule["resources"] for rule in operator[ns]["rules"]), (
            "peering with replicas > 1"
        )


def test_a_named_policy_is_followed_with_only_the_access_it_needs(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["named-policy"])
    (router,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "slofleet-router"]
    pod = router["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--policy-name=chat-agent" in args and not [a for a in args if a.startswith("--policy-file")]
    # no policy ConfigMap to mount (the tag key signs engine SLO tags and authenticates gRPC calls)
    assert [v["name"] for v in pod["volumes"]] == ["tmp", "tag-key"], "no policy ConfigMap to mount"
    assert "--tag-key-file=/etc/slofleet/tag-key/keys" in args
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-router")]
    rules = {rule["resources"][0]: rule for rule in role["rules"]}
    assert rules["slopolicies"]["resourceNames"] == ["chat-agent"] and rules["slopolicies"]["verbs"] == [
        "get"
    ]
    assert rules["secrets"]["resourceNames"] == ["product-keys", "ops-keys"]
    # the chart's own policy is not followed: no reason to read it
    assert "slopolicies" not in {r["resources"][0] for r in render_role(chart, {})}


def render_role(chart: helm.Chart, values: dict) -> list[dict]:
    (role,) = [
        d for d in render(chart, values) if d["kind"] == "Role" and d["metadata"]["name"].endswith("-router")
    ]
    rules: list[dict] = role["rules"]
    return rules


def _service_metrics() -> dict[str, str]:
    """Every metric family the router and sidecar export, by name, with its type."""
    from slo_router.metrics import RouterMetrics
    from slo_sidecar.metrics import SidecarMetrics

    families = [*RouterMetrics().registry.collect(), *SidecarMetrics().registry.collect()]
    return {f.name: f.type for f in families}


def test_dashboard_shows_per_tier_goodput_and_attainment_from_exported_metrics(chart: helm.Chart) -> None:
    (cm,) = [
        d
        for d in render(chart, {})
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("dashboard")
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["slofleet.json"])
    titles = [p["title"].lower() for p in dashboard["panels"]]
    assert any("goodput per tier" in t for t in titles) and any("attainment per tier" in t for t in titles)
    exported = _service_metrics()
    suffix = {"_total": "counter", "_bucket": "histogram", "_sum": "histogram", "_count": "histogram"}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"slofleet_[a-z_]+", target["expr"]):
                kind = next((k for s, k in suffix.items() if name.endswith(s)), "gauge")
                base = (
                    name.removesuffix("_total")
                    if kind == "counter"
                    else re.sub(r"_(bucket|sum|count)$", "", name)
                )
                assert exported.get(base) == kind, f"panel {panel['title']!r} queries {name}, not exported"


def test_notes_tell_the_user_what_to_do_next(chart: helm.Chart) -> None:
    notes = chart.render({}, name="slofleet", namespace="serving")["slofleet/templates/NOTES.txt"]
    assert "kubectl -n serving wait md/" in notes and "create secret generic slofleet-api-keys" in notes
    assert "spec.policyRef: default" in notes, "the router's policy is the one ModelDeployments must follow"
    named = chart.render(VALUE_SETS["named-policy"], name="slofleet", namespace="serving")
    notes = named["slofleet/templates/NOTES.txt"]
    for example in re.findall(r"-f (examples/\S+)", notes):
        assert (ROOT / example).exists(), example
    assert "change it to serving" in notes and "spec.policyRef: chat-agent" in notes
    assert "create secret generic product-keys" in notes and "x-slo-tier: interactive" not in notes


OPERATOR_TOKEN, ROUTER_TOKEN = "chart-operator-token", "chart-router-token"
OPERATOR_SA = "system:serviceaccount:llm:slofleet-operator"
ROUTER_SA = "system:serviceaccount:llm:slofleet-router"


def operator_settings_from_chart(docs: list[dict]) -> tuple[cli.OperatorSettings, dict[str, str]]:
    """Parse the operator container's arguments with the real CLI and take its environment, as in the pod."""
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "slofleet-operator"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[1] == "operator" and args[0].startswith("--log-level=")
    parser = argparse.ArgumentParser()
    cli.register(parser)
    parsed = parser.parse_args(args[2:])
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    for key in env:  # a misspelled variable would silently be ignored by the operator
        assert key.removeprefix(cli.ENV_PREFIX).lower() in cli.OperatorSettings.model_fields, key
    settings = cli.OperatorSettings.from_env(env, namespaces=tuple(parsed.namespaces or ()) or None)
    return settings.model_copy(update={"liveness_port": None, "peering": parsed.peering}), env


@pytest.fixture(scope="module")
def installed(chart: helm.Chart, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The chart installed by the Helm library into an emulated cluster (namespace llm)."""
    users = {OPERATOR_TOKEN: OPERATOR_SA, ROUTER_TOKEN: ROUTER_SA}
    with Cluster(tmp_path_factory.mktemp("helm"), users=users) as cluster:
        cluster.kubectl(
            "apply", "-f", "-", stdin=f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
        )
        config = helm.Config(kubeconfig_path=str(cluster.kubeconfig()), namespace=NS, storage_driver="memory")
        config.install(chart, "slofleet", {}, namespace=NS)
        yield cluster


def test_install_creates_the_fleet_front_and_the_default_policy(installed: Cluster) -> None:
    names = installed.kubectl("get", "deploy,svc,sa,slo,crd", "-n", NS, "-o", "name").split()
    for name in (
        "deployment.apps/slofleet-operator",
        "deployment.apps/slofleet-router",
        "service/slofleet-router",
        "serviceaccount/slofleet-operator",
        "slopolicy.slofleet.io/default",
        "customresourcedefinition.apiextensions.k8s.io/modeldeployments.slofleet.io",
    ):
        assert name in names


def test_the_operator_runs_with_the_charts_settings_and_serves_the_default_policy(
    chart: helm.Chart, installed: Cluster
) -> None:
    settings, env = operator_settings_from_chart(render(chart, {}))
    assert settings.peering is None and settings.image == "ghcr.io/slofleet/slofleet:0.1.0"
    kubeconfig = str(installed.kubeconfig(OPERATOR_TOKEN, "chart-operator"))
    thread = OperatorThread(lambda stop, ready: operate(settings, stop, ready, kubeconfig=kubeconfig))
    md = {
        "apiVersion": "slofleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "qwen", "namespace": NS},
        "spec": {
            "model": {"servedName": "qwen-0.5b", "source": {"hfId": "Qwen/Qwen2.5-0.5B-Instruct"}},
            "gpu": {"type": "L4"},
        },
    }
    with thread.running():
        installed.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(md))
        dep = installed.wait_for(
            lambda: installed.get("deployment", "qwen", NS), what="the engine Deployment"
        )
        policy = installed.wait_for(lambda: (installed.get("slo", "default", NS) or {}).get("status"))
    assert policy["phase"] == "Ready"
    pod = dep["spec"]["template"]["spec"]
    assert pod["containers"][1]["image"] == env["SLOFLEET_OPERATOR_IMAGE"]
    assert pod["containers"][0]["image"] == env["SLOFLEET_OPERATOR_ENGINE_IMAGE"]
    assert "interactive" in installed.get("configmap", "qwen-policy", NS)["data"]["policy.yaml"]

    # By default the operator manages the release namespace only: a Role there, a read-only ClusterRole.
    cluster_role = json.loads(installed.kubectl("get", "clusterrole", "slofleet-operator", "-o", "json"))
    role = json.loads(installed.kubectl("get", "role", "slofleet-operator", "-n", NS, "-o", "json"))
    records = [r for r in installed.call(lambda: list(installed.emulator.audit)) if r.user == OPERATOR_SA]
    assert records and rbac.denied_in_scope(records, cluster_role["rules"], {NS: role["rules"]}) == []
    assert {res for rule in cluster_role["rules"] for res in rule["resources"]} == {
        "customresourcedefinitions",
        "namespaces",
    }


def test_the_router_reads_the_charts_policy_within_its_read_only_role(
    chart: helm.Chart, installed: Cluster
) -> None:
    """The router's discovery, configured as the chart configures it, needs nothing its Role lacks and
    serves every ModelDeployment of the namespace."""
    import kubernetes

    from slo_core.crd.loads import parse_policy
    from slo_router.app import build_state
    from slo_router.config import from_policy
    from slo_router.kube import KubeDiscovery
    from slo_router.tenants import KeyStore

    docs = render(chart, {})
    (router,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "slofleet-router"]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    namespace = next(a.split("=", 1)[1] for a in args if a.startswith("--namespace="))
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "slofleet-router-policy"
    ]
    config = from_policy(parse_policy(cm["data"]["policy.yaml"], "router-policy").spec, require_keys=True)
    key = base64.b64encode(b"sk-test-key\n").decode()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "slofleet-api-keys"},
        "data": {"keys": key},
    }
    installed.kubectl("apply", "-n", NS, "-f", "-", stdin=yaml.safe_dump(secret))
    for name, served, hf in (
        ("llama", "llama-8b", "meta-llama/Llama-3.1-8B-Instruct"),
        ("qwen", "qwen-7b", "x/q"),
    ):
        md = {
            "apiVersion": "slofleet.io/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"model": {"servedName": served, "source": {"hfId": hf}}, "gpu": {"type": "L4"}},
        }
        installed.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(md))

    state = build_state(config, KeyStore(), {})
    api = kubernetes.config.new_client_from_config(
        config_file=str(installed.kubeconfig(ROUTER_TOKEN, "router"))
    )
    discovery = KubeDiscovery(
        state, namespace=namespace, api_client=api, secrets_every_s=0.2, watch_timeout_s=1
    )

    def seen() -> set[tuple[str, str]]:
        records = installed.call(lambda: list(installed.emulator.audit))
        return {(r.resource, r.verb) for r in records if r.user == ROUTER_SA}

    async def until_watching() -> None:
        task = asyncio.create_task(discovery.run())
        for _ in range(100):  # until it watches pods and ModelDeployments and has read the keys
            watching = {("pods", "watch"), ("modeldeployments", "watch"), ("secrets", "get")} <= seen()
            if watching and len(state.catalog) == 2:
                break
            await asyncio.sleep(0.1)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(1.5)  # its watch threads end within their 1 s watch timeout

    asyncio.run(until_watching())
    assert state.keys.tenant_of("sk-test-key") == "default"
    # one router for the namespace: both ModelDeployments' models are listed (and their pods selected)
    assert dict(state.catalog) == {"llama-8b": "llama", "qwen-7b": "qwen"}
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-router")]
    records = [r for r in installed.call(lambda: list(installed.emulator.audit)) if r.user == ROUTER_SA]
    assert {r.namespace for r in records} == {role["metadata"]["namespace"]}
    assert {(r.resource, r.verb) for r in records} >= {("pods", "watch"), ("modeldeployments", "watch")}
    assert rbac.denied(records, role["rules"]) == []
    for record in records:
        if record.resource == "secrets":
            assert record.name in role["rules"][-1]["resourceNames"]
