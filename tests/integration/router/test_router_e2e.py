"""End to end on loopback: openai client → ``slofleet router`` → 3 sidecars → engine-sim (two GPU profiles).

One fleet (the processes ``slofleet up`` starts) serves the whole module; the failover test kills an
engine, so it runs last. Engines are slowed down (``speedup`` < 1) so streams are still in flight when
one dies. Starting seven processes takes a minute on a busy two-core machine: the module is ``slow``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from slo_lab.localfleet.launcher import LocalFleet
from slo_lab.localfleet.spec import EngineGroup, FleetSpec

pytest.importorskip("slo_lab.engine_sim.app")
pytestmark = [pytest.mark.slow, pytest.mark.e2e]

POLICY = """\
apiVersion: slofleet.io/v1alpha1
kind: SLOPolicy
metadata: {name: e2e, namespace: default}
spec:
  priorityClasses: [{name: gold, weight: 3}, {name: bronze, weight: 1}]
  tiers:
    - {name: chat, kind: latency, ttftS: 10, tbtS: 1, priorityClass: gold}
    - {name: batch, kind: deadline, deadlineS: 900, priorityClass: bronze}
  defaultTier: batch
  tenants:
    - {name: product, allowedTiers: [chat, batch], defaultTier: chat}
    - {name: research, allowedTiers: [batch], defaultTier: batch, requestsPerSecond: 2}
  admission: {maxWaitS: 600}
  scheduling: {name: fcfs}
  routing: {name: go-routing}
