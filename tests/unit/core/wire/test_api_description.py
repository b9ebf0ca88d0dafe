"""The OpenAPI description of the front doors is generated from the enforced limits and SLO vocabulary."""

from __future__ import annotations

import jsonschema
import pytest
import schemathesis

from slo_core.wire.api_description import DESCRIPTION_PATH, LIMITS_KEY, api_description
from slo_core.wire.limits import RequestLimits
from slo_core.wire.request_slo import SLO_HEADERS, SLOParamError, parse_slo

LIMITS = RequestLimits(max_body_bytes=1000, max_header_bytes=2000, max_json_depth=7, max_tokens_limit=4096)


@pytest.mark.parametrize("door", ["router", "sidecar"])
def test_every_operation_loads_and_the_limits_are_the_ones_given(door: str) -> None:
    doc = api_description(LIMITS, door=door)
    operations = [op.ok() for op in schemathesis.openapi.from_dict(doc).get_all_operations()]
    assert {(o.method.upper(), o.path) for o in operations} == {
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/v1/models"),
        ("GET", "/health"),
        ("GET", "/ready"),
        ("GET", DESCRIPTION_PATH),
    }
    assert doc[LIMITS_KEY] == {
        "max_body_bytes": 1000, "max_header_bytes": 2000, "max_json_depth": 7, "max_tokens_limit": 4096
    }  # fmt: skip
    for name in ("ChatRequest", "CompletionRequest"):
        assert doc["components"]["schemas"][name]["properties"]["max_tokens"]["maximum"] == 4096
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["description"]
    assert "1000 bytes" in body and "7 levels" in body and "2000 bytes" in body
    assert ("securitySchemes" in doc["components"]) == (door == "router")


@pytest.mark.parametrize(
    ("slo", "valid"),
    [
        ({"tier": "gold", "deadline_s": 20, "ttft_s": 0.5}, True),
        ({"deadline_s": 0}, False),
        ({"ttft_s": 1e9}, False),
        ({"stage": -1}, False),
        ({"tier": "g\u00f6ld"}, False),
        ({"colour": "red"}, False),
    ],
)
def test_the_slo_schema_accepts_what_the_doors_accept(slo: dict[str, object], valid: bool) -> None:
    doc = api_description(LIMITS, door="router")
    schema = doc["components"]["schemas"]["SLO"]
    assert jsonschema.Draft202012Validator(schema).is_valid(slo) == valid
    try:
        parse_slo({}, {"slo": slo})
        parsed = True
    except SLOParamError:
        parsed = False
    assert parsed == valid


def test_every_slo_header_is_described() -> None:
    params = api_description(LIMITS, door="sidecar")["paths"]["/v1/completions"]["post"]["parameters"]
    assert set(SLO_HEADERS) <= {p["name"] for p in params}
