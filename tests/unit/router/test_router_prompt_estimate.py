"""The router sizes a request with the count the pod's sidecar makes of the same body
(slo_core.wire.tokens.estimate_body_prompt_tokens): one rule, with BOS and the chat template's
framing, so admission and dispatch at the front door see the size the engine's scheduler will see.
Before, the router counted chat content without framing and a list of text parts as its Python repr."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.wire.tokens import (
    approx_tokens,
    estimate_body_prompt_tokens,
    message_text,
)
from slo_sidecar.front import parse_body

text = st.text(st.characters(codec="utf-8"), max_size=200)
part = st.builds(lambda t: {"type": "text", "text": t}, text)
content = st.one_of(st.none(), text, st.lists(part, min_size=1, max_size=3))
message = st.builds(
    lambda role, c: {"role": role, "content": c}, st.sampled_from(["system", "user", "assistant"]), content
)
chat_body = st.builds(
    lambda msgs: {"model": "m", "messages": msgs}, st.lists(message, min_size=1, max_size=5)
)
completion_body = st.builds(
    lambda p: {"model": "m", "prompt": p},
    st.one_of(
        text,
        st.lists(text, min_size=1, max_size=1),
        st.lists(st.integers(0, 31_999), min_size=1, max_size=50),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(chat_body, completion_body))
def test_router_estimate_is_the_sidecars_count_of_every_body_it_accepts(body: dict[str, Any]) -> None:
    endpoint = "chat" if "messages" in body else "completion"
    assert estimate_body_prompt_tokens(body) == parse_body(body, endpoint).prompt_tokens


def test_chat_framing_and_text_parts_count_as_the_engine_sees_them() -> None:
    one = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
    assert estimate_body_prompt_tokens(one) == 1 + (approx_tokens("hello there") + 4) + 3
    parts = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}],
    }
    assert estimate_body_prompt_tokens(parts) == estimate_body_prompt_tokens(one)  # not the parts' repr
    assert estimate_body_prompt_tokens({"model": "m", "prompt": [5, 6, 7]}) == 3  # token ids, as given


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | text, lambda c: st.lists(c) | st.dictionaries(text, c)
    )
)
def test_the_estimate_never_raises_on_a_malformed_body(junk: Any) -> None:
    """The router counts before the sidecar validates: junk gets a size (the sidecar then answers 400)."""
    for body in (
        {"messages": junk},
        {"messages": [junk]},
        {"messages": [{"content": junk}]},
        {"prompt": junk},
    ):
        assert estimate_body_prompt_tokens(body) >= 1


def test_message_text_accepts_strings_and_text_parts_only() -> None:
    assert message_text("hi") == "hi"
    assert message_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "a\nb"
    assert message_text(None) == ""
    for bad in ([{"type": "image_url", "image_url": {"url": "x"}}], 5, {"text": "x"}):
        with pytest.raises(ValueError, match="text"):
            message_text(bad)
