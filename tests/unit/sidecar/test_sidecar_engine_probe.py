"""The sidecar's engine probe: an engine that says it is unhealthy is down at once; one slow or missed
probe (a busy host) is not, so requests are not refused with 503 for a blip (issue 17, long fuzz run)."""

from __future__ import annotations

import httpx

from slo_sidecar.engine_client import UNREACHABLE_PROBES, EngineStatus, probe

URL = "http://engine"


def engine(answers: list[str]) -> httpx.AsyncClient:
    """A fake engine whose /health answers, in turn: "ok", "down" (503) or "silent" (a read timeout)."""
    health = iter(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            what = next(health)
            if what == "silent":
                raise httpx.ReadTimeout("no answer", request=request)
            return httpx.Response(200 if what == "ok" else 503)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
        return httpx.Response(200, text="vllm:num_requests_running 3\n")

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


async def states(answers: list[str]) -> list[bool]:
    status = EngineStatus()
    seen = []
    async with engine(answers) as client:
        for _ in answers:
            await probe(client, URL, status)
            seen.append(status.healthy)
    return seen


async def test_missed_probes_turn_the_engine_down_only_when_they_repeat() -> None:
    silent = ["silent"] * UNREACHABLE_PROBES
    assert await states(["ok", "silent", "ok", *silent, "ok"]) == [
        True, True, True, *[True] * (UNREACHABLE_PROBES - 1), False, True
    ]  # fmt: skip


async def test_an_engine_that_answers_unhealthy_is_down_at_once() -> None:
    assert await states(["ok", "down", "ok"]) == [True, False, True]


async def test_before_the_first_good_probe_a_silent_engine_is_not_healthy() -> None:
    assert await states(["silent", "ok"]) == [False, True]
