"""``--kubernetes`` discovery against the emulated API server: pods come and go, keys rotate, models list.

Fake pods (OpenAI answers + State stream) run on loopback; Pod objects in the emulator point at them
through the operator's annotations. The router runs in-process, driven by the official openai client.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import openai
import pytest
import yaml
from kube.harness import Cluster

from slo_core.crd.generate import modeldeployment_crd, slopolicy_crd
from slo_core.crd.loads import parse_policy
from slo_lab.fakepod import FakePod, RunningPod, ServedApp
from slo_router.app import build_state, create_app
from slo_router.config import RouterConfig, from_policy
from slo_router.kube import KubeDiscovery
from slo_router.statefeed import StateFeed
from slo_router.tenants import KeyStore

POLICY = """
apiVersion: slofleet.io/v1alpha1
kind: SLOPolicy
metadata: {name: p, namespace: default}
spec:
  priorityClasses: [{name: gold, weight: 3}, {name: bronze, weight: 1}]
  tiers:
    - {name: chat, kind: latency, ttftS: 5, tbtS: 1, priorityClass: gold}
    - {name: batch, kind: deadline, deadlineS: 600, priorityClass: bronze}
  defaultTier: batch
  tenants:
    - name: product
      apiKeysSecret: {name: product-keys, key: keys}
      allowedTiers: [chat, batch]
      defaultTier: chat
  routing: {name: go-routing}
"""

MD = {
    "apiVersion": "slofleet.io/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "llama", "namespace": "default"},
    "spec": {
        "model": {"servedName": "llama-8b", "source": {"hfId": "meta-llama/Llama-3.1-8B-Instruct"}},
        "gpu": {"count": 1, "type": "H100-80GB"},
        "policyRef": "p",
        "capabilities": {"gpuClass": "h100", "loraAdapters": [{"name": "llama-sql", "source": "hf://x/sql"}]},
    },
}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def pod_object(name: str, running: RunningPod, model: str = "llama-8b", md: str = "llama") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"app.kubernetes.io/name": "slofleet-engine", "slofleet.io/model-deployment": md},
            "annotations": {
                "slofleet.io/served-model": model,
                "slofleet.io/http-port": str(running.http_port),
                "slofleet.io/grpc-port": str(running.grpc_port),
                "slofleet.io/gpu-class": "h100",
                "slofleet.io/context-length": "8192",
            },
        },
        "spec": {"containers": [{"name": "engine", "image": "x"}]},
    }


READY = {"status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}


async def until(cond: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def client_with_crds(cluster: Cluster, *crds: dict[str, Any]) -> Any:
    """An API client for the emulated cluster, with ``crds`` installed and established."""
    api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig()))
    for crd in crds:
        kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
    await asyncio.sleep(0.2)
    return api


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    with Cluster(tmp_path) as c:
        yield c


@pytest.fixture
async def fleet() -> AsyncIterator[list[RunningPod]]:
    pods = [RunningPod(FakePod(f"p{i}", models=("llama-8b",))) for i in range(2)]
    for p in pods:
        await p.__aenter__()
    yield pods
    for p in pods:
        await p.kill()


async def test_pods_keys_and_models_follow_the_cluster(
    cluster: Cluster, fleet: list[RunningPod], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    api = await client_with_crds(cluster, modeldeployment_crd())
    core = kubernetes.client.CoreV1Api(api)
    kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
        "slofleet.io", "v1alpha1", "default", "modeldeployments", MD
    )
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "product-keys"}}
    core.create_namespaced_secret("default", {**secret, "data": {"keys": b64("sk-one\nsk-two\n")}})
    for i, running in enumerate(fleet):
        core.create_namespaced_pod("default", pod_object(f"p{i}", running))
    core.patch_namespaced_pod_status("p0", "default", READY)

    state = build_state(from_policy(parse_policy(POLICY).spec), KeyStore(), {})
    discovery = KubeDiscovery(state, api_client=api, secrets_every_s=0.2, backoff_s=0.2, watch_timeout_s=1)
    jobs = [discovery.run, StateFeed(state.endpoints, interval_ms=20).run]
    async with ServedApp(create_app(state, background=[lambda s, j=j: j() for j in jobs])) as router:
        client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-one", max_retries=0)
        await until(lambda: [e for e in state.endpoints.values() if e.usable], what="p0 usable")
        assert set(state.endpoints) == {"default/p0"}  # p1 is not Ready yet

        models = await client.models.list()
        assert sorted(m.id for m in models.data) == ["llama-8b", "llama-sql"]
        assert all(m.owned_by == "llama" for m in models.data)

        core.patch_namespaced_pod_status("p1", "default", READY)
        await until(lambda: len([e for e in state.endpoints.values() if e.usable]) == 2, what="p1 joins")
        for _ in range(6):
            out = await client.completions.create(model="llama-8b", prompt="hi", max_tokens=3)
            assert out.choices[0].text == "xxx"
        assert fleet[0].pod.served + fleet[1].pod.served == 6

        core.delete_namespaced_pod("p0", "default")
        await until(lambda: set(state.endpoints) == {"default/p1"}, what="p0 leaves")
        before = fleet[1].pod.served
        for _ in range(3):
            await client.completions.create(model="llama-8b", prompt="hi", max_tokens=2)
        assert fleet[1].pod.served == before + 3

        stranger = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-new", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await stranger.completions.create(model="llama-8b", prompt="x", max_tokens=1)
        with pytest.raises(openai.AuthenticationError):
            await stranger.models.list()
        core.replace_namespaced_secret("product-keys", "default", {**secret, "data": {"keys": b64("sk-new")}})
        await until(lambda: state.keys.tenant_of("sk-new") == "product", what="key rotation")
        rotated = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-new", max_retries=0)
        assert (await rotated.completions.create(model="llama-8b", prompt="x", max_tokens=1)).choices
        with pytest.raises(openai.AuthenticationError):
            await client.completions.create(model="llama-8b", prompt="x", max_tokens=1)

    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "sk-one" not in logged and "sk-new" not in logged


def bound_tier(running: RunningPod) -> str:
    """The tier the router bound the pod's last request to (the header it forwards)."""
    return running.pod.seen_headers[-1].get("x-slo-tier", "")


