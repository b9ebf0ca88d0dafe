"""200 concurrent streams of mixed tiers through the sidecar into an overloaded engine-sim: every request ends
in a completion or an explicit 429/503 with Retry-After, none hangs, and the counts of the client, the
sidecar's metrics and the engine agree exactly."""

from __future__ import annotations

import asyncio
import collections

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.engine_sim.server import serve_engine_sim
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.runtime import running_sidecar
from slo_sidecar.service import Sidecar

TIERS = {
    "gold": SLOTier("gold", RequestKind.LATENCY, PriorityClass("high", 4.0), ttft_s=1.0, tbt_s=0.05),
    "silver": SLOTier("silver", RequestKind.DEADLINE, PriorityClass("mid", 2.0), deadline_s=5.0),
    "bronze": SLOTier("bronze", RequestKind.BEST_EFFORT, PriorityClass("low", 1.0)),
}
N_REQUESTS = 200
OUTPUT_TOKENS = 32


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out: dict[tuple[tuple[str, str], ...], float] = collections.defaultdict(float)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] += s.value
    return out


def _total(text: str, name: str, **labels: str) -> float:
    return sum(v for k, v in _samples(text, name).items() if all((lk, lv) in k for lk, lv in labels.items()))


async def _one(client: AsyncOpenAI, model: str, i: int) -> tuple[str, int]:
    tier = ("bronze", "bronze", "gold", "silver")[i % 4]
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"request number {i}"}],
            max_tokens=OUTPUT_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-slo-tier": tier},
            extra_body={"ignore_eos": True},
        )
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        assert usage is not None
        return "ok", usage.completion_tokens
    except openai.APIStatusError as exc:
        assert exc.status_code in (429, 503), exc
        assert int(exc.response.headers["retry-after"]) >= 1
        return str(exc.status_code), 0


@pytest.mark.slow
async def test_200_concurrent_streams_under_overload_all_end_explicitly_and_reconcile() -> None:
    async with serve_engine_sim(speedup=1.0) as sim:
        knobs = SidecarKnobs(max_running=16, max_queue=40, tier_max_inflight=25, drain_timeout_s=5)
        config = PolicyConfig(tiers=TIERS, default_tier="bronze", max_wait_s=60, policy_name="edf")
        sc = Sidecar(knobs=knobs, config=config, engine_url=sim.url, estimator=FallbackEstimator())
        async with running_sidecar(sc, grpc_port=None) as run, httpx.AsyncClient() as http:
            client = AsyncOpenAI(base_url=run.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)
            calls = (_one(client, sim.model, i) for i in range(N_REQUESTS))
            results = await asyncio.wait_for(asyncio.gather(*calls), timeout=100)
            await client.close()
            metrics = (await http.get(run.http_url + "/metrics")).text
            engine = (await http.get(sim.url + "/metrics")).text
            assert not sc.jobs and not sc.scheduler.waiting and not sc.scheduler.running

    outcomes = collections.Counter(kind for kind, _ in results)
    ok = outcomes["ok"]
    assert sum(outcomes.values()) == N_REQUESTS
    assert set(outcomes) <= {"ok", "429", "503"}
    assert ok >= knobs.max_running + knobs.max_queue and outcomes["429"] + outcomes["503"] > 0, outcomes
    assert all(n == OUTPUT_TOKENS for kind, n in results if kind == "ok")

    # client, sidecar and engine agree on every count
    assert _total(metrics, "slofleet_sidecar_requests_total", outcome="ok") == ok
    assert _total(engine, "vllm:request_success_total") == ok
    assert _total(engine, "vllm:request_success_total", finished_reason="abort") == 0
    assert _total(metrics, "slofleet_sidecar_output_tokens_total") == ok * OUTPUT_TOKENS
    assert _total(engine, "vllm:generation_tokens_total") == ok * OUTPUT_TOKENS
    assert _total(metrics, "slofleet_sidecar_requests_total") - ok == outcomes["503"] - _early(metrics)
    assert _total(metrics, "slofleet_sidecar_rejects_total") == outcomes["429"] + outcomes["503"]
    assert _total(metrics, "slofleet_sidecar_rejects_total", reason="tier_limit") == outcomes["429"]
    assert _total(metrics, "slofleet_sidecar_rejects_total", tier="-") == 0  # every refusal names its tier
    assert _total(metrics, "slofleet_sidecar_requests_total", outcome="error") == 0
    assert _total(engine, "vllm:num_requests_running") == 0
    per_tier = {t: _total(metrics, "slofleet_sidecar_requests_total", tier=t) for t in TIERS}
    assert all(v > 0 for v in per_tier.values())
    assert _total(metrics, "slofleet_sidecar_decision_seconds_count") > 0


def _early(metrics: str) -> float:
    """503s refused at arrival (before the request was accepted: no request record)."""
    return sum(
        _total(metrics, "slofleet_sidecar_rejects_total", reason=r)
        for r in ("queue_full", "engine_unavailable")
    )
