"""The OpenAPI 3.1 description of the front doors' HTTP surface (router and sidecar), served at
:data:`DESCRIPTION_PATH`.

Built from what the doors enforce, so it cannot drift from them: the ``slo`` object and the ``x-slo-*``
headers from :class:`~slo_core.wire.request_slo.SLORequest`, ``max_tokens`` and the size limits from the
:class:`~slo_core.wire.limits.RequestLimits` the door runs with (also listed under ``x-slofleet-limits``:
JSON Schema has no keyword for a body's bytes or nesting depth). Fields a door does not check are the
engine's to judge and are left open (``additionalProperties``). Every error is an OpenAI error object.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

from slo_core.wire.limits import SAFE_TOKEN, RequestLimits
from slo_core.wire.request_slo import SERVED_TIER_HEADER, SLO_HEADERS, SLORequest

DESCRIPTION_PATH = "/openapi.json"
LIMITS_KEY = "x-slofleet-limits"
Door = Literal["router", "sidecar"]

_REF = "#/components/schemas/{model}"
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # OpenAI's; the engine judges them


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(model=name)}


def _error_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "integer", "null"]},
                },
            }
        },
    }


def _token_count(limit: int, what: str) -> dict[str, Any]:
    return {
        "type": ["integer", "null"],
        "minimum": 1,
        "maximum": limit,
        "description": f"{what}; at most the model's context (max_model_len in GET /v1/models) less the "
        "prompt (400 context_length_exceeded beyond). Absent: the context left after the prompt (as vLLM)",
    }


def _common_fields(limits: RequestLimits) -> dict[str, Any]:
    slo_fields = SLORequest.model_json_schema(ref_template=_REF)["properties"]
    return {
        "model": {"type": "string", "minLength": 1, "description": "404 model_not_found if not served"},
        "max_tokens": _token_count(limits.max_tokens_limit, "most tokens to generate"),
        "max_completion_tokens": _token_count(limits.max_tokens_limit, "alias of max_tokens"),
        "stream": {"type": "boolean", "description": "server-sent events, ended by data: [DONE]"},
        "stream_options": {
            "type": ["object", "null"],
            "properties": {"include_usage": {"type": "boolean"}},
        },
        "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 1, "description": "one choice a request"},
        "slo": {**_ref("SLO"), "description": "the request's SLO (bounded by the caller's tier)"},
        # JITServe's top-level aliases of the slo fields
        "deadline": slo_fields["deadline_s"],
        "target_ttft": slo_fields["ttft_s"],
        "target_tbt": slo_fields["tbt_s"],
        "waiting_time": slo_fields["max_wait_s"],
    }


def _text_parts() -> dict[str, Any]:
    part = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    }
    return {"type": "array", "items": part}


def _chat_request(limits: RequestLimits) -> dict[str, Any]:
    message = {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"enum": list(CHAT_ROLES)},
            "content": {"anyOf": [{"type": ["string", "null"]}, _text_parts()]},
        },
    }
    return {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            **_common_fields(limits),
            "messages": {"type": "array", "minItems": 1, "items": message},
        },
    }


def _completion_request(limits: RequestLimits) -> dict[str, Any]:
    prompt = {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
            {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        ],
        "description": "one prompt: text, or token ids",
    }
    return {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {**_common_fields(limits), "prompt": prompt},
    }


# one server-sent event (OpenAPI 3.1: the schema of a text/event-stream is that of each event)
_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {"type": "string", "description": "a chunk object as JSON, an error object, or [DONE]"}
    },
}


def _answer(kind: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["id", "object", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": kind},
            "choices": {"type": "array"},
            "usage": {"type": "object"},
        },
    }


def _headers() -> list[dict[str, Any]]:
    fields = SLORequest.model_json_schema(ref_template=_REF)["properties"]
    params = [
        {"name": header, "in": "header", "required": False, "schema": _plain(fields[field])}
        for header, field in SLO_HEADERS.items()
    ]
    params.append(
        {
            "name": "x-request-id",
            "in": "header",
            "required": False,
            "description": f"kept when it matches {SAFE_TOKEN.pattern}; otherwise a new id is made",
            "schema": {"type": "string"},
        }
    )
    return params


def _plain(field: dict[str, Any]) -> dict[str, Any]:
    """A field's schema without its ``null`` branch (a header is either sent or not)."""
    options = [s for s in field.get("anyOf", [field]) if s.get("type") != "null"]
    schema = dict(options[0]) if len(options) == 1 else {"anyOf": options}
    if "description" in field:
        schema["description"] = field["description"]
    return schema


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors() -> dict[str, Any]:
    return {"description": "an OpenAI error object", "content": _json(_ref("Error"))}


