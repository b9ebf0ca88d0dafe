"""The scheduler plugin inside a real ``vllm serve`` (CPU build), driven over HTTP by the ``openai`` client.

A vLLM OpenAI server is started with ``--scheduler-cls slo_vllm_plugin.scheduler.SLOScheduler``
and one sequence slot, so queued requests are admitted strictly in the order the plugin gives; the
requests are queued in a paused engine (vLLM's dev-mode ``/pause?mode=keep``) and released together. The
engine-side trace (``SLOFLEET_ENGINE_TRACE``) shows what the engine did. The slofleet sidecar runs in
front of it in engine mode (from the project's main virtual environment, as in a pod where the sidecar
is its own container): it tags each request's SLO into ``vllm_xargs`` and serves the plugin's bounds
over gRPC.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import httpx
import openai
from vllm_servers import (
    PROMPT,
    Fleet,
    VLLMServer,
    complete,
    free_port,
    queue_while_paused,
    start_sidecar,
    start_vllm,
    stop,
    xargs,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def edf_fleet(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("vllm-edf")
    engine_port, grpc_port = free_port(), free_port()
    sidecar, sidecar_url = start_sidecar(workdir, engine_port, grpc_port)
    try:
        proc, server, _ = start_vllm(
            tiny_model,
            workdir,
            engine_port,
            SLOFLEET_POLICY="edf",
            SLOFLEET_ANALYZER=f"127.0.0.1:{grpc_port}",
            # a loaded CI machine can delay the sidecar's answers by seconds; keep ordering deterministic
            SLOFLEET_STALE_AFTER_S="120",
        )
        try:
            deadline = time.monotonic() + 60
            while httpx.get(f"{sidecar_url}/ready", timeout=2).status_code != 200:
                assert time.monotonic() < deadline, (workdir / "sidecar.log").read_text()[-3000:]
                time.sleep(0.3)
            yield Fleet(server, sidecar_url)
        finally:
            stop(proc)
    finally:
        stop(sidecar)


@pytest.fixture(scope="module")
def edf_server(edf_fleet: Fleet) -> VLLMServer:
    return edf_fleet.server


def test_served_requests_are_admitted_in_the_policys_order(edf_server: VLLMServer) -> None:
    client = openai.OpenAI(base_url=f"{edf_server.url}/v1", api_key="unused", max_retries=0)
    deadlines = {"d40": 40.0, "d10": 10.0, "d30": 30.0, "d20": 20.0}
    lengths = queue_while_paused(
        edf_server, lambda key, dl: complete(client, 4, {"vllm_xargs": xargs(dl, key)}), deadlines
    )
    assert lengths == [4, 4, 4, 4]
    assert edf_server.events("start")[0]["policy"] == "edf"
    assert not edf_server.events("degraded")
    admitted = [e["key"] for e in edf_server.events("admit")]
    assert admitted == ["d10", "d20", "d30", "d40"]  # arrival order was d40 d10 d30 d20
    # the engine applied what the policy decided once all four were queued
    decided = [e["admit_keys"] for e in edf_server.events("decide") if len(e["admit"]) == 4]
    assert decided and decided[-1] == ["d10", "d20", "d30", "d40"]
    assert not edf_server.events("degraded")


@pytest.fixture(scope="module")
def degraded_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    proc, server, _ = start_vllm(
        tiny_model,
        tmp_path_factory.mktemp("vllm-degraded"),
        SLOFLEET_POLICY="edf",
        SLOFLEET_ANALYZER="127.0.0.1:9",
        SLOFLEET_STALE_AFTER_S="0.5",
    )
    try:
        yield server
    finally:
        stop(proc)


def test_unreachable_sidecar_degrades_to_stock_order_without_failing_requests(
    degraded_server: VLLMServer,
) -> None:
    client = openai.OpenAI(base_url=f"{degraded_server.url}/v1", api_key="unused", max_retries=0)
    deadlines = {"d40": 40.0, "d10": 10.0, "d30": 30.0}
    lengths = queue_while_paused(
        degraded_server, lambda key, dl: complete(client, 4, {"vllm_xargs": xargs(dl, key)}), deadlines
    )
    assert lengths == [4, 4, 4]
    assert degraded_server.events("degraded")
    # stock vLLM order: first come, first served
    assert [e["key"] for e in degraded_server.events("admit")] == ["d40", "d10", "d30"]
    assert not degraded_server.events("decide"), "with the analyzer unreachable the policy is not consulted"
    metrics = httpx.get(f"{degraded_server.url}/metrics", timeout=5).text
    assert "vllm:request_success_total" in metrics


def test_sidecar_in_front_tags_each_request_and_the_engine_orders_by_its_slo(edf_fleet: Fleet) -> None:
    server = edf_fleet.server
    client = openai.OpenAI(base_url=f"{edf_fleet.sidecar_url}/v1", api_key="unused", max_retries=0)
    before = len(server.events("admit"))

    def send(max_tokens: int, deadline_s: float, key: str) -> int:
        out = client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=max_tokens,
            extra_body={"ignore_eos": True},
            # the sidecar keeps a caller's request id (as it keeps the router's) as the request's key
            extra_headers={"x-slo-tier": "batch", "x-slo-deadline-s": str(deadline_s), "x-request-id": key},
        )
        assert out.usage is not None
        return out.usage.completion_tokens

    deadlines = {"sc-d40": 40.0, "sc-d10": 10.0, "sc-d30": 30.0, "sc-d20": 20.0}
    lengths = queue_while_paused(server, lambda key, dl: send(4, dl, key), deadlines)
    assert lengths == [4, 4, 4, 4]
    # the engine knows each request by the sidecar's key (slo_request_key) and admits by deadline
    admitted = [e["key"] for e in server.events("admit")[before:]]
    assert admitted == ["sc-d10", "sc-d20", "sc-d30", "sc-d40"]
    assert not server.events("degraded"), "the plugin reached the sidecar's analyzer"
    metrics = httpx.get(f"{edf_fleet.sidecar_url}/metrics", timeout=5).text
    assert 'tier="batch"' in metrics
