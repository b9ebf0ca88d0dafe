"""The token a gRPC call to a sidecar's State/Analyzer services carries, so only slofleet's own
components (the router, the vLLM plugin) can read live request metadata or feed a pod's scheduler.

Metadata ``x-slofleet-auth: <unix seconds>.<hex>``, the hex an HMAC-SHA256 with the tag-signing key
ring (:mod:`slo_core.wire.keyring`) over the full method name and the time: a token is bound to one
method, lives ``MAX_AGE_S``, and never carries the key itself (a server that is not a sidecar learns
nothing it could reuse elsewhere). Pure functions; the server's interceptor is ``slo_sidecar.grpc_auth``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Sequence

METADATA_KEY = "x-slofleet-auth"
STATE_WATCH = "/slofleet.v1.State/Watch"
STATE_SNAPSHOT = "/slofleet.v1.State/Snapshot"
ANALYZER_GET_BOUNDS = "/slofleet.v1.Analyzer/GetBounds"
ANALYZER_REPORT = "/slofleet.v1.Analyzer/Report"
MAX_AGE_S = 120.0  # a client makes a fresh token per call; this only bounds a replayed one
MAX_SKEW_S = 30.0


def _mac(key: bytes, method: str, stamp: str) -> str:
    return hmac.new(key, f"slofleet-grpc\n{stamp}\n{method}".encode(), hashlib.sha256).hexdigest()


def call_token(key: bytes, method: str, now_s: float) -> str:
    """The metadata value for one call of ``method`` (e.g. ``/slofleet.v1.State/Watch``)."""
    stamp = str(int(now_s))
    return f"{stamp}.{_mac(key, method, stamp)}"


def check_call_token(
    token: str | None, method: str, keys: Sequence[bytes], now_s: float, max_age_s: float = MAX_AGE_S
) -> str | None:
    """None when ``token`` is a fresh token for ``method`` by one of ``keys``; else why not."""
    if not token:
        return "no token"
    stamp, _, mac = token.partition(".")
    if not stamp.isdigit() or len(stamp) > 12 or len(mac) != 64:
        return "malformed token"
    age = now_s - int(stamp)
    if not math.isfinite(age) or age > max_age_s or age < -MAX_SKEW_S:
        return "stale token"
    for key in keys:
        if hmac.compare_digest(_mac(key, method, stamp), mac):
            return None
    return "wrong key"
