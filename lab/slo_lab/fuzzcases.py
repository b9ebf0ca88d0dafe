"""Hostile requests for the front doors (router, sidecar): hand-written cases and seeded mutations.

Shared by the fuzz tests (tests/integration/test_front_door_fuzz.py) and the long run
(bench/front_door_fuzz.py), so both throw the same things. Each case is (name, httpx request kwargs)
for ``POST /v1/chat/completions``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

MiB = 1 << 20


def valid_body(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def chunks(total: int, piece: int = MiB) -> Iterator[bytes]:
    """A body of ``total`` spaces sent chunked (no Content-Length)."""
    sent = 0
    while sent < total:
        yield b" " * min(piece, total - sent)
        sent += piece


def _with(ok: dict[str, Any], raw_field: bytes) -> bytes:
    """``ok`` as JSON with one more member written raw (numbers JSON cannot hold, NaN, ...)."""
    return json.dumps(ok)[:-1].encode() + b", " + raw_field + b"}"


def hostile_cases(model: str, *, huge: bool = True) -> list[tuple[str, dict[str, Any]]]:
    ok = valid_body(model)
    nested = b"[" * 100_000 + b"]" * 100_000
    cases: list[tuple[str, dict[str, Any]]] = [
        ("max_tokens 1e9", {"json": {**ok, "max_tokens": 1e9}}),
        ("max_tokens 10**400", {"content": _with(ok, b'"max_tokens": 1' + b"0" * 400)}),
        ("max_tokens of 5000 digits", {"content": _with(ok, b'"max_tokens": 1' + b"0" * 5000)}),
        ("max_tokens negative", {"json": {**ok, "max_tokens": -1}}),
        ("max_tokens a string", {"json": {**ok, "max_tokens": "12"}}),
        ("unknown model", {"json": {**ok, "model": "no-such-model"}}),
        ("deeply nested JSON", {"content": nested}),
        ("deeply nested member", {"content": _with(ok, b'"x": ' + nested)}),
        ("infinite deadline", {"content": _with(ok, b'"deadline": Infinity')}),
        ("NaN deadline", {"content": _with(ok, b'"slo": {"deadline_s": NaN}')}),
        ("1e999 temperature", {"content": _with(ok, b'"temperature": 1e999')}),
        ("tiny deadline", {"json": {**ok, "slo": {"deadline_s": 1e-9, "ttft_s": 1e-9}}}),
        ("tiny max wait", {"json": ok, "headers": {"x-slo-max-wait-s": "5e-324"}}),
        ("non-ASCII SLO header", {"json": ok, "headers": {"x-slo-program-id": "pr\u00f6gram".encode()}}),
        ("non-ASCII request id", {"json": ok, "headers": {"x-request-id": "r\u00e9q".encode()}}),
        ("huge header", {"json": ok, "headers": {"x-filler": "a" * 60_000}}),
        ("vllm_xargs a list", {"json": {**ok, "vllm_xargs": [1, 2]}}),
        ("vllm_xargs NaN tag", {"content": _with(ok, b'"vllm_xargs": {"slo_ttft_s": NaN}')}),
        ("priority from the client", {"json": {**ok, "priority": -1000}}),
        ("unknown SLO tier", {"json": {**ok, "slo": {"tier": "platinum"}}}),
        ("slo not an object", {"json": {**ok, "slo": [1]}}),
        ("messages not a list", {"json": {**ok, "messages": "hi"}}),
        ("body an array", {"json": [ok]}),
        ("body not JSON", {"content": b"\xff\xfe garbage"}),
        ("empty body", {"content": b""}),
        ("stream not a bool", {"json": {**ok, "stream": "yes"}}),
        ("n = 5", {"json": {**ok, "n": 5}}),
    ]
    if huge:
        cases += [
            ("64 MB body, declared", {"content": b"{" + b" " * (64 * MiB) + b"}"}),
            ("64 MB body, chunked", {"content": chunks(64 * MiB)}),
        ]
    return cases


FIELDS = (
    "model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "n", "slo",
    "deadline", "target_ttft", "vllm_xargs", "priority", "temperature", "tools", "tool_choice", "prompt",
    "logprobs", "user",
)  # fmt: skip
HEADERS = (
    "x-slo-tier",
    "x-slo-ttft-s",
    "x-slo-deadline-s",
    "x-slo-stage",
    "x-slo-stages",
    "x-slofleet-program-start",
    "x-request-id",
    "x-slo-nope",
)


def random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.15:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    if depth < 3 and roll < 0.3:
        return {rng.choice((*FIELDS, "x", "")): random_json(rng, depth + 1) for _ in range(rng.randrange(4))}
    return rng.choice(
        [
            None, True, False, 0, -1, 1, 2**31, 2**63, 10**30, -(10**30), 0.5, -0.0, 1e300, 3.0,
            "", "x", "gold", "\u00e9\u4e2d", "a" * rng.randrange(100), {"role": "user", "content": 3},
        ]
    )  # fmt: skip


def mutation(rng: random.Random, model: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A valid body with a few members replaced or added, and a few SLO headers (printable ASCII)."""
    body = valid_body(model)
    for _ in range(rng.randrange(1, 4)):
        body[rng.choice(FIELDS)] = random_json(rng)
    if rng.random() < 0.5:
        del body["max_tokens"]  # the default (the context left) must also behave
    headers = {
        rng.choice(HEADERS): "".join(chr(rng.randrange(33, 127)) for _ in range(rng.randrange(1, 10)))
        for _ in range(rng.randrange(3))
    }
    return body, headers


def is_openai_error(payload: Any) -> bool:
    err = payload.get("error") if isinstance(payload, dict) else None
    return (
        isinstance(err, dict)
        and isinstance(err.get("message"), str)
        and {"type", "code", "param"} <= set(err)
    )
