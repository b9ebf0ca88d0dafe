"""Serving capacity by bisection: the largest rate with ≥ 90% attainment (SLOs-Serve §6)."""

from __future__ import annotations

import pytest

from slo_core.metrics.capacity import serving_capacity


def _step(cap_rps: float):  # type: ignore[no-untyped-def]
    """A system that attains 100% up to cap_rps and 50% above."""
    return lambda rate: 1.0 if rate <= cap_rps else 0.5


def test_bisection_brackets_the_true_capacity() -> None:
    res = serving_capacity(_step(5.3), 1.0, 9.0, iterations=6)
    assert res.censored is None
    assert 5.3 - 8.0 / 2**6 <= res.capacity_rps <= 5.3
    # every reported capacity was itself probed and attained the target
    assert (res.capacity_rps, 1.0) in res.probes
    assert len(res.probes) == 2 + 6


def test_capacity_uses_the_90_percent_target() -> None:
    # attainment falls linearly from 1.0 at 0 rps to 0.0 at 10 rps: 90% at exactly 1 rps
    res = serving_capacity(lambda r: 1.0 - r / 10.0, 0.5, 8.0, iterations=12)
    assert res.capacity_rps == pytest.approx(1.0, abs=0.01)


def test_censored_above_and_below() -> None:
    above = serving_capacity(_step(100.0), 1.0, 8.0)
    assert above.censored == "above" and above.capacity_rps == 8.0 and len(above.probes) == 1
    below = serving_capacity(_step(0.5), 1.0, 8.0)
    assert below.censored == "below" and below.capacity_rps == 0.0


def test_tolerance_stops_early_and_bad_brackets_are_errors() -> None:
    res = serving_capacity(_step(4.0), 1.0, 9.0, iterations=20, tol_rps=1.0)
    assert len(res.probes) == 2 + 3  # 8 -> 4 -> 2 -> 1 wide
    with pytest.raises(ValueError, match="lo_rps < hi_rps"):
        serving_capacity(_step(1.0), 5.0, 5.0)
    with pytest.raises(ValueError, match="target"):
        serving_capacity(_step(1.0), 1.0, 5.0, target=1.5)
