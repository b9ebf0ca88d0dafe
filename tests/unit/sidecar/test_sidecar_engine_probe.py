"""The sidecar's engine probe: a busy engine (probes time out) stays in routing for a while; a dead one
(connection refused, /health failing) leaves at once. Before, one slow probe on a loaded 2-core host
marked the engine down and the router refused every request until the next good probe: rejections the
simulator never makes (issue 14, the demo's live-vs-simulated gap)."""

from __future__ import annotations

import httpx

from slo_sidecar.engine_client import SLOW_DOWN_AFTER_S, EngineStatus, probe


class Engine:
    """An engine as the probe sees it: healthy, timing out, or refusing connections."""

    def __init__(self) -> None:
        self.mode = "ok"

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.mode == "slow":
            raise httpx.ConnectTimeout("timed out", request=request)
        if self.mode == "refused":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
        if request.url.path == "/metrics":
            return httpx.Response(200, text="vllm:num_requests_running 3\n")
        return httpx.Response(200 if self.mode == "ok" else 503)


async def test_a_slow_engine_stays_up_until_it_has_been_silent_too_long() -> None:
    engine, now = Engine(), [100.0]
    status = EngineStatus()
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        await probe(client, "http://e", status, clock=lambda: now[0])
        assert status.healthy and status.running == 3 and status.max_model_len == 4096
        engine.mode = "slow"
        now[0] += SLOW_DOWN_AFTER_S / 2
        await probe(client, "http://e", status, clock=lambda: now[0])
        assert status.healthy and status.slow_probes == 1
        status.last_heard_s = now[0]  # a token streamed: the engine is alive whatever probes see
        now[0] += SLOW_DOWN_AFTER_S - 1
        await probe(client, "http://e", status, clock=lambda: now[0])
        assert status.healthy
        now[0] += 2
        await probe(client, "http://e", status, clock=lambda: now[0])
        assert not status.healthy and "silent" in status.error
        engine.mode = "ok"
        await probe(client, "http://e", status, clock=lambda: now[0])
        assert status.healthy


async def test_a_refused_connection_or_failing_health_is_down_at_once() -> None:
    engine, now = Engine(), [0.0]
    status = EngineStatus()
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        await probe(client, "http://e", status, clock=lambda: now[0])
        engine.mode = "refused"
        await probe(client, "http://e", status, clock=lambda: now[0])
        assert not status.healthy and "unreachable" in status.error
        engine.mode = "ok"
        await probe(client, "http://e", status, clock=lambda: now[0])
        engine.mode = "sick"
        await probe(client, "http://e", status, clock=lambda: now[0])
        assert not status.healthy and "503" in status.error


async def test_a_timeout_before_the_engine_was_ever_heard_is_down() -> None:
    engine = Engine()
    engine.mode = "slow"
    status = EngineStatus()
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        await probe(client, "http://e", status, clock=lambda: 0.0)
    assert not status.healthy
