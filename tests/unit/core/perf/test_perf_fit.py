"""The fitting routine recovers known coefficients, keeps them non-negative, and finds the knee."""

from __future__ import annotations

import numpy as np
import pytest

from slo_core.perf.fit import Fit, Points, fit_points, nnls_small


def _synthetic(fit: Fit, rng: np.random.Generator, noise: float = 0.0) -> Points:
    n = np.concatenate([rng.integers(1, 256, 40), rng.integers(256, 8192, 40)]).astype(float)
    s = np.where(n > 255, n * n, 0.0)
    k = np.where(n <= 255, n * rng.integers(100, 4000, n.size), 0.0)
    base = Points(n, s, k, np.ones_like(n))
    y = fit.predict_ms(base) * (1.0 + noise * rng.standard_normal(n.size))
    return Points(n, s, k, y)


def test_recovers_known_coefficients_and_knee() -> None:
    truth = Fit(
        t_c_ms=3.0, a_ms_per_token=0.02, b_ms_per_token_ctx=5e-7, d_ms_per_kv_token=4e-5, knee_tokens=300.0
    )
    got = fit_points(_synthetic(truth, np.random.default_rng(0)), knees=np.arange(50.0, 600.0, 10.0))
    assert got.t_c_ms == pytest.approx(3.0, rel=1e-6)
    assert got.a_ms_per_token == pytest.approx(0.02, rel=1e-6)
    assert got.b_ms_per_token_ctx == pytest.approx(5e-7, rel=1e-6)
    assert got.d_ms_per_kv_token == pytest.approx(4e-5, rel=1e-6)
    assert got.knee_tokens == pytest.approx(300.0)
    assert got.floor_ms == pytest.approx(6.0)


def test_noisy_fit_stays_close() -> None:
    truth = Fit(5.0, 0.05, 2e-6, 1e-4, 100.0)
    got = fit_points(_synthetic(truth, np.random.default_rng(1), noise=0.02))
    assert got.a_ms_per_token == pytest.approx(0.05, rel=0.05)
    assert got.d_ms_per_kv_token == pytest.approx(1e-4, rel=0.15)


def test_nnls_never_returns_a_negative_coefficient() -> None:
    x = np.column_stack([np.ones(5), np.arange(5.0)])
    y = 10.0 - 2.0 * np.arange(5.0)  # unconstrained slope would be -2
    coef, _ = nnls_small(x, y)
    assert (coef >= 0).all()
    assert coef[1] == 0.0
    assert coef[0] == pytest.approx(6.0)


def test_unknown_column_is_an_error() -> None:
    pts = Points(np.ones(3), np.zeros(3), np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match="unknown columns"):
        fit_points(pts, use=("t_c", "z"))


def test_l1_fit_recovers_the_per_prefill_term_and_ignores_an_outlier() -> None:
    rng = np.random.default_rng(2)
    truth = Fit(4.0, 0.03, 1e-6, 5e-5, 200.0, s_ms_per_prefill=15.0)
    n = rng.integers(256, 8192, 30).astype(float)
    q = rng.integers(1, 9, 30).astype(float)  # prefill chunks per batch
    base = Points(n, n * n / q, np.zeros_like(n), np.ones_like(n), q)
    y = truth.predict_ms(base)
    y[0] *= 1.5  # one bad measurement: least absolute error is not pulled by it
    pts = Points(base.n_tokens, base.chunk_ctx, base.kv_tokens, y, q)
    got = fit_points(pts, use=("t_c", "a", "b", "s"), knees=np.asarray([200.0]), loss="l1")
    assert got.s_ms_per_prefill == pytest.approx(15.0, rel=1e-4)
    assert got.a_ms_per_token == pytest.approx(0.03, rel=1e-4)
    l2 = fit_points(pts, use=("t_c", "a", "b", "s"), knees=np.asarray([200.0]))
    assert abs(l2.s_ms_per_prefill - 15.0) > abs(got.s_ms_per_prefill - 15.0)


def test_unknown_loss_is_an_error() -> None:
    pts = Points(np.ones(3), np.zeros(3), np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match="unknown loss"):
        fit_points(pts, loss="huber")
