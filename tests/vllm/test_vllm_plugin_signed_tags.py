"""A caller that skips the router cannot give itself a tier in a real ``vllm serve`` with the plugin.

vLLM runs with a tag key (``SLOFLEET_TAG_KEY_FILE``, as the operator mounts it from the chart's Secret)
and the EDF policy, one sequence slot, and requests queued in a paused engine (see
``test_vllm_plugin_http``). A request with forged SLO tags (the tightest deadline, a made-up
signature) and one with none are scheduled best-effort, after the properly signed ones, and counted
on the plugin's metrics port; the signed ones keep their deadline order. With the key on both sides
(the sidecar in front signing tags and requiring tokens on its gRPC services), the sidecar's requests
keep their order and the plugin's analyzer calls are accepted.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

import httpx
import openai
from vllm_servers import (
    MAIN_PYTHON,
    PROMPT,
    SIDECAR_POLICY,
    VLLMServer,
    complete,
    free_port,
    start_vllm,
    stop,
    wait_for,
    xargs,
)

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
    proc, server, log = start_vllm(
        tiny_model,
        workdir,
        SLOFLEET_POLICY="edf",
        SLOFLEET_TAG_KEY_FILE=str(key_file),
        SLOFLEET_METRICS_PORT=str(metrics_port),
    )
    try:
        # the plugin says at start, in vLLM's own log, what it schedules by and that tags must be signed
        assert "slofleet scheduler: policy=edf analyzer=none tags=signed" in log.read_text()
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


@pytest.fixture(scope="module")
def keyed_fleet(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VLLMServer, str]]:
    """The sidecar in front (engine mode) and vLLM, both with the tag key, as the operator deploys them:
    the sidecar signs the tags and requires a token on its gRPC services; the plugin verifies the tags
    and brings a token to the analyzer."""
    workdir = tmp_path_factory.mktemp("vllm-keyed-fleet")
    key_file = workdir / "keys"
    key_file.write_text(f"rotated-at={int(time.time()) - 3600}\n{KEY}\n{'p' * 32}\n")
    policy = workdir / "policy.yaml"
    policy.write_text(SIDECAR_POLICY)
    engine_port, grpc_port, port = free_port(), free_port(), free_port()
    cmd = [
        str(MAIN_PYTHON), "-m", "slo_core.cli", "sidecar", "--host", "127.0.0.1", "--port", str(port),
        "--engine-url", f"http://127.0.0.1:{engine_port}", "--policy-file", str(policy),
        "--grpc-port", str(grpc_port), "--mode", "engine", "--state-dir", str(workdir / "state"),
        "--tag-key-file", str(key_file),
    ]  # fmt: skip
    if not MAIN_PYTHON.exists():
        pytest.skip("the main virtual environment (.venv) runs the sidecar")
    with (workdir / "sidecar.log").open("wb") as log:
        sidecar = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc, server, _ = start_vllm(
            tiny_model,
            workdir,
            engine_port,
            SLOFLEET_POLICY="edf",
            SLOFLEET_ANALYZER=f"127.0.0.1:{grpc_port}",
            SLOFLEET_STALE_AFTER_S="120",
            SLOFLEET_TAG_KEY_FILE=str(key_file),
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while httpx.get(f"{url}/ready", timeout=2).status_code != 200:
                assert time.monotonic() < deadline, (workdir / "sidecar.log").read_text()[-3000:]
                time.sleep(0.3)
            yield server, url
        finally:
            stop(proc)
    finally:
        stop(sidecar)


def test_through_the_keyed_sidecar_tags_verify_and_the_plugins_analyzer_calls_are_accepted(
    keyed_fleet: tuple[VLLMServer, str],
) -> None:
    server, sidecar_url = keyed_fleet
    client = openai.OpenAI(base_url=f"{sidecar_url}/v1", api_key="unused", max_retries=0)

    def send(deadline_s: float, key: str) -> Callable[[], int]:
        headers = {"x-slo-tier": "batch", "x-slo-deadline-s": str(deadline_s), "x-request-id": key}
        return lambda: complete_with_headers(client, headers)

    sends = {"k-d40": send(40.0, "k-d40"), "k-d10": send(10.0, "k-d10"), "k-d30": send(30.0, "k-d30")}
    names = queue_in_order(server, sends)
    admitted = [names[e["request_id"]] for e in server.events("admit")]
    assert admitted == ["k-d10", "k-d30", "k-d40"], "signed by the sidecar: the plugin believed them"
    assert not server.events("degraded"), "the plugin's analyzer calls carried an accepted token"
    metrics = httpx.get(f"{sidecar_url}/metrics", timeout=5).text
    assert "slofleet_sidecar_grpc_unauthenticated_total{" not in metrics, "no call was refused"


def complete_with_headers(client: openai.OpenAI, headers: dict[str, str]) -> int:
    out = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=4, extra_body={"ignore_eos": True}, extra_headers=headers
    )
    assert out.usage is not None
    return out.usage.completion_tokens
