"""engine-sim's fast SSE encoding is byte-identical to the plain dict-based chunk."""

from __future__ import annotations

import json

import pytest

from slo_sidecar.engine_sim.responses import Shape, chunk, sse, usage_chunk


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
    assert body["usage"]["total_tokens"] == 17
