"""Hostile input at both front doors (router and sidecar, engine-sim behind them) over loopback (issue 17).

Hand-written cases (a 64 MB body, max_tokens 1e9 and 10**400, unknown model, deep JSON without a key,
an infinite deadline, a non-ASCII header, ...) and hypothesis-generated mutations of a valid body. Every
answer must be below 500 and, when an error, an OpenAI error object; no connection may be dropped;
a valid request must still succeed afterwards, and the process's memory must stay bounded.
"""

from __future__ import annotations

import resource
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from front_doors import AUTH, Front, assert_still_serves, check_answer, front_doors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slo_lab.fuzzcases import chunks, hostile_cases, valid_body


@pytest.fixture(scope="module")
def front() -> Iterator[Front]:
    with front_doors() as f:
        yield f


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("door", ["router", "sidecar"])
def test_hand_written_hostile_requests_get_clear_4xx(front: Front, door: str) -> None:
    url = front.router if door == "router" else front.sidecar
    with httpx.Client(timeout=30) as http:
        assert_still_serves(http, url, front.model, AUTH)
        before = rss_mb()
        for name, kwargs in hostile_cases(front.model):
            headers = {**AUTH, "content-type": "application/json", **kwargs.pop("headers", {})}
            try:
                resp = http.post(url + "/v1/chat/completions", headers=headers, **kwargs)
            except httpx.TransportError as exc:
                pytest.fail(f"{door}: {name}: connection dropped ({exc!r})")
            check_answer(resp, f"{door}: {name}")
            assert_still_serves(http, url, front.model, AUTH)
        assert rss_mb() - before < 150, "memory grew while refusing hostile requests"


def test_router_refuses_unauthenticated_requests_without_reading_the_body(front: Front) -> None:
    with httpx.Client(timeout=30) as http:
        for headers in ({}, {"authorization": "Bearer wrong"}):
            resp = http.post(front.router + "/v1/chat/completions", headers=headers, content=b"[" * 1_000_000)
            assert resp.status_code == 401, resp.text
            check_answer(resp, "unauthenticated")
        resp = http.post(front.router + "/v1/chat/completions", headers=AUTH, content=chunks(64 << 20))
        assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("door", ["router", "sidecar"])
def test_unknown_routes_and_methods_answer_openai_errors(front: Front, door: str) -> None:
    url = front.router if door == "router" else front.sidecar
    with httpx.Client(timeout=10) as http:
        for method, path, status in [
            ("GET", "/v1/nope", 404),
            ("GET", "/v1/chat/completions", 405),
            ("DELETE", "/v1/models", 405),
        ]:
            resp = http.request(method, url + path, headers=AUTH)
            assert resp.status_code == status
            check_answer(resp, f"{door} {method} {path}")


def test_unknown_model_is_404_model_not_found_without_retry_after(front: Front) -> None:
    with httpx.Client(timeout=10) as http:
        resp = http.post(front.router + "/v1/chat/completions", headers=AUTH, json=valid_body("gpt-nope"))
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    assert "retry-after" not in resp.headers


def test_max_tokens_is_bounded_by_the_models_context_and_defaults_to_what_is_left(front: Front) -> None:
    with httpx.Client(timeout=60) as http:
        too_many = {**valid_body(front.model), "max_tokens": 10**6}
        for url in (front.router, front.sidecar):
            resp = http.post(url + "/v1/chat/completions", headers=AUTH, json=too_many)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["code"] == "context_length_exceeded"
        body = {**valid_body(front.model), "ignore_eos": True}
        del body["max_tokens"]
        resp = http.post(front.router + "/v1/chat/completions", headers=AUTH, json=body)
        assert resp.status_code == 200, resp.text
        usage = resp.json()["usage"]
        # without max_tokens the engine generates until the context is full (vLLM), never just 256
        assert usage["completion_tokens"] > 256
        models = http.get(front.sidecar + "/v1/models").json()["data"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == models[0]["max_model_len"]


_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_fields = st.sampled_from(
    ["model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "n", "slo",
     "deadline", "target_ttft", "vllm_xargs", "priority", "temperature", "tools", "tool_choice", "prompt"]
)  # fmt: skip
_headers = st.dictionaries(
    st.sampled_from(
        ["x-slo-tier", "x-slo-ttft-s", "x-slo-deadline-s", "x-slo-stage", "x-request-id", "x-slo-x"]
    ),
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12),
    max_size=3,
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(mutations=st.dictionaries(_fields, _json, max_size=4), headers=_headers, door=st.sampled_from([0, 1]))
def test_generated_mutations_of_a_valid_body(
    front: Front, mutations: dict[str, Any], headers: dict[str, str], door: int
) -> None:
    url = (front.router, front.sidecar)[door]
    body = {**valid_body(front.model), **mutations}
    with httpx.Client(timeout=30) as http:
        try:
            resp = http.post(url + "/v1/chat/completions", json=body, headers={**AUTH, **headers})
        except httpx.TransportError as exc:
            pytest.fail(f"connection dropped on {body!r}: {exc!r}")
        check_answer(resp, repr(body)[:300])
