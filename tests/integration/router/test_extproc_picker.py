"""The endpoint picker over gRPC, with a test client playing Envoy's side of a recorded stream.

The recording (tests/data/extproc/) is what Envoy 1.40 sent the picker for one chat completion in
full-duplex streamed mode (test_extproc_envoy.py writes it). Replayed here against pods whose
addresses are known, so the answers can be checked field by field.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from envoyside.playback import FirstReady, load_recording, play, router_state
from google.protobuf import struct_pb2

from slo_lab.loopback_pods import LoopbackPods, close_all
from slo_router.app import create_app
from slo_router.endpoints import EndpointState
from slo_router.extproc import messages as m
from slo_router.extproc.server import EndpointPicker, server_options

RECORDING = "envoy-1.40-chat-full-duplex.json"
PODS = {"a": "http://10.0.0.1:8100", "b": "http://10.0.0.2:8100"}


@pytest.fixture(autouse=True)
async def _stop_loopback_pods() -> AsyncIterator[None]:
    yield
    await close_all()


async def serve(state, body_mode="full-duplex") -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(options=server_options())
    pb_grpc.add_ExternalProcessorServicer_to_server(EndpointPicker(state, body_mode=body_mode), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def picker() -> AsyncIterator[tuple[object, str]]:
    state = router_state(PODS)
    server, target = await serve(state)
    yield state, target
    await server.stop(grace=0)


def set_headers(common: pb.CommonResponse) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def with_header(requests: list[pb.ProcessingRequest], key: str, value: str) -> list[pb.ProcessingRequest]:
    out = [pb.ProcessingRequest.FromString(r.SerializeToString()) for r in requests]
    hs = out[0].request_headers.headers.headers
    for h in hs:
        if h.key == key:
            h.raw_value = value.encode()
            break
    else:
        hs.add(key=key, raw_value=value.encode())
    return out


async def test_recorded_envoy_stream_gets_the_destination_and_the_routers_headers(picker) -> None:
    state, target = picker
    answers = await play(target, load_recording(RECORDING))
    kinds = [a.WhichOneof("response") for a in answers]
    assert kinds == ["request_headers", "request_body", "response_headers", "response_body", "response_body"]
    head = answers[0]
    hdrs = set_headers(head.request_headers.response)
    assert hdrs[m.DESTINATION_HEADER] == "10.0.0.1:8100"  # FirstReady's pick: pod a
    lb = head.dynamic_metadata.fields[m.DESTINATION_NAMESPACE].struct_value.fields
    assert lb[m.DESTINATION_HEADER].string_value == hdrs[m.DESTINATION_HEADER]  # header and metadata agree
    # the recorded request used tenant "free"'s key and asked for chat-gold: bound to free's own tier
    assert hdrs["x-slo-tier"] == "batch" and hdrs["x-slofleet-tenant"] == "free"
    assert "authorization" in head.request_headers.response.header_mutation.remove_headers
    assert head.request_headers.response.clear_route_cache
    body = answers[1].request_body.response.body_mutation.streamed_response
    assert body.end_of_stream and "slo" not in json.loads(body.body)
    assert hdrs["content-length"] == str(len(body.body))
    # the client's answer says which tier served it, as the router's own front door does
    assert set_headers(answers[2].response_headers.response) == {"x-slo-tier": "batch"}
    recorded_chunk = load_recording(RECORDING)[4].response_body.body
    assert answers[3].response_body.response.body_mutation.streamed_response.body == recorded_chunk
    assert not state.endpoints["a"].sent  # released at the response's end


async def test_tier_follows_the_key_not_the_request(picker) -> None:
    state, target = picker
    recorded = load_recording(RECORDING)
    acme = with_header(recorded, "authorization", "Bearer k-acme")
    answers = await play(target, acme)
    assert set_headers(answers[0].request_headers.response)["x-slo-tier"] == "chat-gold"
    assert state.policy.seen[-1].slo.priority_weight == 3.0
    unknown = await play(target, with_header(recorded, "authorization", "Bearer stolen"))
    assert [a.WhichOneof("response") for a in unknown] == ["immediate_response"]
    imm = unknown[0].immediate_response
    assert imm.status.code == 401 and json.loads(imm.body)["error"]["code"] == "invalid_api_key"


async def test_rate_limit_is_an_explicit_429_with_retry_after(picker) -> None:
    _state, target = picker
    recorded = load_recording(RECORDING)  # tenant "free": 1 request/s
    first = await play(target, recorded)
    second = await play(target, recorded)
    assert first[0].WhichOneof("response") == "request_headers"
    imm = second[0].immediate_response
    assert imm.status.code == 429
    headers = {h.header.key: h.header.raw_value.decode() for h in imm.headers.set_headers}
    assert int(headers["retry-after"]) >= 1 and json.loads(imm.body)["error"]["type"] == "rate_limit_error"


async def test_no_usable_pod_and_empty_subset_are_503(picker) -> None:
    state, target = picker
    acme = with_header(load_recording(RECORDING), "authorization", "Bearer k-acme")
    hinted = [pb.ProcessingRequest.FromString(r.SerializeToString()) for r in acme]
    hint = struct_pb2.Struct()
    hint.update({m.SUBSET_KEY: ["10.0.0.2:8100"]})
    hinted[0].metadata_context.filter_metadata[m.SUBSET_NAMESPACE].CopyFrom(hint)
    only_b = await play(target, hinted)
    assert set_headers(only_b[0].request_headers.response)[m.DESTINATION_HEADER] == "10.0.0.2:8100"
    hint.update({m.SUBSET_KEY: []})
    hinted[0].metadata_context.filter_metadata[m.SUBSET_NAMESPACE].CopyFrom(hint)
    none_allowed = await play(target, hinted)
    assert none_allowed[0].immediate_response.status.code == 503
    for ep in state.endpoints.values():
        ep.ready = False
    down = await play(target, acme)
    assert down[0].immediate_response.status.code == 503
    assert json.loads(down[0].immediate_response.body)["error"]["code"] == "no_capacity"


async def test_malformed_and_unrouted_requests_are_answered_not_hung(picker) -> None:
    _state, target = picker
    recorded = load_recording(RECORDING)
    bad = [pb.ProcessingRequest.FromString(r.SerializeToString()) for r in recorded[:3]]
    bad[1].request_body.body = b"{not json"
    assert (await play(target, bad))[0].immediate_response.status.code == 400
    get = with_header(recorded[:1], ":method", "GET")
    get[0].request_headers.end_of_stream = True
    assert (await play(target, get))[0].immediate_response.status.code == 404
    chunk = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"x" * (3 << 20)))
    huge = [recorded[0], chunk, chunk, chunk]
    assert (await play(target, huge))[0].immediate_response.status.code == 413


async def test_buffered_mode_answers_headers_then_routes_on_the_body() -> None:
    state = router_state(PODS)
    server, target = await serve(state, body_mode="buffered")
    try:
        recorded = load_recording(RECORDING)
        whole = recorded[1].request_body.body
        msgs = [recorded[0], pb.ProcessingRequest(request_body=pb.HttpBody(body=whole, end_of_stream=True))]
        answers = await play(target, msgs)
    finally:
        await server.stop(grace=0)
    assert [a.WhichOneof("response") for a in answers] == ["request_headers", "request_body"]
    assert not answers[0].request_headers.response.header_mutation.set_headers
    routed = answers[1].request_body.response
    assert set_headers(routed)[m.DESTINATION_HEADER] == "10.0.0.1:8100"
    assert "slo" not in json.loads(routed.body_mutation.body)
    assert answers[1].dynamic_metadata.fields[m.DESTINATION_NAMESPACE].struct_value.fields


async def test_picker_and_router_see_the_same_request_and_choose_the_same_pod() -> None:
    """One pipeline: the router's HTTP path and the picker make the same RouteRequest and choice."""
    router_policy, picker_policy = FirstReady(), FirstReady()
    router = router_state(PODS, policy=router_policy)
    chosen: list[str] = []

    def upstream(req: httpx.Request) -> httpx.Response:
        chosen.append(str(req.url.netloc.decode()))
        return httpx.Response(
            200, json={"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
        )

    router.client = LoopbackPods(upstream).session()
    recorded = load_recording(RECORDING)
    body = json.loads(recorded[1].request_body.body)
    app = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(router)), base_url="http://r")
    r = await app.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer k-free"})
    assert r.status_code == 200
    state = router_state(PODS, policy=picker_policy)
    server, target = await serve(state)
    try:
        answers = await play(target, recorded)
    finally:
        await server.stop(grace=0)
    assert set_headers(answers[0].request_headers.response)[m.DESTINATION_HEADER] == chosen[0]
    a, b = router_policy.seen[0], picker_policy.seen[0]
    ignore = {"request_id": "", "arrival_s": 0.0, "deadline_at_s": None}
    assert dataclasses.replace(a, **ignore) == dataclasses.replace(b, **ignore)


