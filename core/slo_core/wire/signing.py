"""HMAC signatures on the SLO tags an engine schedules by, so only slofleet's own path can set them.

The sidecar (which takes requests only from the router) signs the ``slo_*`` tags it puts in a request's
``vllm_xargs``; the vLLM scheduler plugin verifies them and schedules a request whose tags are missing,
forged or stale as best-effort (and counts it). A client that reaches vLLM directly cannot give itself
a tier. Keys come from a Secret the chart creates and the operator rotates (current + previous, see
:mod:`slo_core.wire.keyring`).

Pure functions (no I/O, no clock of their own): the signature covers every ``slo_`` tag in a canonical
JSON form plus the signing time, and is carried in the ``slo_sig`` tag as ``<unix seconds>.<hex>``.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

SIG_TAG = "slo_sig"
PREFIX = "slo_"
MAX_AGE_S = 600.0  # a request's tags are signed when it enters the pod; queues longer than this are rare
MAX_SKEW_S = 30.0


def parse_keys(text: str) -> list[bytes]:
    """The keys a verifier accepts from a Secret's file: current and previous (see ``keyring``)."""
    from slo_core.wire.keyring import parse_keyring  # keyring builds on this module

    return list(parse_keyring(text).verify_keys)


# one encoder (json.dumps with these options would build one per call)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False, default=str)


def _canonical(tags: Mapping[str, Any]) -> str:
    return _CANONICAL.encode({k: v for k, v in tags.items() if k.startswith(PREFIX) and k != SIG_TAG})


def _message(stamp: str, canonical: str) -> bytes:
    """What the MAC covers: the signing time, then the canonical tags."""
    return f"{stamp}\n{canonical}".encode()


def _payload(tags: Mapping[str, Any], stamp: str) -> bytes:
    return _message(stamp, _canonical(tags))


def _mac(key: bytes, payload: bytes) -> str:
    return hmac.digest(key, payload, "sha256").hex()  # OpenSSL's one-shot HMAC: no Python HMAC object


def sign(tags: Mapping[str, Any], key: bytes, now_s: float) -> dict[str, Any]:
    """``tags`` plus their signature in ``slo_sig``."""
    stamp = str(int(now_s))
    return {**tags, SIG_TAG: f"{stamp}.{_mac(key, _payload(tags, stamp))}"}


def signed_json(tags: Mapping[str, Any], key: bytes, now_s: float) -> bytes:
    """``json.dumps(sign(tags, key, now_s))`` (compact) with one encoding instead of two: when every tag
    is a ``slo_`` tag, the canonical form the signature covers is already the object's JSON."""
    if any(not k.startswith(PREFIX) or k == SIG_TAG for k in tags):
        return json.dumps(sign(tags, key, now_s), separators=(",", ":")).encode()
    stamp = str(int(now_s))
    body = _canonical(tags)
    sig = f"{stamp}.{_mac(key, _message(stamp, body))}"
    head = body[:-1] + ("," if len(body) > 2 else "")
    return f'{head}"{SIG_TAG}":"{sig}"}}'.encode()


def verify(
    tags: Mapping[str, Any] | None, keys: Sequence[bytes], now_s: float, max_age_s: float = MAX_AGE_S
) -> str | None:
    """None when the tags carry a valid, fresh signature by one of ``keys``; else why not."""
    if not tags:
        return "no tags"
    sig = tags.get(SIG_TAG)
    if not isinstance(sig, str) or "." not in sig:
        return "unsigned"
    stamp, _, mac = sig.partition(".")
    if not stamp.isdigit() or len(stamp) > 12:
        return "malformed signature"
    age = now_s - int(stamp)
    if not math.isfinite(age) or age > max_age_s or age < -MAX_SKEW_S:
        return "stale signature"
    try:
        payload = _payload(tags, stamp)
    except ValueError:  # NaN or infinity in a tag: never produced by a signer
        return "malformed tags"
    for key in keys:
        if hmac.compare_digest(_mac(key, payload), mac):
            return None
    return "forged signature"
