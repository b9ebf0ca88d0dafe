"""PROSERVE §4.1 online correction: momentum on measured/estimated, outliers clipped."""

from __future__ import annotations

import pytest

from slo_core.perf import OnlineCorrection


def test_converges_to_a_constant_ratio() -> None:
    c = OnlineCorrection(momentum=0.9)
    for _ in range(200):
        c.observe(estimated_s=0.020, measured_s=0.026)
    assert c.factor == pytest.approx(1.3, abs=1e-6)
    assert c.correct(0.1) == pytest.approx(0.13, abs=1e-6)
    assert c.observations == 200


def test_one_step_is_the_momentum_average() -> None:
    c = OnlineCorrection(momentum=0.8)
    assert c.observe(1.0, 2.0) == pytest.approx(0.8 * 1.0 + 0.2 * 2.0)


def test_outlier_is_clipped() -> None:
    c = OnlineCorrection(momentum=0.9, min_ratio=0.5, max_ratio=2.0)
    c.observe(0.01, 10.0)  # a 1000x stall counts as 2x
    assert c.factor == pytest.approx(0.9 + 0.1 * 2.0)
    c2 = OnlineCorrection(momentum=0.9, min_ratio=0.5, max_ratio=2.0)
    c2.observe(1.0, 1e-6)
    assert c2.factor == pytest.approx(0.9 + 0.1 * 0.5)


def test_non_positive_observations_are_ignored() -> None:
    c = OnlineCorrection()
    assert c.observe(0.0, 1.0) == 1.0
    assert c.observe(1.0, -1.0) == 1.0
    assert c.observations == 0


@pytest.mark.parametrize("momentum", [-0.1, 1.0, 1.5])
def test_momentum_out_of_range(momentum: float) -> None:
    with pytest.raises(ValueError, match="momentum"):
        OnlineCorrection(momentum=momentum)
