"""Request bodies of the OpenAI API as vLLM accepts them, and their translation into a Submission.

Unknown fields are accepted and ignored (as vLLM does for sampling options that do not change
timing); fields that would change what a caller gets back and that engine-sim cannot honour
(``n > 1``, several prompts in one request) are rejected with a message saying what to send.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slo_core.wire.openai import error_body
from slo_core.wire.tags import EngineTags, decode_tags
from slo_core.wire.tokens import message_text

from . import tokens


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self, message: str, status: int = 400, *, err_type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, kind=self.err_type, param=self.param, code=self.status)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    n: int = Field(1, ge=1)
    priority: int = 0
    vllm_xargs: dict[str, str | int | float | bool | None] | None = None


class CompletionBody(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Any = None


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


def parse_body(model: type[_Common], raw: Any) -> Any:
    """Validate a JSON body; every problem is listed with the field to change."""
    if not isinstance(raw, dict):
        raise ApiError("the request body must be a JSON object")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = []
        locs = []
        for err in exc.errors()[:5]:
            loc = ".".join(str(p) for p in err["loc"]) or "body"
            locs.append(loc)
            problems.append(f"{loc}: {err['msg']}")
        raise ApiError("invalid request: " + "; ".join(problems), param=locs[0] if locs else None) from None


def prompt_tokens_of(body: CompletionBody) -> tuple[int, bytes]:
    """(prompt tokens, hash key) of a completion prompt: a string or one list of token ids."""
    prompt: Any = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise ApiError(
                "engine-sim serves one prompt per request: send 'prompt' as one string or token list"
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokens.count_text_tokens(prompt), tokens.prompt_key(prompt)
    if not prompt:
        raise ApiError("prompt: the prompt cannot be empty", param="prompt")
    bad = [t for t in prompt if not 0 <= t < tokens.VOCAB_SIZE]
    if bad:
        raise ApiError(
            f"prompt: token id {bad[0]} is out of vocabulary (0 <= id < {tokens.VOCAB_SIZE})", param="prompt"
        )
    return len(prompt), tokens.prompt_key(prompt)


def chat_prompt_of(body: ChatBody) -> tuple[int, bytes]:
    try:
        messages = [(m.role, message_text(m.content)) for m in body.messages]
    except ValueError as exc:
        raise ApiError(f"messages: {exc}", param="messages") from None
    key = "\x00".join(f"{role}\x01{text}" for role, text in messages)
    return tokens.count_chat_tokens(messages), tokens.prompt_key(key)


def decode_xargs(raw: dict[str, Any] | None) -> EngineTags | None:
    try:
        return decode_tags(raw)
    except (ValueError, TypeError, KeyError) as exc:
        raise ApiError(
            f"vllm_xargs: malformed slofleet SLO tags ({exc}); see slo_core.wire.tags", param="vllm_xargs"
        ) from None


def resolve_lengths(
    body: _Common, prompt_tokens: int, max_tokens: int | None, max_model_len: int, key: bytes
) -> tuple[int, int]:
    """(max_tokens, output tokens the engine will generate), checked against the context like vLLM."""
    if body.n != 1:
        raise ApiError("n: engine-sim returns one choice per request; send n=1 (or omit it)", param="n")
    if prompt_tokens >= max_model_len:
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{prompt_tokens} input tokens, which leaves no room for output tokens. Please reduce the length "
            f"of the input prompt to fewer than {max_model_len} tokens.",
            param="input_tokens",
        )
    room = max_model_len - prompt_tokens
    if max_tokens is None:
        max_tokens = room
    elif max_tokens > max_model_len:
        raise ApiError(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            param="max_tokens",
        )
    elif max_tokens > room:
        raise ApiError(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
            f"context length is {max_model_len} tokens and your request has {prompt_tokens} input tokens "
            f"({max_tokens} > {max_model_len} - {prompt_tokens}). Reduce max_tokens to at most {room}.",
            param="max_tokens",
        )
    if body.min_tokens > max_tokens:
        raise ApiError(
            f"min_tokens ({body.min_tokens}) must be at most max_tokens ({max_tokens})", param="min_tokens"
        )
    if body.ignore_eos:
        return max_tokens, max_tokens
    natural = max(body.min_tokens, tokens.natural_output_tokens(key))
    return max_tokens, min(max_tokens, natural)
