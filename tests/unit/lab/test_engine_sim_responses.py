"""engine-sim's fast SSE encoding is byte-identical to the plain dict-based chunk."""

from __future__ import annotations

import json

import pytest

from slo_lab.engine_sim.responses import Shape, chunk, full_response, sse, usage_chunk


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("text", ["", " word", 'quote " and \\ back\nslash', "ünï €"])
@pytest.mark.parametrize("reason", [None, "length", "stop", "abort"])
def test_text_event_matches_the_dict_chunk(chat: bool, text: str, reason: str | None) -> None:
    shape = Shape('cmpl-"x"', 1700000000, "llama3-8b", chat)
    assert shape.text_event(text, reason) == sse(chunk(shape, text, reason))
    payload = json.loads(shape.text_event(text, reason)[len(b"data: ") :])
    choice = payload["choices"][0]
    assert (choice["delta"]["content"] if chat else choice["text"]) == text
    assert choice["finish_reason"] == reason


def test_usage_chunk_has_no_choices_and_consistent_totals() -> None:
    body = usage_chunk(Shape("id", 1, "m", True), 10, 7)
    assert body["choices"] == [] and body["object"] == "chat.completion.chunk"
    assert body["usage"] == {"prompt_tokens": 10, "total_tokens": 17, "completion_tokens": 7}


# captured from vLLM 0.32 (CPU build): the key order of each object, which engine-sim reproduces
TEXT_KEYS = ["index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"]
VLLM_STREAM = {
    (False, None): TEXT_KEYS,
    (False, "length"): TEXT_KEYS,
    (True, None): ["index", "delta", "logprobs", "finish_reason", "token_ids"],
    (True, "length"): ["index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids"],
}  # fmt: skip


@pytest.mark.parametrize(("chat", "reason"), list(VLLM_STREAM))
def test_stream_chunks_have_vllms_keys(chat: bool, reason: str | None) -> None:
    event = Shape("cmpl-1", 1, "m", chat).text_event("x", reason)
    payload = json.loads(event[len(b"data: ") :])
    assert list(payload) == ["id", "object", "created", "model", "choices"]
    assert list(payload["choices"][0]) == VLLM_STREAM[(chat, reason)]
    assert b'":' in event and b'": ' not in event  # compact JSON, as vLLM writes it


def test_full_responses_have_vllms_keys() -> None:
    chat = full_response(Shape("c", 1, "m", True), "hi", "length", 3, 2)
    assert list(chat["choices"][0]["message"]) == [
        "role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"
    ]  # fmt: skip
    text = full_response(Shape("c", 1, "m", False), "hi", "stop", 3, 2)
    assert list(text) == ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                          "usage", "kv_transfer_params", "ec_transfer_params", "metrics"]  # fmt: skip
    assert text["usage"]["total_tokens"] == 5 and text["choices"][0]["finish_reason"] == "stop"
