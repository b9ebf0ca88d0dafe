"""Serving capacity (SLOs-Serve §6): the largest arrival rate at which ≥ 90% of requests meet their SLO.

Found by bisection over rates, assuming attainment falls as the rate grows: probe ``hi`` (if it
attains, the capacity is at least ``hi``: reported as ``hi`` with ``censored="above"``), probe ``lo``
(if it fails, the capacity is below ``lo``: reported as 0 with ``censored="below"``), then halve the
bracket ``iterations`` times or until it is narrower than ``tol_rps``. The capacity is the largest
probed rate that attained the target. ``attainment_at(rate)`` runs one simulation; multi-replica
capacities are divided by the replica count by the caller (SLOs-Serve reports per GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

DEFAULT_TARGET = 0.9


@dataclass
class CapacityResult:
    """The capacity found and every probe ``(rate_rps, attainment)`` in the order it was run."""

    capacity_rps: float
    target: float
    probes: list[tuple[float, float]] = field(default_factory=list)
    censored: Literal["above", "below"] | None = None


def serving_capacity(
    attainment_at: Callable[[float], float],
    lo_rps: float,
    hi_rps: float,
    *,
    target: float = DEFAULT_TARGET,
    iterations: int = 5,
    tol_rps: float = 0.0,
) -> CapacityResult:
    """Bisect ``[lo_rps, hi_rps]`` for the largest rate whose attainment is ≥ ``target``."""
    if not 0 < lo_rps < hi_rps:
        raise ValueError(f"need 0 < lo_rps < hi_rps, got {lo_rps} and {hi_rps}")
    if not 0 < target <= 1:
        raise ValueError(f"target is a fraction in (0, 1], got {target}")
    out = CapacityResult(capacity_rps=0.0, target=target)

    def probe(rate: float) -> bool:
        att = attainment_at(rate)
        out.probes.append((rate, att))
        return att >= target

    if probe(hi_rps):
        out.capacity_rps = hi_rps
        out.censored = "above"
        return out
    if not probe(lo_rps):
        out.censored = "below"
        return out
    good, bad = lo_rps, hi_rps
    for _ in range(iterations):
        if bad - good <= tol_rps:
            break
        mid = (good + bad) / 2.0
        if probe(mid):
            good = mid
        else:
            bad = mid
    out.capacity_rps = good
    return out


__all__ = ["DEFAULT_TARGET", "CapacityResult", "serving_capacity"]
