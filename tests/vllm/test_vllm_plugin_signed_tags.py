"""A caller that skips the router cannot give itself a tier in a real ``vllm serve`` with the plugin.

vLLM runs with a tag key (``SLOFLEET_TAG_KEY_FILE``, as the operator mounts it from the chart's Secret)
and the EDF policy, one sequence slot, and requests queued in a paused engine (see
``test_vllm_plugin_http``). A request with forged SLO tags (the tightest deadline, a made-up
signature) and one with none are scheduled best-effort, after the properly signed ones, and counted
on the plugin's metrics port; the signed ones keep their deadline order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

import httpx
import openai
from test_vllm_plugin_http import VLLMServer, complete, free_port, start_vllm, stop, wait_for, xargs

from slo_core.wire.signing import sign

pytestmark = pytest.mark.vllm

KEY = "k" * 32


def queue_in_order(server: VLLMServer, sends: dict[str, Callable[[], int]]) -> dict[str, str]:
    """Queue the requests in a paused engine in the order given, then resume it.

    An unsigned request is known to the engine only by vLLM's own id, so each one is sent once the
    previous has reached the queue (one more ``arrive`` event) and the arrivals map vLLM's ids to the
    names here. Returns ``{vllm request id: name}``.
    """
    before = len(server.events("arrive"))
    httpx.post(f"{server.url}/pause", params={"mode": "keep"}, timeout=30).raise_for_status()
    try:
        with ThreadPoolExecutor(max_workers=len(sends)) as pool:
            futures = []
            for n, send in enumerate(sends.values(), start=1):
                futures.append(pool.submit(send))
                wait_for(lambda n=n: len(server.events("arrive")) - before >= n, f"request {n} to queue")
            ids = [e["request_id"] for e in server.events("arrive")[before:]]
            assert not server.events("admit"), "a paused engine admits nothing"
            httpx.post(f"{server.url}/resume", timeout=30).raise_for_status()
            assert [f.result(timeout=120) for f in futures] == [4] * len(sends)
    finally:
        httpx.post(f"{server.url}/resume", timeout=30)
    return dict(zip(ids, sends, strict=True))


@pytest.fixture(scope="module")
def keyed_server(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VLLMServer, int]]:
    workdir = tmp_path_factory.mktemp("vllm-signed")
    key_file = workdir / "keys"
    key_file.write_text(KEY + "\n")
    metrics_port = free_port()
    proc, server, _ = start_vllm(
        tiny_model,
        workdir,
        SLOFLEET_POLICY="edf",
        SLOFLEET_TAG_KEY_FILE=str(key_file),
        SLOFLEET_METRICS_PORT=str(metrics_port),
    )
    try:
        yield server, metrics_port
    finally:
        stop(proc)


def test_forged_and_missing_tags_are_best_effort_and_signed_ones_keep_their_priority(
    keyed_server: tuple[VLLMServer, int],
) -> None:
    server, metrics_port = keyed_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)

    def send(extra: dict[str, Any]) -> Callable[[], int]:
        return lambda: complete(client, 4, extra)

    forged = {**xargs(1.0, "forged"), "slo_sig": f"{int(time.time())}.{'0' * 64}"}
    sends = {
        "forged": send({"vllm_xargs": forged}),  # the tightest deadline, if it were believed
        "none": send({}),
        "signed-d40": send({"vllm_xargs": sign(xargs(40.0, "signed-d40"), KEY.encode(), time.time())}),
        "signed-d20": send({"vllm_xargs": sign(xargs(20.0, "signed-d20"), KEY.encode(), time.time())}),
    }
    names = queue_in_order(server, sends)
    admitted = [names[e["request_id"]] for e in server.events("admit")]
    # EDF on what the plugin believes: the signed deadlines first, then best-effort (120 s) by arrival
    assert admitted == ["signed-d20", "signed-d40", "forged", "none"]
    assert not server.events("degraded")
    metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    assert 'slofleet_plugin_unsigned_tags_total{reason="forged signature"} 1.0' in metrics
