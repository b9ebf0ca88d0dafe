"""Response bodies and SSE chunks shaped like vLLM 0.32's OpenAI server (completions and chat).

The key sets and their order were captured from a real vLLM 0.32 (CPU build) answering the same
requests; JSON is compact (``,`` and ``:`` separators) as vLLM writes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SYSTEM_FINGERPRINT = "vllm-0.32.0-engine-sim"


def _dumps(payload: Any) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Shape:
    """What every chunk of one response shares."""

    response_id: str
    created: int
    model: str
    chat: bool
    _head: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        head = _dumps(
            {"id": self.response_id, "object": self.object_name, "created": self.created, "model": self.model}
        )
        key = '"delta":{"content":' if self.chat else '"text":'
        object.__setattr__(self, "_head", f'data: {head[:-1]},"choices":[{{"index":0,{key}')

    @property
    def object_name(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def text_event(self, text: str, finish_reason: str | None) -> bytes:
        """The SSE event of one content chunk: the same JSON as :func:`chunk`, built without a dict
        (the per-token hot path of every stream)."""
        if self.chat:
            tail = (
                ',"stop_reason":null,"token_ids":null' if finish_reason is not None else ',"token_ids":null'
            )
            body = f'{_dumps(text)}}},"logprobs":null,"finish_reason":{_dumps(finish_reason)}{tail}'
        else:
            body = (
                f'{_dumps(text)},"logprobs":null,"finish_reason":{_dumps(finish_reason)},'
                '"stop_reason":null,"prompt_token_ids":null,"token_ids":null'
            )
        return f"{self._head}{body}}}]}}\n\n".encode()


def usage(prompt_tokens: int, completion_tokens: int, *, details: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if details:
        out["prompt_tokens_details"] = None
        out["completion_tokens_details"] = None
    return out


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else _dumps(payload)
    return f"data: {data}\n\n".encode()


def _head(shape: Shape) -> dict[str, Any]:
    return {
        "id": shape.response_id,
        "object": shape.object_name,
        "created": shape.created,
        "model": shape.model,
    }


def role_chunk(shape: Shape, usage_now: dict[str, Any] | None = None) -> dict[str, Any]:
    """A chat stream's first chunk: the assistant role with empty content."""
    choice = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    out = {**_head(shape), "choices": [choice], "prompt_token_ids": None, "prompt_text": None}
    if usage_now is not None:
        out["usage"] = usage_now
    return out


def chunk(
    shape: Shape, text: str, finish_reason: str | None = None, *, usage_now: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One content chunk of a stream (``usage_now`` with ``stream_options.continuous_usage_stats``)."""
    choice: dict[str, Any]
    if shape.chat:
        choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = None
        choice["token_ids"] = None
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": None, "prompt_token_ids": None, "token_ids": None}  # fmt: skip
    out = {**_head(shape), "choices": [choice]}
    if usage_now is not None:
        out["usage"] = usage_now
    return out


def usage_chunk(shape: Shape, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The last chunk with ``stream_options.include_usage``: no choices, the request's usage."""
    return {
        **_head(shape),
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens, details=False),
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def full_response(
    shape: Shape, text: str, finish_reason: str | None, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A non-streamed completion or chat completion."""
    if shape.chat:
        message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                   "function_call": None, "reasoning": None}  # fmt: skip
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": None, "token_ids": None, "routed_experts": None}  # fmt: skip
        return {"id": shape.response_id, "object": "chat.completion", "created": shape.created,
                "model": shape.model, "choices": [choice], "service_tier": None,
                "system_fingerprint": SYSTEM_FINGERPRINT,
                "usage": usage(prompt_tokens, completion_tokens), "prompt_logprobs": None,
                "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
                "ec_transfer_params": None, "metrics": None}  # fmt: skip
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None,
              "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None,
              "routed_experts": None}  # fmt: skip
    return {"id": shape.response_id, "object": "text_completion", "created": shape.created,
            "model": shape.model, "choices": [choice], "service_tier": None,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": usage(prompt_tokens, completion_tokens), "kv_transfer_params": None,
            "ec_transfer_params": None, "metrics": None}  # fmt: skip
