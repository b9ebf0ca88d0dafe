"""The shared HMAC key ring (current + previous key) and its rotation, as held in the chart's Secret.

The Secret's ``keys`` file reads::

    rotated-at=1763940000      (optional: when the first key became current, unix seconds)
    <current key>
    <previous key>             (optional)

Every verifier (the vLLM plugin, the sidecar's gRPC services) accepts the current and the previous
key and nothing older. A signer signs with the current key only once it has been current for
``SETTLE_S``: a Secret reaches each pod's mounted file within about a minute (the kubelet's sync
period plus its cache), at a different moment in each pod, and until every verifier has read the new
ring the previous key is the one they all know. Rotation (:func:`rotate`, done by the operator) makes
the current key the previous one and drops the older one; with a period of at least
:data:`MIN_PERIOD_S` a signature made with the previous key during the settle time stays verifiable
for its whole life (``signing.MAX_AGE_S``).

:class:`KeyFile` follows the mounted file (Secret volumes update in place, no restart): a cheap
``stat`` at most every ``check_s`` and a re-read when it changed; a file that turns unreadable or
invalid keeps the last good ring (logged), so a bad edit never demotes a fleet's traffic.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slo_core.wire.signing import MAX_AGE_S

log = logging.getLogger(__name__)

ROTATED_AT = "rotated-at="
MIN_KEY_CHARS = 16
SETTLE_S = 180.0  # the kubelet's Secret propagation (sync period + cache TTL) with margin
MIN_PERIOD_S = 2 * (SETTLE_S + MAX_AGE_S)


@dataclass(frozen=True)
class KeyRing:
    """The current key, the previous one (None right after the first), and when ``current`` took over."""

    current: bytes
    previous: bytes | None = None
    rotated_at_s: float | None = None

    @property
    def verify_keys(self) -> tuple[bytes, ...]:
        """What a verifier accepts: current and previous, nothing older."""
        return (self.current,) if self.previous is None else (self.current, self.previous)

    def signing_key(self, now_s: float, settle_s: float = SETTLE_S) -> bytes:
        """The previous key while the current one may not have reached every verifier, then the current."""
        if (
            self.previous is not None
            and self.rotated_at_s is not None
            and now_s < self.rotated_at_s + settle_s
        ):
            return self.previous
        return self.current

    def age_s(self, now_s: float) -> float:
        """How long the current key has been current (infinite when unknown: a hand-made Secret)."""
        return math.inf if self.rotated_at_s is None else now_s - self.rotated_at_s


def parse_keyring(text: str) -> KeyRing:
    """A ring from the Secret's ``keys`` file; a third key or more is ignored (older than previous)."""
    rotated_at: float | None = None
    keys: list[bytes] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(ROTATED_AT):
            try:
                rotated_at = float(line.removeprefix(ROTATED_AT))
            except ValueError:
                raise ValueError(f"tag key file: bad {ROTATED_AT!r} line") from None
            if not math.isfinite(rotated_at):
                raise ValueError(f"tag key file: bad {ROTATED_AT!r} line")
            continue
        if len(line) < MIN_KEY_CHARS:
            raise ValueError(f"every tag-signing key must be at least {MIN_KEY_CHARS} characters")
        keys.append(line.encode())
    if not keys:
        raise ValueError("tag key file holds no key")
    return KeyRing(keys[0], keys[1] if len(keys) > 1 else None, rotated_at)


def render_keyring(ring: KeyRing) -> str:
    lines = [] if ring.rotated_at_s is None else [f"{ROTATED_AT}{int(ring.rotated_at_s)}"]
    lines.append(ring.current.decode())
    if ring.previous is not None:
        lines.append(ring.previous.decode())
    return "\n".join(lines) + "\n"


def new_key() -> bytes:
    return secrets.token_urlsafe(36).encode()


def rotate(ring: KeyRing, now_s: float, key: bytes | None = None) -> KeyRing:
    """A new current key; the current one becomes the previous; the previous one is dropped."""
    return KeyRing(key or new_key(), ring.current, float(int(now_s)))


def rotation_due(ring: KeyRing, now_s: float, period_s: float) -> bool:
    return ring.age_s(now_s) >= period_s


class KeyFile:
    """A mounted key file, re-read when it changes (checked at most every ``check_s``)."""

    def __init__(
        self, path: str | Path, *, check_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = Path(path)
        self.check_s = check_s
        self._clock = clock
        self._stamp = self._stat()
        self._ring = parse_keyring(self.path.read_text(encoding="utf-8"))  # at start: fail loudly
        self._checked_s = clock()
        self.reloads = 0

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)  # follows the Secret volume's ..data symlink swap
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def __call__(self) -> KeyRing:
        return self.ring

    @property
    def ring(self) -> KeyRing:
        now = self._clock()
        if now - self._checked_s >= self.check_s:
            self._checked_s = now
            stamp = self._stat()
            if stamp is not None and stamp != self._stamp:
                self._reload(stamp)
        return self._ring

    def _reload(self, stamp: tuple[int, int, int]) -> None:
        try:
            ring = parse_keyring(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.error("tag key file %s unusable (%s): keeping the keys read before", self.path, exc)
            return
        self._stamp = stamp
        if ring != self._ring:
            self._ring = ring
            self.reloads += 1
            log.info("tag key file %s changed: keys reloaded", self.path)