async def test_health_services_follow_policy_and_pods() -> None:
    import asyncio

    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_health.v1.health import aio as health_aio

    from slo_router.extproc.server import follow_health

    state = router_state(PODS)
    server = grpc.aio.server()
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    task = asyncio.create_task(follow_health(state, health, period_s=0.05))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)

            async def status(name: str) -> int:
                await asyncio.sleep(0.2)
                return (await stub.Check(health_pb2.HealthCheckRequest(service=name))).status

            serving, not_serving = (
                health_pb2.HealthCheckResponse.SERVING,
                health_pb2.HealthCheckResponse.NOT_SERVING,
            )
            assert await status("readiness") == serving
            for ep in state.endpoints.values():
                ep.ready = False
            assert await status("envoy.service.ext_proc.v3.ExternalProcessor") == not_serving
            assert await status("liveness") == serving
    finally:
        task.cancel()
        await server.stop(grace=0)


def for_model(requests: list[pb.ProcessingRequest], model: str) -> list[pb.ProcessingRequest]:
    """The recording with another model named in its body (one letter: the length is unchanged)."""
    out = [pb.ProcessingRequest.FromString(r.SerializeToString()) for r in requests]
    body = json.loads(out[1].request_body.body)
    out[1].request_body.body = json.dumps({**body, "model": model}, separators=(",", ":")).encode()
    return out


async def test_the_picker_picks_only_pods_of_the_requested_model() -> None:
    """Two models behind one picker: pod a serves n, pod b serves m. FirstReady would take a for any
    request; the model filter leaves it only the pods of the model asked for, and an unknown model
    is answered 404 model_not_found."""
    state = router_state(PODS)
    a = state.endpoints["a"]
    state.endpoints["a"] = EndpointState(dataclasses.replace(a.spec, models=("n",)))
    server, target = await serve(state)
    try:
        recorded = with_header(load_recording(RECORDING), "authorization", "Bearer k-acme")
        picks = {}
        for model in ("m", "n", "m", "n"):
            answers = await play(target, for_model(recorded, model))
            picks.setdefault(model, set()).add(
                set_headers(answers[0].request_headers.response)[m.DESTINATION_HEADER]
            )
        assert picks == {"m": {"10.0.0.2:8100"}, "n": {"10.0.0.1:8100"}}
        unknown = await play(target, for_model(recorded, "z"))
        assert unknown[0].immediate_response.status.code == 404
        assert json.loads(unknown[0].immediate_response.body)["error"]["code"] == "model_not_found"
    finally:
        await server.stop(grace=0)
