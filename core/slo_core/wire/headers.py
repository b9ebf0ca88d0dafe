"""Headers the router sets on the request it forwards to a pod; a client may never set them itself.

With a tag key (proxy mode, a sidecar in the token path) the router signs them: the sidecar takes a
request's SLO, tier and tenant only when the signature holds, so a caller that reaches a sidecar
without the router cannot raise itself above its tier."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from slo_core.wire.signing import PREFIX, SIG_TAG, sign, verify

INTERNAL_PREFIX = "x-slofleet-"  # every header under it is stripped from client requests at the router
TENANT_HEADER = INTERNAL_PREFIX + "tenant"  # the tenant the router authenticated the request as
# a compound call's program start (unix seconds): when its first call reached the router
PROGRAM_START_HEADER = INTERNAL_PREFIX + "program-start"
REQUEST_ID_HEADER = "x-request-id"
SIGNATURE_HEADER = INTERNAL_PREFIX + "signature"  # the router's HMAC over the headers below


def _signed_part(headers: Mapping[str, str]) -> dict[str, str]:
    """What the signature covers: every ``x-slo*`` header (SLO, tier, tenant) and the request id."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if (low.startswith("x-slo") and low != SIGNATURE_HEADER) or low == REQUEST_ID_HEADER:
            out[PREFIX + "h:" + low] = value
    return out


def sign_headers(headers: Mapping[str, str], key: bytes, now_s: float) -> dict[str, str]:
    """``headers`` plus the router's signature over their SLO, tier, tenant and request id (proxy mode:
    the sidecar takes a request's SLO only from the router)."""
    return {**headers, SIGNATURE_HEADER: sign(_signed_part(headers), key, now_s)[SIG_TAG]}


def verify_headers(headers: Mapping[str, str], keys: Sequence[bytes], now_s: float) -> str | None:
    """None when ``headers`` carry a fresh signature by one of ``keys`` over what they say; else why not."""
    sig = headers.get(SIGNATURE_HEADER)
    if not sig:
        return "unsigned"
    return verify({**_signed_part(headers), SIG_TAG: sig}, keys, now_s)


def program_start_of(headers: Mapping[str, str]) -> float | None:
    """The router's program start (:data:`PROGRAM_START_HEADER`, unix seconds): None when absent, not
    a finite positive number, or malformed (the pod then dates the program from the call itself)."""
    raw = headers.get(PROGRAM_START_HEADER)
    if not raw or len(raw) > 32:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None
