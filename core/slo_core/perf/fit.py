"""Non-negative fits of the iteration-time model (used by ``bench/fit_perf.py``).

    T = t_c + a·max(knee, N) + b·Σ(chunk·ctx) + d·ΣKV + s·P        (floor = a·knee)

For a fixed knee the model is linear in (t_c, a, b, d, s); the knee is searched on a grid. Rows are
weighted by 1/T so the fit minimizes *relative* error: squared (``loss="l2"``; non-negativity exact by
solving every subset of active columns) or absolute (``loss="l1"``: exactly the MAPE a fidelity table
reports, solved as a linear program with non-negative coefficients).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

COLUMNS = ("t_c", "a", "b", "d")
ALL_COLUMNS = (*COLUMNS, "s")  # s: cost per prefill chunk in the batch


@dataclass(frozen=True, slots=True)
class Points:
    """Observed iterations: tokens N, Σ(chunk·ctx), Σ decode KV tokens and the measured time (ms)."""

    n_tokens: FloatArray
    chunk_ctx: FloatArray
    kv_tokens: FloatArray
    time_ms: FloatArray
    n_prefills: FloatArray | None = None  # prefill chunks in the iteration (None: none)

    def __len__(self) -> int:
        return int(self.time_ms.shape[0])

    @property
    def prefills(self) -> FloatArray:
        return self.n_prefills if self.n_prefills is not None else np.zeros_like(self.time_ms)

    def subset(self, mask: npt.NDArray[np.bool_]) -> Points:
        return Points(
            self.n_tokens[mask],
            self.chunk_ctx[mask],
            self.kv_tokens[mask],
            self.time_ms[mask],
            None if self.n_prefills is None else self.n_prefills[mask],
        )


@dataclass(frozen=True, slots=True)
class Fit:
    """Fitted coefficients (ms, ms/token, ms/token², ms/KV token) and the knee (tokens)."""

    t_c_ms: float
    a_ms_per_token: float
    b_ms_per_token_ctx: float
    d_ms_per_kv_token: float
    knee_tokens: float
    s_ms_per_prefill: float = 0.0

    @property
    def floor_ms(self) -> float:
        return self.a_ms_per_token * self.knee_tokens

    def predict_ms(self, pts: Points) -> FloatArray:
        return (
            self.t_c_ms
            + self.a_ms_per_token * np.maximum(self.knee_tokens, pts.n_tokens)
            + self.b_ms_per_token_ctx * pts.chunk_ctx
            + self.d_ms_per_kv_token * pts.kv_tokens
            + self.s_ms_per_prefill * pts.prefills
        )


def nnls_small(x: FloatArray, y: FloatArray) -> tuple[FloatArray, float]:
    """Exact non-negative least squares for a few columns: best feasible subset; (coef, SSE)."""
    ncol = x.shape[1]
    best_coef = np.zeros(ncol)
    best_sse = float(np.sum(y**2))
    for k in range(1, ncol + 1):
        for cols in itertools.combinations(range(ncol), k):
            sub = x[:, cols]
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(coef < 0):
                continue
            sse = float(np.sum((sub @ coef - y) ** 2))
            if sse < best_sse - 1e-15:
                best_sse = sse
                best_coef = np.zeros(ncol)
                best_coef[list(cols)] = coef
    return best_coef, best_sse


def lad_relative(x: FloatArray, y: FloatArray) -> tuple[FloatArray, float]:
    """min Σ|x·c − y| over c ≥ 0 (rows already divided by the measured time): a linear program."""
    from scipy.optimize import linprog

    m, k = x.shape
    cost = np.concatenate([np.zeros(k), np.ones(2 * m)])
    a_eq = np.hstack([x, -np.eye(m), np.eye(m)])
    res = linprog(cost, A_eq=a_eq, b_eq=y, bounds=[(0, None)] * (k + 2 * m), method="highs")
    if not res.success:
        raise RuntimeError(f"L1 fit failed: {res.message}")
    return np.asarray(res.x[:k], dtype=np.float64), float(res.fun)


def default_knees(pts: Points) -> FloatArray:
    """Candidate knees: a geometric grid plus every observed N."""
    grid = np.geomspace(1.0, max(2.0, float(pts.n_tokens.max())), 96)
    return np.unique(np.concatenate([grid, pts.n_tokens]))


def fit_points(
    pts: Points,
    use: tuple[str, ...] = COLUMNS,
    knees: FloatArray | None = None,
    relative: bool = True,
    loss: str = "l2",
) -> Fit:
    """Fit the model to ``pts`` using only the columns in ``use`` (the others are fixed at zero).

    ``loss``: "l2" (least squares) or "l1" (least absolute error; with ``relative``, least MAPE).
    """
    unknown = set(use) - set(ALL_COLUMNS)
    if unknown:
        raise ValueError(f"unknown columns {sorted(unknown)}; choose from {ALL_COLUMNS}")
    if loss not in ("l1", "l2"):
        raise ValueError(f"unknown loss {loss!r}; choose l1 or l2")
    solve = lad_relative if loss == "l1" else nnls_small
    weights = 1.0 / pts.time_ms if relative else np.ones(len(pts))
    y = pts.time_ms * weights
    best: tuple[float, Fit] | None = None
    for knee in default_knees(pts) if knees is None else knees:
        full = {
            "t_c": np.ones(len(pts)),
            "a": np.maximum(knee, pts.n_tokens),
            "b": pts.chunk_ctx,
            "d": pts.kv_tokens,
            "s": pts.prefills,
        }
        x = np.column_stack([full[c] * weights for c in use])
        coef, err = solve(x, y)
        values = dict.fromkeys(ALL_COLUMNS, 0.0) | {c: float(v) for c, v in zip(use, coef, strict=True)}
        fit = Fit(values["t_c"], values["a"], values["b"], values["d"], float(knee), values["s"])
        if best is None or err < best[0] - 1e-15:
            best = (err, fit)
    assert best is not None
    return best[1]


def ape(predicted_ms: FloatArray, measured_ms: FloatArray) -> FloatArray:
    """Absolute percentage errors (%)."""
    return np.asarray(100.0 * np.abs(predicted_ms - measured_ms) / measured_ms, dtype=np.float64)


def residual_stats(fit: Fit, pts: Points) -> dict[str, float]:
    """Points, MAPE and max APE (%), RMSE (ms) of ``fit`` on ``pts``."""
    pred = fit.predict_ms(pts)
    err = ape(pred, pts.time_ms)
    return {
        "points": len(pts),
        "mape_pct": round(float(err.mean()), 3),
        "max_ape_pct": round(float(err.max()), 3),
        "rmse_ms": round(float(np.sqrt(np.mean((pred - pts.time_ms) ** 2))), 4),
    }
