"""Validation of an OpenAI completions / chat body: what the sidecar needs from it, 400s saying what to fix.

Prompt tokens are counted without a tokenizer by slo_core.wire.tokens (word pieces of at most 4
characters and single punctuation marks, plus BOS; chat adds 4 per message and 3 for the reply
header), the rule the router estimates a request's size with: an estimate for a real model. The
engine's usage replaces it once it answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slo_core.wire.limits import token_count
from slo_core.wire.request_slo import strip_slo_fields
from slo_core.wire.tags import client_xargs, strip_engine_tags
from slo_core.wire.tokens import (
    chat_prompt_tokens,
    completion_prompt,
    completion_prompt_tokens,
    message_text,
)
from slo_sidecar.errors import APIError

CHAT = "chat"
COMPLETION = "completion"


@dataclass
class ParsedBody:
    """The parts of a client body the sidecar acts on, and the body to forward (SLO fields removed)."""

    endpoint: str
    model: str
    prompt_text: str
    prompt_tokens: int
    max_tokens: int | None  # None: the client gave none (the context left after the prompt applies)
    stream: bool
    include_usage: bool
    resumable: bool
    forward: dict[str, Any]


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_request")


def _content_text(content: Any, where: str) -> str:
    try:
        return message_text(content)
    except ValueError as exc:
        raise _bad(f"{where}: {exc}", where) from None


def _chat_prompt(body: dict[str, Any]) -> tuple[str, int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list of {'role': ..., 'content': ...} objects", "messages")
    texts: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")
        texts.append(_content_text(m.get("content"), f"messages[{i}].content"))
    text = "\n".join(texts)
    return text, chat_prompt_tokens(texts)


def _completion_prompt(body: dict[str, Any]) -> tuple[str, int, bool]:
    prompt = completion_prompt(body.get("prompt"))
    if isinstance(prompt, str):
        return prompt, completion_prompt_tokens(prompt), True
    if prompt is not None:
        return "", len(prompt), False  # token ids: served, but never preempted (no text to resume from)
    raw = body.get("prompt")
    if isinstance(raw, list) and len(raw) > 1:
        raise _bad("send one prompt per request (batched prompts are not supported)", "prompt")
    raise _bad("'prompt' must be a string or a list of token ids", "prompt")


def parse_body(
    body: Any, endpoint: str, default_max_tokens: int | None = None, *, max_tokens_limit: int = 1 << 30
) -> ParsedBody:
    """Check the OpenAI fields the sidecar depends on; everything else is the engine's to judge.

    Engine tags a caller may not set are dropped: ``priority``, top-level ``slo_*`` fields and the
    ``slo_*`` keys of ``vllm_xargs`` (which must be an object: vLLM fails on anything else).
    """
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad(f"'stream' must be true or false, got {stream!r}", "stream")
    n = body.get("n")
    if n not in (None, 1):
        raise _bad("'n' must be 1 (ask for several completions with several requests)", "n")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("'stream_options' must be an object such as {'include_usage': true}", "stream_options")
    include_usage = bool((options or {}).get("include_usage", False))
    if endpoint == CHAT:
        text, tokens = _chat_prompt(body)
        resumable = True
    else:
        text, tokens, resumable = _completion_prompt(body)
    resumable = resumable and stream  # a non-streamed answer is the engine's own body: never spliced
    max_tokens = token_count(body, "max_tokens", max_tokens_limit)
    if max_tokens is None:
        max_tokens = token_count(body, "max_completion_tokens", max_tokens_limit)
    if max_tokens is None:  # None still: the context left after the prompt applies (the sidecar's call)
        max_tokens = default_max_tokens
    try:
        xargs = client_xargs(body.get("vllm_xargs"))
    except ValueError as exc:
        raise _bad(str(exc), "vllm_xargs") from None
    forward, _ = strip_engine_tags(strip_slo_fields(body))
    forward.pop("max_completion_tokens", None)
    if xargs:
        forward["vllm_xargs"] = xargs
    return ParsedBody(
        endpoint=endpoint,
        model=model,
        prompt_text=text,
        prompt_tokens=tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        resumable=resumable,
        forward=forward,
    )
