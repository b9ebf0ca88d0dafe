"""``--kubernetes`` discovery against the emulated API server: pods come and go, keys rotate, models list.

Fake pods (OpenAI answers + State stream) run on loopback; Pod objects in the emulator point at them
through the operator's annotations. The router runs in-process, driven by the official openai client.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kubernetes
import openai
import pytest
from kube.harness import Cluster

from slo_core.crd.generate import modeldeployment_crd
from slo_core.crd.loads import parse_policy
from slo_router.app import build_state, create_app
from slo_router.config import from_policy
from slo_router.fakepod import FakePod, RunningPod, ServedApp
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


def pod_object(name: str, running: RunningPod) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"app.kubernetes.io/name": "slofleet-engine", "slofleet.io/model-deployment": "llama"},
            "annotations": {
                "slofleet.io/served-model": "llama-8b",
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
    api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig()))
    core = kubernetes.client.CoreV1Api(api)
    kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(modeldeployment_crd())
    await asyncio.sleep(0.2)
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