async def test_the_router_follows_a_named_slopolicy_as_it_changes(
    cluster: Cluster, fleet: list[RunningPod], caplog: pytest.LogCaptureFixture
) -> None:
    """``--policy-name``: not ready until the policy is read; valid edits apply, a bad one is refused."""
    caplog.set_level(logging.INFO)
    api = await client_with_crds(cluster, modeldeployment_crd(), slopolicy_crd())
    core = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "product-keys"}}
    core.create_namespaced_secret("default", {**secret, "data": {"keys": b64("sk-one\n")}})
    core.create_namespaced_pod("default", pod_object("p0", fleet[0]))
    core.patch_namespaced_pod_status("p0", "default", READY)

    # what the CLI starts from before the named policy is read: one tier, keys required
    state = build_state(dataclasses.replace(RouterConfig.single_tier(), require_keys=True), KeyStore(), {})
    discovery = KubeDiscovery(
        state,
        namespace="default",
        api_client=api,
        secrets_every_s=30,  # long: a policy change itself must trigger the re-read of its Secrets
        backoff_s=0.2,
        watch_timeout_s=1,
        policy_name="p",
        policy_every_s=0.2,
    )
    jobs = [discovery.run, StateFeed(state.endpoints, interval_ms=20).run]
    async with ServedApp(create_app(state, background=[lambda s, j=j: j() for j in jobs])) as router:
        http = httpx.AsyncClient(base_url=router.url)
        client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-one", max_retries=0)
        await until(lambda: [e for e in state.endpoints.values() if e.usable], what="p0 usable")
        # the policy does not exist yet: not ready, and requests get a clear 503, not a wrong tier
        ready = await http.get("/ready")
        assert ready.status_code == 503 and ready.json()["policy_loaded"] is False
        with pytest.raises(openai.InternalServerError, match="has not read SLOPolicy default/p"):
            await client.completions.create(model="llama-8b", prompt="hi", max_tokens=2)

        policy = yaml.safe_load(POLICY)
        custom.create_namespaced_custom_object("slofleet.io", "v1alpha1", "default", "slopolicies", policy)
        await until(
            lambda: state.policy_loaded and state.keys.tenant_of("sk-one") == "product", what="policy"
        )
        assert (await http.get("/ready")).json() == {
            "ready": True,
            "endpoints": 1,
            "policy_loaded": True,
            "policy": "default/p",
        }
        assert set(state.config.tiers) == {"chat", "batch"}
        out = await client.completions.create(
            model="llama-8b", prompt="hi", max_tokens=2, extra_headers={"x-slo-tier": "batch"}
        )
        assert out.choices[0].text == "xx"
        assert bound_tier(fleet[0]) == "batch"
        # a tier the policy does not have (yet) binds the tenant's default tier
        await client.completions.create(
            model="llama-8b", prompt="hi", max_tokens=2, extra_headers={"x-slo-tier": "bulk"}
        )
        assert bound_tier(fleet[0]) == "chat"

        # an edit adds a tier and a tenant whose keys live in another Secret: both apply live
        core.create_namespaced_secret(
            "default",
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "ops-keys"},
                "data": {"k": b64("sk-ops")},
            },
        )
        edited = custom.get_namespaced_custom_object("slofleet.io", "v1alpha1", "default", "slopolicies", "p")
        edited["spec"]["tiers"].append({"name": "bulk", "kind": "best-effort", "priorityClass": "bronze"})
        edited["spec"]["tenants"][0]["allowedTiers"].append("bulk")
        edited["spec"]["tenants"].append(
            {
                "name": "ops",
                "apiKeysSecret": {"name": "ops-keys", "key": "k"},
                "allowedTiers": ["batch"],
                "defaultTier": "batch",
            }
        )
        custom.replace_namespaced_custom_object(
            "slofleet.io", "v1alpha1", "default", "slopolicies", "p", edited
        )
        await until(
            lambda: state.keys.tenant_of("sk-ops") == "ops", what="the edit and the new tenant's keys"
        )
        assert set(state.config.tiers) == {"chat", "batch", "bulk"}
        out = await client.completions.create(
            model="llama-8b", prompt="hi", max_tokens=2, extra_headers={"x-slo-tier": "bulk"}
        )
        assert out.choices and bound_tier(fleet[0]) == "bulk"

        # an edit the API server accepts but that names a tier that does not exist: refused, logged
        bad = custom.get_namespaced_custom_object("slofleet.io", "v1alpha1", "default", "slopolicies", "p")
        bad["spec"]["tenants"][0]["allowedTiers"] = ["chat", "gold"]
        custom.replace_namespaced_custom_object("slofleet.io", "v1alpha1", "default", "slopolicies", "p", bad)
        await until(lambda: "not applied" in caplog.text, what="the bad edit to be refused")
        assert "spec.tenants[0].allowedTiers[1]: 'gold' is not a tier" in caplog.text
        assert set(state.config.tiers) == {"chat", "batch", "bulk"}, "the last good version stays"
        out = await client.completions.create(
            model="llama-8b", prompt="hi", max_tokens=2, extra_headers={"x-slo-tier": "bulk"}
        )
        assert out.choices and bound_tier(fleet[0]) == "bulk"

        # deleted: the router keeps serving with the last good version and says why it cannot read it
        custom.delete_namespaced_custom_object("slofleet.io", "v1alpha1", "default", "slopolicies", "p")
        await until(
            lambda: "cannot read SLOPolicy default/p" in caplog.text, what="the deletion to be noticed"
        )
        assert (await http.get("/ready")).status_code == 200
        assert (await client.completions.create(model="llama-8b", prompt="hi", max_tokens=1)).choices
        await http.aclose()
    assert "sk-one" not in caplog.text and "sk-ops" not in caplog.text


