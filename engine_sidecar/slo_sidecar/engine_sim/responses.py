"""Response bodies and SSE chunks shaped like vLLM's OpenAI server (completions and chat)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Shape:
    """What every chunk of one response shares."""

    response_id: str
    created: int
    model: str
    chat: bool

    _head: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        head = json.dumps(
            {
                "id": self.response_id,
                "object": self.object_name,
                "created": self.created,
                "model": self.model,
            },
            separators=(", ", ": "),
        )
        key = '"delta": {"content": ' if self.chat else '"text": '
        object.__setattr__(self, "_head", f'data: {head[:-1]}, "choices": [{{"index": 0, {key}')

    @property
    def object_name(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def text_event(self, text: str, finish_reason: str | None) -> bytes:
        """The SSE event of one content chunk: the same JSON as :func:`chunk`, built without a dict
        (the per-token hot path of every stream)."""
        close = "}" if self.chat else ""
        reason = "null" if finish_reason is None else json.dumps(finish_reason)
        return (
            f'{self._head}{json.dumps(text)}{close}, "logprobs": null, "finish_reason": {reason}, '
            f'"stop_reason": null}}]}}\n\n'
        ).encode()


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(", ", ": "))
    return f"data: {data}\n\n".encode()


def _choice(shape: Shape, text: str, finish_reason: str | None, *, role: bool = False) -> dict[str, Any]:
    if shape.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {"content": text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason,
                "stop_reason": None}  # fmt: skip
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}


def chunk(
    shape: Shape,
    text: str,
    finish_reason: str | None = None,
    *,
    role: bool = False,
    usage_now: dict[str, Any] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": shape.response_id,
        "object": shape.object_name,
        "created": shape.created,
        "model": shape.model,
        "choices": [_choice(shape, text, finish_reason, role=role)],
    }
    if usage_now is not None:
        out["usage"] = usage_now
    return out


def usage_chunk(shape: Shape, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": shape.response_id,
        "object": shape.object_name,
        "created": shape.created,
        "model": shape.model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def full_response(
    shape: Shape, text: str, finish_reason: str | None, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    if shape.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": None, "prompt_logprobs": None}  # fmt: skip
        obj = "text_completion"
    return {
        "id": shape.response_id,
        "object": obj,
        "created": shape.created,
        "model": shape.model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
        "service_tier": None,
        "system_fingerprint": None,
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }
