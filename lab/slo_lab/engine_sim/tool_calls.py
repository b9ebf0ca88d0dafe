"""Tool calls, as vLLM answers a chat request whose ``tool_choice`` names a function.

With ``tool_choice: {"type": "function", "function": {"name": N}}`` vLLM constrains the output to the
arguments of ``N`` and answers ``message.tool_calls`` (content empty); streamed, the first delta carries
the call's id, type and name, later deltas the arguments in pieces. engine-sim keeps its timing (the
request still generates its usual number of tokens) and fills the arguments deterministically from the
function's JSON-schema parameters, so a test can check the call arrives intact through router and sidecar.
"""

from __future__ import annotations

import json
from typing import Any

from . import tokens
from .protocol import ApiError


def named_function(body: Any) -> dict[str, Any] | None:
    """The function a chat body's ``tool_choice`` names (its entry in ``tools``), or None."""
    choice = getattr(body, "tool_choice", None)
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return None
    name = (choice.get("function") or {}).get("name")
    for tool in getattr(body, "tools", None) or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            return fn
    raise ApiError(f"tool_choice names function {name!r}, which 'tools' does not define", param="tool_choice")


def arguments(fn: dict[str, Any], key: bytes) -> str:
    """JSON arguments matching the function's parameter schema (top-level properties), deterministic."""
    props = (
        ((fn.get("parameters") or {}).get("properties") or {})
        if isinstance(fn.get("parameters"), dict)
        else {}
    )
    words = tokens.filler_words(key, max(1, len(props)))
    out: dict[str, Any] = {}
    for i, (name, schema) in enumerate(props.items()):
        kind = schema.get("type") if isinstance(schema, dict) else None
        enum = schema.get("enum") if isinstance(schema, dict) else None
        if enum:
            out[name] = enum[0]
        elif kind in ("integer", "number"):
            out[name] = i + 1
        elif kind == "boolean":
            out[name] = True
        else:
            out[name] = words[i].strip()
    return json.dumps(out)


def call(rid: str, fn: dict[str, Any], args: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-tool-{rid[-12:]}",
        "type": "function",
        "function": {"name": fn["name"], "arguments": args},
    }


def message_with_call(response: dict[str, Any], tool_call: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed chat answer whose message is the tool call."""
    message = response["choices"][0]["message"]
    message["content"] = None
    message["tool_calls"] = [tool_call]
    return response


def delta_chunk(head: dict[str, Any], piece: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    """One streamed chunk carrying part of the tool call (``piece``: index, and id/type/name or arguments)."""
    choice = {"index": 0, "delta": {"tool_calls": [piece]}, "logprobs": None, "finish_reason": finish_reason}
    return {**head, "choices": [choice]}
