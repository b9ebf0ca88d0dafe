"""Engine mode in the router: endpoints name their mode (file and pod annotation), and the body an engine
gets carries the request's SLO as tags signed with the router's key (verified by the engine's rule)."""

from __future__ import annotations

import json
import time

import pytest

from slo_core.policies.base import RequestView
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.keyring import KeyRing
from slo_core.wire.tags import trusted_tags
from slo_router.discovery import parse_endpoints
from slo_router.enginetags import tagged_body
from slo_router.kube import pod_endpoint

KEY = b"router-key-0123456789abcdef"


def _view(deadline_at: float | None) -> RequestView:
    return RequestView(
        request_id="rtr-1",
        slo=SLOTargets(RequestKind.DEADLINE, deadline_s=30.0, priority_weight=2.0),
        arrival_s=100.0,
        prompt_tokens=10,
        max_tokens=64,
        deadline_at_s=deadline_at,
        tenant="acme",
        program_id="prog-7",
        stage=2,
    )


def test_the_engine_body_carries_signed_tags_with_a_unix_deadline() -> None:
    forward = {"model": "m", "prompt": "hi", "stream": True}
    raw = tagged_body(
        forward, _view(130.0), "batch", lambda: KeyRing(KEY), clock=lambda: 100.0, wall_clock=lambda: 1.7e9,
        stages=4,
    )  # fmt: skip
    body = json.loads(raw)
    assert {k: body[k] for k in forward} == forward
    tags, why = trusted_tags(body["vllm_xargs"], [KEY], 1.7e9 + 5)
    assert why is None and tags is not None
    assert (tags.tier, tags.request_key, tags.tenant, tags.program_id, tags.stage, tags.stages) == (
        "batch", "rtr-1", "acme", "prog-7", 2, 4
    )  # fmt: skip
    assert tags.targets.deadline_s == 30.0 and tags.targets.priority_weight == 2.0
    assert tags.deadline_at_s == pytest.approx(1.7e9 + 30.0)
    # the engine's rule: another key, or tampered tags, give best effort
    assert trusted_tags(body["vllm_xargs"], [b"another-key-0123456789"], 1.7e9)[0] is None
    tampered = {**body["vllm_xargs"], "slo_priority_weight": 100.0}
    assert trusted_tags(tampered, [KEY], 1.7e9)[1] == "forged signature"
    restaged = {**body["vllm_xargs"], "slo_stages": 1}  # the stage count is signed like the rest
    assert trusted_tags(restaged, [KEY], 1.7e9)[1] == "forged signature"


def test_without_a_key_the_tags_go_unsigned() -> None:
    body = json.loads(tagged_body({"model": "m"}, _view(None), "t", None, clock=lambda: 0.0))
    assert "slo_sig" not in body["vllm_xargs"] and body["vllm_xargs"]["slo_tier"] == "t"
    assert trusted_tags(body["vllm_xargs"], [KEY], 0.0) == (None, "unsigned")


def test_endpoints_file_and_pod_annotations_name_the_mode() -> None:
    doc = {
        "endpoints": [{"id": "a", "url": "http://e:8001", "mode": "engine"}, {"id": "b", "url": "http://s:1"}]
    }
    a, b = parse_endpoints(doc, "f")
    assert (a.mode, b.mode) == ("engine", "proxy")
    with pytest.raises(ValueError, match="mode"):
        parse_endpoints({"endpoints": [{"url": "http://e:1", "mode": "direct"}]}, "f")
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "annotations": {
                "slofleet.io/http-port": "8001",
                "slofleet.io/grpc-port": "9100",
                "slofleet.io/mode": "engine",
            },
        },
        "status": {"podIP": "10.0.0.5", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    spec = pod_endpoint(pod)
    assert spec is not None and spec.mode == "engine" and spec.http_url == "http://10.0.0.5:8001"
    del pod["metadata"]["annotations"]["slofleet.io/mode"]  # a pod rendered before engine mode
    old = pod_endpoint(pod)
    assert old is not None and old.mode == "proxy"


async def test_the_endpoint_picker_hands_an_engine_mode_pod_the_signed_body() -> None:
    from slo_core.slo import PriorityClass, SLOTier
    from slo_router.app import build_state
    from slo_router.config import RouterConfig
    from slo_router.endpoints import EndpointSpec, EndpointState
    from slo_router.extproc.pick import pick
    from slo_router.tenants import KeyStore, Tenant

    chat = SLOTier("chat", RequestKind.LATENCY, PriorityClass("high", 4.0), ttft_s=5.0, tbt_s=1.0)
    config = RouterConfig(
        tiers={"chat": chat}, default_tier="chat", tenants={"t": Tenant("t", ("chat",), "chat")}
    )
    ep = EndpointState(EndpointSpec("p", "http://10.0.0.5:8001", models=("m",), mode="engine"))
    state = build_state(config, KeyStore({"sk": "t"}), {"p": ep})
    state.tag_keys = lambda: KeyRing(KEY)
    body = json.dumps({"model": "m", "prompt": "hi", "vllm_xargs": {"slo_kind": "latency"}}).encode()
    picked = await pick(state, "POST", "/v1/completions", {"authorization": "Bearer sk"}, body)
    assert picked.address == "10.0.0.5:8001"
    sent = json.loads(picked.body)
    tags, why = trusted_tags(sent["vllm_xargs"], [KEY], time.time())
    assert why is None and tags is not None and tags.tier == "chat" and tags.tenant == "t"


@pytest.mark.parametrize("encoded", [b"{}", b' { "model" : "m" } \n', b'{"model":"m","x":[1,{"y":"}"}]}'])
def test_tags_are_appended_to_any_encoded_object_as_its_last_member(encoded: bytes) -> None:
    from slo_router.enginetags import with_tags

    raw = with_tags(
        encoded, _view(None), "t", lambda: KeyRing(KEY), clock=lambda: 0.0, wall_clock=lambda: 1.7e9
    )
    body = json.loads(raw)
    assert list(body)[-1] == "vllm_xargs" and {
        k: v for k, v in body.items() if k != "vllm_xargs"
    } == json.loads(encoded)
    assert trusted_tags(body["vllm_xargs"], [KEY], 1.7e9)[1] is None
    with pytest.raises(ValueError, match="not a JSON object"):
        with_tags(b"[1]", _view(None), "t", None, clock=lambda: 0.0)
