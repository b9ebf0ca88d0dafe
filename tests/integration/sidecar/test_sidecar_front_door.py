"""The sidecar's front door (issue 17): a bug in generation ends the request with an explicit error (never a
silent wait), hostile vllm_xargs are refused or cleaned at intake, /metrics can live on its own port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.fake_engine import FakeEngine, serve_fake_engine
from slo_sidecar import service
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.runtime import Running, running_sidecar
from slo_sidecar.service import Sidecar

GOLD = SLOTier("gold", RequestKind.LATENCY, PriorityClass("high", 4.0), ttft_s=2.0, tbt_s=0.5)
CONFIG = PolicyConfig(tiers={"gold": GOLD}, default_tier="gold", max_wait_s=20.0)


@pytest.fixture
async def pod() -> AsyncIterator[tuple[FakeEngine, Running]]:
    eng = FakeEngine()
    async with serve_fake_engine(eng) as url:
        sc = Sidecar(knobs=SidecarKnobs(), config=CONFIG, engine_url=url, estimator=FallbackEstimator())
        async with running_sidecar(sc, grpc_port=None, metrics_port=0) as run:
            yield eng, run


def body(eng: FakeEngine, **kw: Any) -> dict[str, Any]:
    return {"model": eng.model, "prompt": "hello", "max_tokens": 3, **kw}


@pytest.mark.parametrize("stream", [False, True])
async def test_an_unexpected_error_in_generation_ends_the_request_at_once(
    pod: tuple[FakeEngine, Running],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    stream: bool,
) -> None:
    eng, run = pod

    async def broken(sc: Any, job: Any, body: Any) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr(service, "run_attempt", broken)
    async with httpx.AsyncClient(timeout=10) as http:
        started = asyncio.get_running_loop().time()
        r = await http.post(run.http_url + "/v1/completions", json=body(eng, stream=stream))
        elapsed = asyncio.get_running_loop().time() - started
    assert elapsed < 5, "the client waited for the maximum wait instead of getting the error"
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert "generation failed unexpectedly" in caplog.text


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_an_unexpected_error_at_intake_is_an_openai_shaped_500(
    pod: tuple[FakeEngine, Running],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    path: str,
) -> None:
    """The completion routes skip Starlette's middleware (a chunk's way out is shorter): a bug before
    the request is queued still ends in the same JSON 500 the catch-all gives every other route."""
    eng, run = pod

    async def broken(*args: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(run.sidecar, "accept", broken)
    msgs = [{"role": "user", "content": "hi"}]
    payload = body(eng, stream=True) if path == "/v1/completions" else {"model": eng.model, "messages": msgs}
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(run.http_url + path, json=payload)
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert "unexpected error on POST " + path in caplog.text
    assert eng.started == 0


async def test_vllm_xargs_must_be_an_object_and_lose_their_slo_keys(pod: tuple[FakeEngine, Running]) -> None:
    eng, run = pod
    async with httpx.AsyncClient(timeout=10) as http:
        for bad in ([1, 2], "x", 3):
            r = await http.post(run.http_url + "/v1/completions", json=body(eng, vllm_xargs=bad))
            assert r.status_code == 400 and r.json()["error"]["param"] == "vllm_xargs"
        r = await http.post(
            run.http_url + "/v1/completions",
            json=body(eng, vllm_xargs={"slo_priority_weight": 99, "mine": 1}, priority=-5),
        )
        assert r.status_code == 200, r.text
        sent = eng.bodies[-1]
        assert sent.get("vllm_xargs") == {"mine": 1} and "priority" not in sent


async def test_metrics_on_their_own_port(pod: tuple[FakeEngine, Running]) -> None:
    _, run = pod
    async with httpx.AsyncClient(timeout=10) as http:
        public = await http.get(run.http_url + "/metrics")
        assert public.status_code == 404 and public.json()["error"]["code"] == "not_found"
        private = await http.get(run.metrics_url + "/metrics")
        assert private.status_code == 200 and "slofleet_sidecar" in private.text
