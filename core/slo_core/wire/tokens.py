"""The one tokenizer-free token estimate: what the router, the sidecar and the predictor count text with.

Words and punctuation marks count one each; long words one per 4 characters (close to BPE tokenizers on
English). Deterministic and cheap; where the engine reports real counts (``usage``), those win. A
request body's prompt is counted here too (:func:`estimate_body_prompt_tokens`), with BOS and the chat
template's framing, so the router's size estimate of a request is the sidecar's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

# A word of n characters counts ceil(n / 4): exactly the matches of ``\w{1,4}`` within it, so one
# findall counts everything (no Python loop over the words: the router runs this on every prompt)
_PIECE = re.compile(r"\w{1,4}|[^\w\s]")


def approx_tokens(text: str) -> int:
    """At least 1."""
    return max(1, len(_PIECE.findall(text)))


# ---- a request body's prompt, counted the same at the router and the sidecar ---------------------
# BOS, and a chat template's framing: a role header and an end of turn per message, the assistant's
# header after the last (Llama 3's template; engine-sim renders the same shape)
BOS_TOKENS = 1
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_ASSISTANT_HEADER = 3


def message_text(content: Any) -> str:
    """The text of a chat message's ``content``: a string, None, or a list of text parts (joined by
    newlines); ValueError for anything else."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ValueError("content parts must be {'type': 'text', 'text': '...'} objects")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ValueError("content must be a string or a list of text parts")


def chat_prompt_tokens(texts: Sequence[str]) -> int:
    """The estimate of a chat prompt of messages with these texts (templated, with BOS)."""
    framing = BOS_TOKENS + CHAT_TOKENS_ASSISTANT_HEADER
    return framing + sum(approx_tokens(t) + CHAT_TOKENS_PER_MESSAGE for t in texts)


def completion_prompt_tokens(prompt: str) -> int:
    """The estimate of a completion prompt string (with BOS)."""
    return BOS_TOKENS + approx_tokens(prompt)


def estimate_body_prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt estimate of an OpenAI completions or chat body, never raising: what the sidecar
    counts for a body it accepts (:func:`chat_prompt_tokens`, :func:`completion_prompt_tokens`, the
    length of a token-id prompt); a malformed part counts as the text of its JSON, which the sidecar
    then refuses with a 400."""
    if "messages" in body:
        msgs = body["messages"]
        if not isinstance(msgs, list):
            return chat_prompt_tokens([_json_text(msgs)])
        texts = []
        for m in msgs:
            content = m.get("content") if isinstance(m, dict) else m
            try:
                texts.append(message_text(content))
            except ValueError:
                texts.append(_json_text(content))
        return chat_prompt_tokens(texts)
    raw = body.get("prompt", "")
    prompt = completion_prompt(raw)
    if isinstance(prompt, str):
        return completion_prompt_tokens(prompt)
    if prompt is not None:
        return len(prompt)
    return completion_prompt_tokens(_json_text(raw))


def completion_prompt(prompt: Any) -> str | list[int] | None:
    """A completions ``prompt`` as it is served: one string (a list of one string unwrapped) or a
    non-empty list of token ids; None for anything else (the sidecar refuses it)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return str(prompt[0])
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return prompt
    return None


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
