"""Deterministic, tokenizer-free token counting, token ids, filler text and output lengths.

Counting rule (documented so clients can reproduce it): a text is split into pieces by the regular
expression ``\\w{1,8}|[^\\w\\s]`` — runs of word characters cut every 8 characters, and every other
non-space character on its own; whitespace is free. One piece is one token. With special tokens
(the default, as vLLM's ``add_special_tokens``) a BOS token is prepended. A chat prompt counts 4
framing tokens per message (role header and end-of-turn) plus 3 for the assistant header, plus BOS.
Token ids are a stable hash of the piece (BOS is id 1), so they do not depend on the process.

Generated text is filler: output token ``i`` is one short word with a leading space, picked by a
hash of the prompt, so re-counting the generated text gives back exactly the number of tokens
generated. Output lengths are drawn by a hash of the prompt from the real output-length distribution
of the shipped ShareGPT first turns (``sharegpt_first_turn_5k.jsonl.gz``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Sequence
from functools import lru_cache

from slo_core import data
from slo_core.wire.tokens import CHAT_TOKENS_ASSISTANT_HEADER, CHAT_TOKENS_PER_MESSAGE

PIECE = re.compile(r"\w{1,8}|[^\w\s]")
VOCAB_SIZE = 32_000
BOS_ID = 1
_FIRST_ID = 16  # ids below are reserved for special tokens

FILLER_WORDS = (
    "the", "model", "serves", "tokens", "under", "a", "deadline", "while", "each", "request",
    "waits", "in", "queue", "and", "then", "runs", "on", "one", "GPU", "with", "batched", "decode",
    "steps", "so", "that", "goodput", "stays", "high", "for", "every", "tier", "of", "users",
    "who", "stream", "text", "from", "fleet", "nodes", "at", "scale", "today", "again", "now",
)  # fmt: skip


def _digest(data_bytes: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data_bytes, digest_size=8).digest(), "big")


def pieces(text: str) -> list[str]:
    return PIECE.findall(text)


def count_text_tokens(text: str, *, add_special_tokens: bool = True) -> int:
    return len(PIECE.findall(text)) + (1 if add_special_tokens else 0)


def token_ids(text: str, *, add_special_tokens: bool = True) -> list[int]:
    ids = [_FIRST_ID + _digest(p.encode()) % (VOCAB_SIZE - _FIRST_ID) for p in PIECE.findall(text)]
    return [BOS_ID, *ids] if add_special_tokens else ids


def chat_token_ids(messages: Sequence[tuple[str, str]]) -> list[int]:
    """Token ids of a rendered chat prompt: BOS, then per message a role header, content, end of turn."""
    ids = [BOS_ID]
    for role, text in messages:
        ids += [2, 3, _FIRST_ID + _digest(role.encode()) % (VOCAB_SIZE - _FIRST_ID)]
        ids += token_ids(text, add_special_tokens=False)
        ids.append(4)  # end of turn
    ids += [2, 3, _FIRST_ID + _digest(b"assistant") % (VOCAB_SIZE - _FIRST_ID)]
    return ids


def count_chat_tokens(messages: Sequence[tuple[str, str]]) -> int:
    return (
        1
        + sum(CHAT_TOKENS_PER_MESSAGE + count_text_tokens(t, add_special_tokens=False) for _, t in messages)
        + CHAT_TOKENS_ASSISTANT_HEADER
    )


@lru_cache(maxsize=1)
def output_length_distribution() -> tuple[int, ...]:
    """Sorted true output lengths (tokens) of the shipped ShareGPT first turns."""
    lengths: list[int] = []
    with gzip.open(data.path("sharegpt_first_turn_5k.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                lengths.append(max(1, int(json.loads(line)["output_tokens"])))
    return tuple(sorted(lengths))


def prompt_key(prompt: str | Sequence[int]) -> bytes:
    if isinstance(prompt, str):
        return prompt.encode()
    return b",".join(str(int(t)).encode() for t in prompt)


def natural_output_tokens(key: bytes) -> int:
    """The length this prompt 'wants' to generate before EOS (deterministic in the prompt)."""
    dist = output_length_distribution()
    return dist[_digest(b"len:" + key) % len(dist)]


def filler_words(key: bytes, n: int, start: int = 0) -> list[str]:
    """Output tokens ``start .. start+n-1`` of the filler text for this prompt, each ' word'."""
    offset = _digest(b"text:" + key) % len(FILLER_WORDS)
    return [" " + FILLER_WORDS[(offset + 7 * i) % len(FILLER_WORDS)] for i in range(start, start + n)]
