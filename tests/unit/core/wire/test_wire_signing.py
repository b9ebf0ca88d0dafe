"""Tag signatures: valid ones pass; unsigned, forged, altered, stale or other-key ones do not."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slo_core.wire.signing import SIG_TAG, parse_keys, sign, signed_json, verify

KEY = b"k" * 32
OLD = b"o" * 32
TAGS = {"slo_kind": "latency", "slo_priority_weight": 3.0, "slo_tenant": "product", "other": 1}


def test_a_signed_tag_set_verifies_with_its_key_and_with_a_rotated_key_list() -> None:
    signed = sign(TAGS, KEY, now_s=1000.0)
    assert verify(signed, [KEY], now_s=1001.0) is None
    assert verify(sign(TAGS, OLD, now_s=1000.0), [KEY, OLD], now_s=1001.0) is None


@pytest.mark.parametrize(
    ("tags", "why"),
    [
        (TAGS, "unsigned"),
        ({**TAGS, SIG_TAG: "1000.deadbeef"}, "forged signature"),
        ({**sign(TAGS, KEY, 1000.0), "slo_priority_weight": 30.0}, "forged signature"),
        ({**sign(TAGS, KEY, 1000.0), "slo_kind": "deadline"}, "forged signature"),
        (sign(TAGS, OLD, 1000.0), "forged signature"),
        (sign(TAGS, KEY, 1.0), "stale signature"),
        (sign(TAGS, KEY, 5000.0), "stale signature"),
        ({**TAGS, SIG_TAG: "x.y"}, "malformed signature"),
        ({}, "no tags"),
        (None, "no tags"),
    ],
)
def test_anything_but_a_fresh_valid_signature_is_refused(tags: dict | None, why: str) -> None:
    assert verify(tags, [KEY], now_s=1001.0) == why


def test_non_slo_args_are_not_covered_and_nan_is_malformed() -> None:
    signed = sign(TAGS, KEY, 1000.0)
    assert verify({**signed, "other": 2}, [KEY], 1001.0) is None, "only slo_ tags are signed"
    assert verify({**signed, "slo_priority_weight": float("nan")}, [KEY], 1001.0) == "malformed tags"


def test_keys_are_lines_of_at_least_16_characters() -> None:
    assert parse_keys("a" * 16 + "\n\n" + "b" * 20 + "\n") == [b"a" * 16, b"b" * 20]
    with pytest.raises(ValueError, match="16"):
        parse_keys("short\n")


_TAG_VALUES = st.one_of(
    st.text(max_size=12), st.integers(-(10**9), 10**9), st.floats(allow_nan=False, allow_infinity=False)
)


@given(
    tags=st.dictionaries(st.text(min_size=1, max_size=8).map(lambda k: "slo_" + k), _TAG_VALUES, max_size=8),
    extra=st.booleans(),
    now_s=st.floats(1.0, 2e9),
)
def test_signed_json_is_the_signed_tags_encoded_once(tags: dict, extra: bool, now_s: float) -> None:
    tags = {**tags, "other": 1} if extra else tags
    tags.pop(SIG_TAG, None)
    raw = signed_json(tags, KEY, now_s)
    assert json.loads(raw) == sign(tags, KEY, now_s)
    assert verify(json.loads(raw), [KEY], now_s) is None