def _completions(name: str, request: str, answer: str, limits: RequestLimits, door: Door) -> dict[str, Any]:
    body_note = (
        f"at most {limits.max_body_bytes} bytes (413 beyond), nested at most {limits.max_json_depth} "
        f"levels (400 beyond); headers at most {limits.max_header_bytes} bytes (431 beyond)"
    )
    op: dict[str, Any] = {
        "operationId": name,
        "summary": f"OpenAI {name}: one choice, streamed or not, scheduled by its SLO",
        "parameters": _headers(),
        "requestBody": {"required": True, "description": body_note, "content": _json(_ref(request))},
        "responses": {
            "200": {
                "description": "the engine's answer, or its server-sent events when stream is true",
                "content": {**_json(_ref(answer)), "text/event-stream": {"schema": _EVENT}},
            },
            "default": _errors(),
        },
    }
    if door == "router":
        op["security"] = [{"apiKey": []}]
        op["responses"]["200"]["headers"] = {
            SERVED_TIER_HEADER: {
                "description": "the tier that served the request: the one asked for, the tenant's "
                "default, or the best-effort tier when the router demoted it",
                "required": True,
                "schema": {"type": "string"},
            }
        }
    return op


def _get(summary: str, schema: dict[str, Any], *, statuses: tuple[str, ...] = ("200",)) -> dict[str, Any]:
    responses: dict[str, Any] = {s: {"description": summary, "content": _json(schema)} for s in statuses}
    return {"get": {"summary": summary, "responses": {**responses, "default": _errors()}}}


def api_description(limits: RequestLimits, *, door: Door, version: str = "0.1.0") -> dict[str, Any]:
    """The OpenAPI 3.1 document of one door's HTTP surface under ``limits``."""
    model_list = {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "object"],
                    "properties": {
                        "id": {"type": "string"},
                        "object": {"const": "model"},
                        "max_model_len": {"type": "integer"},
                    },
                },
            },
        },
    }
    models = _get("the models served here", model_list)
    if door == "router":
        models["get"]["security"] = [{"apiKey": []}]
    slo = SLORequest.model_json_schema(ref_template=_REF)
    slo.pop("title", None)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": f"slofleet {door}",
            "version": version,
            "description": "OpenAI-compatible completions with per-request SLOs. Every error is an "
            "OpenAI error object ({error: {message, type, param, code}}).",
        },
        LIMITS_KEY: asdict(limits),
        "paths": {
            "/v1/chat/completions": {
                "post": _completions("chat.completions", "ChatRequest", "ChatCompletion", limits, door)
            },
            "/v1/completions": {
                "post": _completions("completions", "CompletionRequest", "Completion", limits, door)
            },
            "/v1/models": models,
            "/health": _get("alive", {"type": "object"}),
            "/ready": _get("ready (503: not, and why)", {"type": "object"}, statuses=("200", "503")),
            DESCRIPTION_PATH: _get("this description", {"type": "object"}),
        },
        "components": {
            "schemas": {
                "Error": _error_schema(),
                "SLO": slo,
                "ChatRequest": _chat_request(limits),
                "CompletionRequest": _completion_request(limits),
                "ChatCompletion": _answer("chat.completion"),
                "Completion": _answer("text_completion"),
            },
        },
    }
    if door == "router":
        doc["components"]["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
    return doc
