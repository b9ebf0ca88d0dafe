"""Tenant limits are fleet-wide with several router replicas: each replica enforces 1/N of a tenant's
rate, N the router pods that are Ready (found by the chart's --peers-selector), so two replicas admit
what the policy states, not twice that. Two in-process routers against the emulated API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import helm_python as helm
import httpx
import kubernetes
import pytest
import yaml
from kube.harness import Cluster
from repo_paths import ROOT

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.loopback_pods import LoopbackPods, close_all
from slo_router.app import build_state, create_app
from slo_router.config import RouterConfig
from slo_router.kube import KubeDiscovery
from slo_router.ratelimit import RateLimiter
from slo_router.tenants import KeyStore, Tenant

NS = "llm"


@pytest.fixture(autouse=True)
async def _stop_loopback_pods() -> AsyncIterator[None]:
    yield
    await close_all()


def chart_router_args() -> list[str]:
    out = helm.Chart.load(str(ROOT / "charts" / "slofleet")).render({}, name="slofleet", namespace=NS)
    docs = [d for d in yaml.safe_load_all(out["slofleet/templates/router-deployment.yaml"]) if d]
    return docs[0]["spec"]["template"]["spec"]["containers"][0]["args"]  # type: ignore[no-any-return]


def pod(name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def make_ready(cluster: Cluster, name: str) -> None:
    status = '{"status": {"podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]}}'
    cluster.kubectl("patch", "pod", name, "-n", NS, "--subresource=status", "--type=merge", "-p", status)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path) as c:
        c.kubectl("apply", "-f", "-", stdin=f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n")
        yield c


def router_state(frozen: float = 0.0):  # type: ignore[no-untyped-def]
    tier = SLOTier("batch", RequestKind.DEADLINE, PriorityClass("p", 1.0), deadline_s=60.0)
    tenant = Tenant("acme", ("batch",), "batch", requests_per_s=4.0)
    config = RouterConfig(tiers={"batch": tier}, default_tier="batch", tenants={"acme": tenant})
    state = build_state(config, KeyStore(), {})
    state.limiter = RateLimiter(burst_s=2.0, clock=lambda: frozen)  # no refill: exact counts
    ok = httpx.Response(200, json={"id": "x", "object": "text_completion", "choices": [{"text": "hi"}]})
    state.client = LoopbackPods(lambda _req: ok).session()
    return state


async def test_two_router_replicas_admit_the_tenants_rate_once_not_twice(cluster: Cluster) -> None:
    args = chart_router_args()
    selector = next(a.split("=", 1)[1] for a in args if a.startswith("--peers-selector="))
    labels = dict(item.split("=") for item in selector.split(","))
    engine = pod(
        "engine-0",
        {"app.kubernetes.io/name": "slofleet-engine", "slofleet.io/model-deployment": "m"},
        {"slofleet.io/served-model": "m", "slofleet.io/http-port": "8000"},
    )
    for obj in (engine, pod("router-a", labels), pod("router-b", labels)):
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(obj))
        make_ready(cluster, obj["metadata"]["name"])

    states = [router_state(), router_state()]
    tasks = []
    for state in states:
        api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig()))
        discovery = KubeDiscovery(
            state, namespace=NS, api_client=api, watch_timeout_s=1, file_keys={"sk-acme": "acme"},
            peers_selector=selector, secrets_every_s=0.2,
        )  # fmt: skip
        tasks.append(asyncio.create_task(discovery.run()))
    try:
        for _ in range(100):
            if all(s.limiter.share == 0.5 and s.usable_endpoints() and len(s.keys) for s in states):
                break
            await asyncio.sleep(0.1)
        assert [s.limiter.share for s in states] == [0.5, 0.5], "each replica takes half"
        admitted = 0
        for state in states:
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=create_app(state)), base_url="http://r"
            )
            for _ in range(10):
                r = await client.post(
                    "/v1/completions",
                    json={"model": "m", "prompt": "hi", "max_tokens": 4},
                    headers={"authorization": "Bearer sk-acme"},
                )
                assert r.status_code in (200, 429), r.text
                admitted += r.status_code == 200
        # 4 requests/s with a 2 s burst: the fleet admits 8 at once (each replica 4), not 16
        assert admitted == 8

        # one replica goes away: the other takes the whole rate
        cluster.kubectl("delete", "pod", "router-b", "-n", NS)
        for _ in range(100):
            if states[0].limiter.share == 1.0:
                break
            await asyncio.sleep(0.1)
        assert states[0].limiter.share == 1.0
    finally:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await asyncio.sleep(1.5)  # the watch threads end within their 1 s timeout