async def test_a_failed_secret_read_keeps_the_last_good_keys(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    api = await client_with_crds(cluster, modeldeployment_crd())
    core = kubernetes.client.CoreV1Api(api)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "product-keys"}}
    core.create_namespaced_secret("default", {**secret, "data": {"keys": b64("sk-one\n")}})
    async with RunningPod(FakePod("p0", models=("llama-8b",))) as running:
        core.create_namespaced_pod("default", pod_object("p0", running))
        core.patch_namespaced_pod_status("p0", "default", READY)
        state = build_state(from_policy(parse_policy(POLICY).spec), KeyStore(), {})
        discovery = KubeDiscovery(
            state, api_client=api, secrets_every_s=0.1, backoff_s=0.2, watch_timeout_s=1
        )
        jobs = [discovery.run, StateFeed(state.endpoints, interval_ms=20).run]
        async with ServedApp(create_app(state, background=[lambda s, j=j: j() for j in jobs])) as router:
            client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-one", max_retries=0)
            await until(lambda: state.keys.tenant_of("sk-one") == "product", what="keys read")
            await until(lambda: [e for e in state.endpoints.values() if e.usable], what="p0 usable")

            assert cluster.emulator is not None
            cluster.emulator.failing_paths.add("/secrets/product-keys")
            failed = state.metrics.key_reads_failed.labels("product")
            await until(lambda: failed._value.get() >= 3, what="several failed Secret reads")
            assert state.keys.tenant_of("sk-one") == "product"  # the last good key set stays
            out = await client.completions.create(model="llama-8b", prompt="hi", max_tokens=2)
            assert out.choices
            cluster.emulator.failing_paths.clear()

            # a Secret that is read and no longer holds the key does revoke it
            core.replace_namespaced_secret(
                "product-keys", "default", {**secret, "data": {"keys": b64("sk-2")}}
            )
            await until(lambda: state.keys.tenant_of("sk-one") is None, what="revocation")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "keeping its last good 1 keys" in logged
    assert "sk-one" not in logged


