"""Per-tenant token buckets for request and token rates (answer 429 with a Retry-After).

A bucket charges only what it admits: a refused request leaves the level as it was, so no single
request, however large it claims to be, can push a tenant into debt. A request that fits the bucket's
capacity is always admitted once the bucket has refilled; one larger than the capacity can never fit,
so it is refused at once (:class:`RequestTooLarge`, a 4xx without Retry-After) and charged nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


class RequestTooLarge(Exception):
    """A request needs more than a bucket can ever hold (its capacity)."""

    def __init__(self, what: str, amount: float, capacity: float) -> None:
        super().__init__(f"{what} {amount:.0f} exceeds the burst capacity {capacity:.0f}")
        self.what, self.amount, self.capacity = what, amount, capacity


@dataclass
class _Bucket:
    rate_per_s: float
    capacity: float
    level: float
    stamp: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + max(0.0, now - self.stamp) * self.rate_per_s)
        self.stamp = now

    def take(self, amount: float, now: float) -> float | None:
        """Take ``amount``; None on success (charged), else seconds until it fits (nothing charged)."""
        self.refill(now)
        if amount <= self.level:
            self.level -= amount
            return None
        return (amount - self.level) / self.rate_per_s


class RateLimiter:
    """Requests/s and tokens/s per tenant, each with a burst of ``burst_s`` seconds of rate.

    ``share`` (0 < share <= 1) is the part of each tenant's fleet-wide rate this replica enforces:
    with N router replicas behind one Service each takes 1/N, so the fleet admits the tenant's rate.
    """

    def __init__(self, burst_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._burst_s = burst_s
        self._clock = clock
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self.share = 1.0

    def set_share(self, share: float) -> None:
        """This replica's part of every tenant's rate (1 / the number of ready router replicas)."""
        self.share = min(1.0, max(1e-6, float(share)))

    def _bucket(self, tenant: str, what: str, rate: float, now: float) -> _Bucket:
        rate = rate * self.share
        b = self._buckets.get((tenant, what))
        cap = max(1.0, rate * self._burst_s)
        if b is None:
            b = _Bucket(rate, cap, cap, now)
            self._buckets[(tenant, what)] = b
        elif b.rate_per_s != rate:  # a new rate or share: keep the level, bounded by the new capacity
            b.refill(now)
            b.rate_per_s, b.capacity, b.level = rate, cap, min(b.level, cap)
        return b

    def capacity(self, tenant: str, tokens_per_s: float | None) -> float | None:
        """The largest request (in tokens) this replica can ever admit for ``tenant``; None: unlimited."""
        if not tokens_per_s:
            return None
        return max(1.0, tokens_per_s * self.share * self._burst_s)

    def check(
        self, tenant: str, requests_per_s: float | None, tokens_per_s: float | None, tokens: int
    ) -> float | None:
        """Admit one request of ``tokens``; returns None, or the Retry-After in seconds.

        Raises :class:`RequestTooLarge` (nothing charged) when ``tokens`` exceeds the token bucket's
        capacity: waiting would never help.
        """
        now = self._clock()
        tok = self._bucket(tenant, "tok", tokens_per_s, now) if tokens_per_s else None
        if tok is not None and tokens > tok.capacity:
            raise RequestTooLarge("tokens", tokens, tok.capacity)
        req = self._bucket(tenant, "req", requests_per_s, now) if requests_per_s else None
        if req is not None:
            wait = req.take(1, now)
            if wait is not None:
                return wait
        if tok is not None:
            wait = tok.take(tokens, now)
            if wait is not None:
                if req is not None:
                    req.level += 1  # the request was not admitted: give its slot back
                return wait
        return None
