"""Schemathesis against the OpenAPI description each front door serves (router and sidecar, engine-sim
behind them, over loopback; issue 17).

Cases are generated from the served description itself, valid ones and ones that break it, with a fixed
budget and a derandomized seed. Every answer must be below 500, what the description says (status,
content type, an OpenAI error object or a valid success), nothing the description forbids may be
accepted, no connection may drop, and the door must still serve a valid request afterwards. A separate
test proves the description states the limits the door enforces.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from front_doors import AUTH, TIERS, Front, assert_still_serves, check_answer, front_doors
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from slo_core.wire.api_description import DESCRIPTION_PATH, LIMITS_KEY, api_description
from slo_core.wire.limits import RequestLimits
from slo_lab.fuzzcases import valid_body

EXAMPLES = 120  # per door: positive and negative cases over every operation
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def front() -> Iterator[Front]:
    with front_doors() as f:
        yield f


def served_description(url: str) -> dict[str, Any]:
    resp = httpx.get(url + DESCRIPTION_PATH, timeout=10)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    return resp.json()


def for_this_fleet(doc: dict[str, Any], model: str) -> dict[str, Any]:
    """The served description with ``model`` and the SLO tier narrowed to what this fleet serves, so
    that valid cases reach the engine (other names are 404s and 400s the negative cases still try)."""
    doc = copy.deepcopy(doc)
    schemas = doc["components"]["schemas"]
    for name in ("ChatRequest", "CompletionRequest"):
        schemas[name]["properties"]["model"] = {"enum": [model]}
    schemas["SLO"]["properties"]["tier"] = {"enum": [*TIERS, None]}
    for path in ("/v1/chat/completions", "/v1/completions"):
        for param in doc["paths"][path]["post"]["parameters"]:
            if param["name"] == "x-slo-tier":
                param["schema"] = {"enum": list(TIERS)}
    return doc


@pytest.mark.parametrize("door", ["router", "sidecar"])
def test_schemathesis_cases_from_the_served_description(front: Front, door: str) -> None:
    url = front.router if door == "router" else front.sidecar
    schema = schemathesis.openapi.from_dict(for_this_fleet(served_description(url), front.model))
    cases = schema.as_strategy(GenerationMode.POSITIVE) | schema.as_strategy(GenerationMode.NEGATIVE)

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def answers_every_case(case: schemathesis.Case) -> None:
        # a dropped connection raises here and fails the test with the case that caused it
        resp = case.call(base_url=url, headers=AUTH, timeout=60)
        case.validate_response(resp, checks=CHECKS, headers=AUTH)

    answers_every_case()
    with httpx.Client(timeout=30) as http:
        assert_still_serves(http, url, front.model, AUTH)


@pytest.mark.parametrize("door", ["router", "sidecar"])
def test_served_description_states_the_limits_the_door_enforces(front: Front, door: str) -> None:
    url = front.router if door == "router" else front.sidecar
    doc = served_description(url)
    limits = RequestLimits(**doc[LIMITS_KEY])
    assert doc == api_description(limits, door=door)  # generated from the enforced limits, nothing else
    chat = doc["components"]["schemas"]["ChatRequest"]["properties"]
    assert chat["max_tokens"]["maximum"] == limits.max_tokens_limit
    if door == "sidecar":  # its bound is the model's context, as GET /v1/models says
        models = httpx.get(url + "/v1/models", timeout=10).json()["data"]
        assert limits.max_tokens_limit == models[0]["max_model_len"]
    else:
        assert limits == RequestLimits()  # the fixture's router runs with the defaults
    ok = valid_body(front.model)
    with httpx.Client(timeout=30) as http:

        def post(headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
            resp = http.post(url + "/v1/chat/completions", headers={**AUTH, **(headers or {})}, **kwargs)
            check_answer(resp, door)
            return resp

        over = post(json={**ok, "max_tokens": limits.max_tokens_limit + 1})
        assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"
        at_depth = {**ok, "x": _nested(limits.max_json_depth - 1)}  # the body object is one level
        assert post(json=at_depth).status_code == 200
        deep = post(json={**ok, "x": _nested(limits.max_json_depth)})
        assert deep.status_code == 400 and deep.json()["error"]["code"] == "invalid_json"
        filler = b" " * (limits.max_body_bytes + 1 - len(httpx.Request("POST", url, json=ok).content))
        big = post(content=httpx.Request("POST", url, json=ok).content[:-1] + filler + b"}")
        assert big.status_code == 413
        fits = post(content=httpx.Request("POST", url, json=ok).content[:-1] + filler[:-1] + b"}")
        assert fits.status_code == 200
        header = post(headers={"x-filler": "a" * limits.max_header_bytes})
        assert header.status_code == 431


def _nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value