"""
KEYS = "tenants:\n  product: [sk-product]\n  research: [sk-research]\n"
HANG_LIMIT_S = 90.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    work = tmp_path_factory.mktemp("fleet")
    (work / "policy.yaml").write_text(POLICY)
    (work / "keys.yaml").write_text(KEYS)
    spec = FleetSpec(
        engines=[
            EngineGroup(count=2, profile="h100-llama3-8b-tp1", speedup=0.25),
            EngineGroup(count=1, profile="a100-llama3-8b-tp1", speedup=0.25),
        ],
        port=0,
        policy_file=work / "policy.yaml",
        keys_file=work / "keys.yaml",
        workdir=work,
    )
    with LocalFleet(spec) as f:
        yield f


def prom(fleet: LocalFleet) -> str:
    return httpx.get(fleet.router_url + "/metrics", timeout=10).text


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def model(fleet: LocalFleet) -> str:
    return next(p.model for p in fleet.pods if p.model)


def test_tiers_spoofing_rate_limits_models_and_streaming(fleet: LocalFleet) -> None:
    url, m = fleet.router_url + "/v1", model(fleet)
    product = openai.OpenAI(base_url=url, api_key="sk-product", max_retries=0)
    research = openai.OpenAI(base_url=url, api_key="sk-research", max_retries=0)
    assert [x.id for x in product.models.list().data] == [m]
    out = product.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert out.usage is not None and out.usage.completion_tokens <= 4 and out.choices[0].message.content
    text = "".join(
        c.choices[0].text
        for c in product.completions.create(model=m, prompt="hello", max_tokens=6, stream=True)
        if c.choices
    )
    assert text
    # research may only use batch: a spoofed chat tier is stripped, counted, and served as batch
    research.completions.create(model=m, prompt="x", max_tokens=2, extra_headers={"x-slo-tier": "chat"})
    burst = openai.AsyncOpenAI(base_url=url, api_key="sk-research", max_retries=0)

    async def one() -> int:
        try:
            await burst.completions.create(model=m, prompt="x", max_tokens=1)
            return 200
        except openai.RateLimitError as exc:
            assert int(exc.response.headers["retry-after"]) >= 1
            return 429

    async def all_at_once() -> list[int]:
        return list(await asyncio.gather(*(one() for _ in range(8))))

    codes = asyncio.run(all_at_once())  # 2 requests/s with a 2 s burst: at most 4 pass at once
    assert codes.count(429) >= 4 and 200 in codes
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="sk-nobody", max_retries=0).models.list()
    # a stream is accounted when the router's relay ends, which can be just after the client read
    # [DONE] and hung up: wait for it (it must count as ok, not as a cancellation)
    deadline = time.monotonic() + 10
    while (
        metric(prom(fleet), "slofleet_router_requests_total", tier="chat", tenant="product", outcome="ok") < 2
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    text_ = prom(fleet)
    assert metric(text_, "slofleet_router_stripped_total", tenant="research") == 1
    assert metric(text_, "slofleet_router_requests_total", tier="chat", tenant="product", outcome="ok") == 2
    assert metric(text_, "slofleet_router_requests_total", tenant="product", outcome="cancelled") == 0
    assert metric(text_, "slofleet_router_requests_total", tier="batch", tenant="research", outcome="ok") >= 2
    assert metric(text_, "slofleet_router_requests_total", tier="chat", tenant="research") == 0


async def stream(h: httpx.AsyncClient, url: str, body: dict[str, object], started: list[int]) -> str:
    """One stream read with plain httpx; returns ok, error (an explicit error event), http N or hung."""
    tokens, done, error = 0, False, False
    headers = {"authorization": "Bearer sk-product", "x-slo-tier": "batch"}
    try:
        async with asyncio.timeout(HANG_LIMIT_S):
            async with h.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    return f"http {r.status_code}: {(await r.aread())[:200]!r}"
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        error = error or '"error"' in line
                        tokens += 1
                        if tokens == 1:
                            started.append(1)
    except TimeoutError:
        return "hung"
    except httpx.HTTPError as exc:
        return f"broken: {type(exc).__name__}"
    return "error" if error else ("ok" if done else "no [DONE]")


async def test_500_concurrent_streams_lose_nothing(fleet: LocalFleet) -> None:
    body = {"model": model(fleet), "prompt": "hello", "max_tokens": 8, "stream": True}
    before = metric(prom(fleet), "slofleet_router_requests_total", tier="batch", tenant="product")
    limits = httpx.Limits(max_connections=600, max_keepalive_connections=600)
    async with httpx.AsyncClient(limits=limits, timeout=HANG_LIMIT_S) as h:
        results = await asyncio.gather(*(stream(h, fleet.router_url, body, []) for _ in range(500)))
    assert {r: results.count(r) for r in set(results)} == {"ok": 500}, prom(fleet)[-3000:]
    deadline = time.monotonic() + 20  # the last relays may account just after their client hung up
    while (
        metric(prom(fleet), "slofleet_router_requests_total", tier="batch", tenant="product") - before < 500
        and time.monotonic() < deadline
    ):
        await asyncio.sleep(0.1)
    after = prom(fleet)
    assert metric(after, "slofleet_router_requests_total", tier="batch", tenant="product") - before == 500
    assert (
        metric(after, "slofleet_router_requests_total", tier="batch", tenant="product", outcome="ok") >= 500
    )


async def test_engine_killed_mid_load(fleet: LocalFleet) -> None:
    m = model(fleet)
    limits = httpx.Limits(max_connections=100)
    text0 = prom(fleet)
    async with httpx.AsyncClient(limits=limits, timeout=HANG_LIMIT_S) as h:
        started: list[int] = []
        long = {"model": m, "prompt": "tell me", "max_tokens": 300, "stream": True, "ignore_eos": True}
        first = [asyncio.create_task(stream(h, fleet.router_url, long, started)) for _ in range(24)]
        deadline = time.monotonic() + 60
        while len(started) < 24:
            assert time.monotonic() < deadline, "streams did not start"
            await asyncio.sleep(0.05)
        victim = next(c for c in fleet.children if c.name == "engine-0")
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        short = {"model": m, "prompt": "hi", "max_tokens": 4, "stream": True}
        later = [asyncio.create_task(stream(h, fleet.router_url, short, [])) for _ in range(24)]
        first_done = await asyncio.gather(*first)
        later_done = await asyncio.gather(*later)
    assert "hung" not in first_done + later_done
    assert later_done == ["ok"] * 24  # not started when it died: served elsewhere
    assert set(first_done) <= {"ok", "error"} and "error" in first_done  # its in-flight streams say so
    text1 = prom(fleet)

    def delta(**labels: str) -> float:
        name = "slofleet_router_requests_total"
        return metric(text1, name, tenant="product", **labels) - metric(
            text0, name, tenant="product", **labels
        )

    assert delta(outcome="ok") == first_done.count("ok") + 24
    assert delta(outcome="error") == first_done.count("error")
    assert delta() == 48


def test_a_local_fleet_of_two_engine_groups_serves_two_models_each_on_its_own_engines(
    tmp_path: Path,
) -> None:
    """``slofleet up``'s spec: one engine group per model; the router lists both and sends each model's
    requests to its own group's engines only (the router's per-pod choice counter)."""
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "keys.yaml").write_text(KEYS)
    spec = FleetSpec(
        engines=[EngineGroup(count=1, model="alpha"), EngineGroup(count=1, model="beta")],
        port=0,
        policy_file=tmp_path / "policy.yaml",
        keys_file=tmp_path / "keys.yaml",
        workdir=tmp_path,
    )
    with LocalFleet(spec) as f:
        client = openai.OpenAI(base_url=f.router_url + "/v1", api_key="sk-product", max_retries=0)
        assert sorted(x.id for x in client.models.list().data) == ["alpha", "beta"]
        pod_of = {p.model: p.pod_id for p in f.pods}
        for name in ("alpha", "beta", "alpha", "beta"):
            before = prom(f)
            client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            text = "".join(
                c.choices[0].text
                for c in client.completions.create(model=name, prompt="x", max_tokens=3, stream=True)
                if c.choices
            )
            assert text
            after = prom(f)
            chosen = {
                m: metric(after, "slofleet_router_chosen_total", endpoint=pod_of[m])
                - metric(before, "slofleet_router_chosen_total", endpoint=pod_of[m])
                for m in ("alpha", "beta")
            }
            assert chosen == {name: 2, ({"alpha", "beta"} - {name}).pop(): 0}
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="gamma", prompt="x", max_tokens=1)
