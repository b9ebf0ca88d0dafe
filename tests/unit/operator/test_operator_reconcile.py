"""The reconciler on an in-memory API: idempotent convergence, Degraded reasons, Events on transitions."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from repo_paths import ROOT

from slo_operator.kubeapi import PLURALS, ApiError
from slo_operator.reconcile import Reconciler
from slo_operator.settings import OperatorSettings


class FakeApi:
    """Objects by (plural, namespace, name); server-side apply merges the whole object; counts writes."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.field_manager = "test"

    def put(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("generation", 1)
        self.objects[(PLURALS[body["kind"]], meta["namespace"], meta["name"])] = body

    def get(self, _api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get((plural, namespace, name))
        return copy.deepcopy(found) if found else None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = (PLURALS[obj["kind"]], obj["metadata"]["namespace"], obj["metadata"]["name"])
        old = self.objects.get(key)
        if old is None or {k: v for k, v in old.items() if k != "status"} != obj:
            self.writes.append(("apply", obj["kind"]))
            self.objects[key] = {**copy.deepcopy(obj), "status": (old or {}).get("status", {})}
        return copy.deepcopy(self.objects[key])

    def patch_status(
        self, _v: str, plural: str, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        self.writes.append(("status", plural))
        self.objects[(plural, namespace, name)]["status"] = copy.deepcopy(status)
        return self.objects[(plural, namespace, name)]

    def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        assert method == "GET" and path.endswith(("/pods", "/horizontalpodautoscalers"))
        plural, namespace = path.rsplit("/", 1)[1], path.split("/namespaces/")[1].split("/", maxsplit=1)[0]
        return {"items": [o for (p, ns, _), o in self.objects.items() if (p, ns) == (plural, namespace)]}


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


HF_TOKEN = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "hf-token", "namespace": "llm", "labels": {"slofleet.io/hf-token": "true"}},
    "data": {"token": "aGZfeA=="},
}


def make() -> tuple[FakeApi, Reconciler, list[tuple[str, str]]]:
    api = FakeApi()
    api.put(copy.deepcopy(HF_TOKEN))
    events: list[tuple[str, str]] = []
    clock = iter(f"2026-01-01T00:00:{s:02d}Z" for s in range(60))
    reconciler = Reconciler(
        api,  # type: ignore[arg-type]
        OperatorSettings(priority=1),
        events=lambda _body, type_, reason, _msg: events.append((type_, reason)),
        clock=lambda: next(clock),
    )
    return api, reconciler, events


def test_converging_twice_writes_nothing_the_second_time() -> None:
    api, reconciler, events = make()
    api.put(example("slopolicy-chat-agent.yaml"))
    api.put(example("modeldeployment-llama-8b-h100.yaml"))
    assert reconciler.converge("llm", "llama-8b") == "Progressing"
    assert sorted(kind for op, kind in api.writes if op == "apply") == [
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "Service",
    ]
    before = len(api.writes)
    assert reconciler.converge("llm", "llama-8b") == "Progressing"
    assert len(api.writes) == before, api.writes[before:]
    assert events == [("Normal", "Progressing")]


def test_missing_policy_degrades_without_children_then_recovers() -> None:
    api, reconciler, events = make()
    api.put(example("modeldeployment-llama-8b-h100.yaml"))
    assert reconciler.converge("llm", "llama-8b") == "Degraded"
    assert not [w for w in api.writes if w[0] == "apply"]
    status = api.get("", "modeldeployments", "llm", "llama-8b")["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "PolicyNotFound" and "chat-agent" in degraded["message"]
    api.put(example("slopolicy-chat-agent.yaml"))
    assert reconciler.converge("llm", "llama-8b") == "Progressing"
    assert events == [("Warning", "PolicyNotFound"), ("Normal", "Progressing")]


def test_an_invalid_policy_keeps_the_last_good_config_and_says_why() -> None:
    api, reconciler, _ = make()
    api.put(example("slopolicy-chat-agent.yaml"))
    api.put(example("modeldeployment-llama-8b-h100.yaml"))
    reconciler.converge("llm", "llama-8b")
    good = api.get("", "configmaps", "llm", "llama-8b-policy")
    bad = example("slopolicy-chat-agent.yaml")
    bad["spec"]["defaultTier"] = "gold-plated"
    api.put(bad)
    assert reconciler.converge("llm", "llama-8b") == "Degraded"
    assert api.get("", "configmaps", "llm", "llama-8b-policy") == good
    status = api.get("", "modeldeployments", "llm", "llama-8b")["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "PolicyInvalid" and "gold-plated" in degraded["message"]
    reconciler.report_policy(api.get("", "slopolicies", "llm", "chat-agent"), deployments=1)
    policy_status = api.get("", "slopolicies", "llm", "chat-agent")["status"]
    assert policy_status["phase"] == "Invalid" and policy_status["deployments"] == 1


def test_an_invalid_spec_fails_with_the_field_named() -> None:
    api, reconciler, events = make()
    md = example("modeldeployment-llama-8b-h100.yaml")
    md["spec"]["engine"]["tensorParallelSize"] = 8
    api.put(md)
    assert reconciler.converge("llm", "llama-8b") == "Failed"
    status = api.get("", "modeldeployments", "llm", "llama-8b")["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and "tensorParallelSize" in ready["message"]
    assert events == [("Warning", "InvalidSpec")]


def test_a_deleted_model_deployment_is_left_alone() -> None:
    api, reconciler, _ = make()
    assert reconciler.converge("llm", "gone") is None
    assert api.writes == []


def test_a_child_the_api_server_refuses_degrades_with_its_message_and_is_retried() -> None:
    api, reconciler, events = make()
    api.put(example("slopolicy-chat-agent.yaml"))
    api.put(example("modeldeployment-llama-8b-h100.yaml"))
    real_apply = api.apply

    def refuse_deployments(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Deployment":
            raise ApiError(403, "Forbidden", "exceeded quota: gpu, requested: nvidia.com/gpu=1")
        return real_apply(obj)

    api.apply = refuse_deployments  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        reconciler.converge("llm", "llama-8b")
    status = api.get("", "modeldeployments", "llm", "llama-8b")["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ApplyFailed"
    assert (
        degraded["message"]
        == 'the API server refused Deployment "llama-8b": exceeded quota: gpu, requested: nvidia.com/gpu=1'
    )
    api.apply = real_apply  # type: ignore[method-assign]
    assert reconciler.converge("llm", "llama-8b") == "Progressing"
    assert events == [("Warning", "ApplyFailed"), ("Normal", "Progressing")]


# ------------------------------------------------------------------ owning only what it created (issue 18)


def test_an_object_it_does_not_own_is_never_adopted_and_says_which() -> None:
    api, reconciler, events = make()
    api.put(example("slopolicy-chat-agent.yaml"))
    api.put(example("modeldeployment-llama-8b-h100.yaml"))
    stranger = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "llama-8b", "namespace": "llm"},
        "spec": {"selector": {"app": "someone-else"}},
    }
    api.put(copy.deepcopy(stranger))
    with pytest.raises(ApiError):
        reconciler.converge("llm", "llama-8b")
    assert api.get("", "services", "llm", "llama-8b")["spec"] == stranger["spec"], "selector hijacked"
    status = api.get("", "modeldeployments", "llm", "llama-8b")["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert status["phase"] == "Degraded" and degraded["reason"] == "NotOwned"
    assert 'Service "llama-8b"' in degraded["message"]
    assert ("Warning", "NotOwned") in events
    # once the stranger is gone the operator creates its own
    del api.objects[("services", "llm", "llama-8b")]
    assert reconciler.converge("llm", "llama-8b") == "Progressing"


def test_replicas_are_left_to_an_autoscaler_that_targets_the_deployment() -> None:
    api, reconciler, _ = make()
    api.put(example("slopolicy-chat-agent.yaml"))
    api.put(example("modeldeployment-llama-8b-h100.yaml"))
    reconciler.converge("llm", "llama-8b")
    assert api.get("", "deployments", "llm", "llama-8b")["spec"]["replicas"] == 1
    api.put(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "llama-8b", "namespace": "llm"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama-8b"},
                "minReplicas": 1,
                "maxReplicas": 4,
            },
        }
    )
    api.writes.clear()
    reconciler.converge("llm", "llama-8b")
    applied = api.get("", "deployments", "llm", "llama-8b")
    assert "replicas" not in applied["spec"], "the operator would fight the HPA"


def test_a_policy_lacking_the_routers_tiers_is_reported_with_an_event() -> None:
    api = FakeApi()
    api.put(copy.deepcopy(HF_TOKEN))
    events: list[tuple[str, str]] = []
    reconciler = Reconciler(
        api,  # type: ignore[arg-type]
        OperatorSettings(priority=1, router_policy="default", router_namespace="llm"),
        events=lambda _body, type_, reason, _msg: events.append((type_, reason)),
    )
    router = example("slopolicy-chat-agent.yaml")
    router["metadata"]["name"] = "default"
    router["spec"]["tiers"].append({"name": "interactive", "kind": "best-effort", "priorityClass": "bronze"})
    api.put(router)
    api.put(example("slopolicy-chat-agent.yaml"))
    api.put(example("modeldeployment-llama-8b-h100.yaml"))
    assert reconciler.converge("llm", "llama-8b") == "Degraded"
    status = api.get("", "modeldeployments", "llm", "llama-8b")["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "RouterTierMismatch" and "interactive" in degraded["message"]
    assert ("Warning", "RouterTierMismatch") in events
    assert api.get("", "deployments", "llm", "llama-8b") is not None, "children are still applied"
    # the router's policy loses the extra tier: the deployment recovers
    router["spec"]["tiers"].pop()
    api.put(router)
    assert reconciler.converge("llm", "llama-8b") == "Progressing"


def test_only_a_secret_labelled_for_it_is_mounted_as_the_hf_token() -> None:
    api, reconciler, events = make()
    unlabelled = copy.deepcopy(HF_TOKEN)
    unlabelled["metadata"]["labels"] = {}
    api.put(unlabelled)
    api.put(example("slopolicy-chat-agent.yaml"))
    api.put(example("modeldeployment-llama-8b-h100.yaml"))
    assert reconciler.converge("llm", "llama-8b") == "Degraded"
    assert api.get("apps/v1", "deployments", "llm", "llama-8b") is None, "nothing mounts it"
    status = api.get("", "modeldeployments", "llm", "llama-8b")["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "SecretNotAllowed" and "slofleet.io/hf-token" in degraded["message"]
    assert "aGZfeA" not in str(status) and ("Warning", "SecretNotAllowed") in events
    api.put(copy.deepcopy(HF_TOKEN))
    assert reconciler.converge("llm", "llama-8b") == "Progressing"


def test_only_a_service_account_labelled_for_it_runs_the_engine_pods() -> None:
    api, reconciler, events = make()
    api.put(example("slopolicy-chat-agent.yaml"))
    md = example("modeldeployment-llama-8b-h100.yaml")
    md["spec"]["pod"] = {"serviceAccountName": "s3-reader"}
    api.put(md)
    assert reconciler.converge("llm", "llama-8b") == "Degraded"
    status = api.get("", "modeldeployments", "llm", "llama-8b")["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ServiceAccountNotAllowed" and "does not exist" in degraded["message"]
    assert api.get("apps/v1", "deployments", "llm", "llama-8b") is None
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "s3-reader", "namespace": "llm"}}
    api.put(copy.deepcopy(sa))
    assert reconciler.converge("llm", "llama-8b") == "Degraded"
    degraded = next(
        c
        for c in api.get("", "modeldeployments", "llm", "llama-8b")["status"]["conditions"]
        if c["type"] == "Degraded"
    )
    assert 'not labelled slofleet.io/engine-service-account="true"' in degraded["message"]
    sa["metadata"]["labels"] = {"slofleet.io/engine-service-account": "true"}
    api.put(sa)
    assert reconciler.converge("llm", "llama-8b") == "Progressing"
    dep = api.get("apps/v1", "deployments", "llm", "llama-8b")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "s3-reader"
    assert ("Warning", "ServiceAccountNotAllowed") in events