async def test_two_modeldeployments_behind_one_router_each_get_only_their_models_requests(
    cluster: Cluster,
) -> None:
    """Two ModelDeployments (two models) in one namespace behind one router: /v1/models lists both with
    their owners, and every request, streamed or not, chat or completion, reaches a pod of its own
    model only; an unknown model is 404 model_not_found."""
    api = await client_with_crds(cluster, modeldeployment_crd())
    core = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    qwen_md = {
        **MD,
        "metadata": {"name": "qwen", "namespace": "default"},
        "spec": {
            **MD["spec"],
            "model": {"servedName": "qwen-7b", "source": {"hfId": "Qwen/Qwen2.5-7B-Instruct"}},
            "capabilities": {"gpuClass": "h100"},
        },
    }
    for body in (MD, qwen_md):
        custom.create_namespaced_custom_object("slofleet.io", "v1alpha1", "default", "modeldeployments", body)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "product-keys"}}
    core.create_namespaced_secret("default", {**secret, "data": {"keys": b64("sk-one\n")}})
    pods = {
        "llama-8b": [RunningPod(FakePod(f"l{i}", models=("llama-8b",))) for i in range(2)],
        "qwen-7b": [RunningPod(FakePod(f"q{i}", models=("qwen-7b",))) for i in range(2)],
    }
    for model, running in pods.items():
        for i, p in enumerate(running):
            await p.__aenter__()
            name = f"{model.split('-')[0]}-{i}"
            core.create_namespaced_pod("default", pod_object(name, p, model, model.split("-")[0]))
            core.patch_namespaced_pod_status(name, "default", READY)

    state = build_state(from_policy(parse_policy(POLICY).spec), KeyStore(), {})
    discovery = KubeDiscovery(state, api_client=api, secrets_every_s=0.2, backoff_s=0.2, watch_timeout_s=1)
    jobs = [discovery.run, StateFeed(state.endpoints, interval_ms=20).run]
    try:
        async with ServedApp(create_app(state, background=[lambda s, j=j: j() for j in jobs])) as router:
            client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-one", max_retries=0)
            await until(lambda: len([e for e in state.endpoints.values() if e.usable]) == 4, what="4 pods")
            await until(lambda: len(state.catalog) == 3, what="both ModelDeployments")
            listed = {m.id: m.owned_by for m in (await client.models.list()).data}
            assert listed == {"llama-8b": "llama", "llama-sql": "llama", "qwen-7b": "qwen"}

            def served(model: str) -> int:
                return sum(p.pod.served for p in pods[model])

            for model, other in (("llama-8b", "qwen-7b"), ("qwen-7b", "llama-8b")):
                before, before_other = served(model), served(other)
                for _ in range(4):
                    out = await client.completions.create(model=model, prompt="hi", max_tokens=3)
                    assert out.model == model and out.choices[0].text == "xxx"
                    chat = await client.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                    )
                    assert chat.model == model
                    stream = await client.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
                    )
                    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                    assert text == "xxxx"
                assert served(model) == before + 12 and served(other) == before_other

            with pytest.raises(openai.NotFoundError) as err:
                await client.completions.create(model="mistral-7b", prompt="hi", max_tokens=1)
            assert err.value.code == "model_not_found"
    finally:
        for running in pods.values():
            for p in running:
                await p.kill()
