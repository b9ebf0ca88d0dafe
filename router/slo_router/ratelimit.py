"""Per-tenant token buckets for request and token rates (answer 429 with a Retry-After)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    rate_per_s: float
    capacity: float
    level: float
    stamp: float

    def take(self, amount: float, now: float) -> float | None:
        """Take ``amount``; None on success, else seconds until it would fit."""
        self.level = min(self.capacity, self.level + max(0.0, now - self.stamp) * self.rate_per_s)
        self.stamp = now
        if amount <= self.level:
            self.level -= amount
            return None
        if amount > self.capacity:  # can never fit in one burst: pace it at the rate
            self.level -= amount
            return max(0.0, -self.level / self.rate_per_s)
        return (amount - self.level) / self.rate_per_s


class RateLimiter:
    """Requests/s and tokens/s per tenant, each with a burst of ``burst_s`` seconds of rate."""

    def __init__(self, burst_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._burst_s = burst_s
        self._clock = clock
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    def _bucket(self, tenant: str, what: str, rate: float, now: float) -> _Bucket:
        b = self._buckets.get((tenant, what))
        if b is None or b.rate_per_s != rate:
            cap = max(1.0, rate * self._burst_s)
            b = _Bucket(rate, cap, cap, now)
            self._buckets[(tenant, what)] = b
        return b

    def check(
        self, tenant: str, requests_per_s: float | None, tokens_per_s: float | None, tokens: int
    ) -> float | None:
        """Admit one request of ``tokens``; returns None, or the Retry-After in seconds."""
        now = self._clock()
        req = self._bucket(tenant, "req", requests_per_s, now) if requests_per_s else None
        if req is not None:
            wait = req.take(1, now)
            if wait is not None:
                return wait
        if tokens_per_s:
            wait = self._bucket(tenant, "tok", tokens_per_s, now).take(tokens, now)
            if wait is not None:
                if req is not None:
                    req.level += 1  # the request was not admitted: give its slot back
                return wait
        return None
