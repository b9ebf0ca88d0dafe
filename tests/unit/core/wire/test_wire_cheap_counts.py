"""The front doors' per-request counts (JSON nesting depth, the token estimate) give exactly what their
plain definitions give, on any input: they were rewritten to cost less per request, not to count
differently (the simulator and the predictor count with the same functions)."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.wire.limits import json_depth
from slo_core.wire.tokens import approx_tokens


def depth_by_definition(raw: bytes) -> int:
    """One byte at a time: brackets count outside strings only; a backslash escapes inside a string."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x7B, 0x5B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x7D, 0x5D):
            depth -= 1
    return deepest


def tokens_by_definition(text: str) -> int:
    """Words and punctuation marks one each, a long word one per 4 characters, at least 1."""
    return max(1, sum(max(1, (len(w) + 3) // 4) for w in re.findall(r"\w+|[^\w\s]", text)))


JSON_BYTES = st.sampled_from([b"{", b"}", b"[", b"]", b'"', b"\\", b"a", b",", b":", b"\n", b" ", b"1"])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=400)
@given(st.lists(JSON_BYTES, max_size=80).map(b"".join))
def test_depth_of_any_bytes_even_malformed_or_unterminated_is_the_definitions(raw: bytes) -> None:
    assert json_depth(raw) == depth_by_definition(raw)


@settings(max_examples=200)
@given(JSON_VALUES)
def test_depth_of_real_json_with_brackets_and_escapes_in_strings(value: object) -> None:
    raw = json.dumps({"v": value, "s": 'x"[{\\'}).encode()
    assert json_depth(raw) == depth_by_definition(raw)


def test_depth_examples() -> None:
    assert json_depth(b'{"a": [1, {"b": "]]]}}"}]}') == 3
    assert json_depth(b'{"a": "\\"[[["}') == 1
    assert json_depth(b'{"a": "unterminated [[[[') == 1
    assert json_depth(b"[[[]]]") == 3


@settings(max_examples=400)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_token_estimate_of_any_text_is_the_definitions(text: str) -> None:
    assert approx_tokens(text) == tokens_by_definition(text)


def test_token_estimate_examples() -> None:
    assert approx_tokens("") == 1
    assert approx_tokens("a b, c.") == 5
    assert approx_tokens("internationalisation") == 5  # 20 characters: one token per 4
    assert approx_tokens("héllo wörld!") == 5  # 5 + 5 characters: two each, and the mark
