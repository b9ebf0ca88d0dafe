"""exp, log and log1p that give the same bits on every host: what the policies' decisions use.

numpy runs its own AVX-512 float64 ``exp``/``log`` kernels where the CPU has them and the C library's
elsewhere, and the two round some results differently in the last bit (9,190 of 200,000 ``exp``
results on random inputs). GMAX compares values computed from them (each request's probability of
finishing in time), so one flipped comparison changes a decision and a long simulation follows it:
the same sweep run gave 6 preemptions with numpy's AVX-512 kernels and 24 with the C library's, and
the demo's simulated goodput moved with the host (bench/results/sim_speed/deterministic_math.md). The
functions here use only operations IEEE-754 rounds the same everywhere (+, −, ×, ÷, scaling by 2ᵏ,
round-half-even), one at a time and in a fixed order, so the simulator on a laptop and the engine
plugin on a GPU host decide alike. The scalar twins (``*_f``) perform the same operations on Python
floats, so they give the array forms' bits (tested), and arrays of up to a dozen elements are computed
with them. Within 1 ulp of the C library's result for exp and log, 2 for log1p (tested). The array
forms' fixed cost is ~20 µs a call (numpy's ~0.3), which a GMAX decision over more than a dozen
requests pays about four times (fit_probability takes one log and one exp for all its arguments):
+0–8 % simulation time, +0.4 ms on a decision over 5,000 queued requests (the same file).

``exp``: x = k·ln 2 + r with a two-part ln 2 (Cody–Waite; k·LN2_HI is exact), |r| ≤ ln 2 / 2, then
1 + r + r²·(1/2! + r/3! + … + r¹¹/13!) (truncation below 4e-18) scaled by 2ᵏ. ``log``: x = 2ᵉ·m with
m in [√½, √2), f = m − 1 (exact), s = f / (2 + f), log(1 + f) = f − (f²/2 − s·(f²/2 + R)) with
R = Σ 2s²ᵏ/(2k + 1), k = 1..10 (truncation below 3e-19), plus e·ln 2 in two parts. ``log1p``:
Goldberg's correction log(u)·x/(u − 1), u = 1 + x (exact where u is).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

_LN2_HI = 6.93147180369123816490e-01  # ln 2's leading 32 bits: k · _LN2_HI is exact for |k| < 2**20
_LN2_LO = 1.90821492927058770002e-10  # ln 2 − _LN2_HI
_INV_LN2 = 1.44269504088896338700e00
_EXP_MAX = 709.782712893383973096
_EXP_MIN = -745.13321910194110842
_SQRT_HALF = 0.70710678118654752440
_EXP_C = tuple(1.0 / math.factorial(n) for n in range(2, 14))  # 1/n!, n = 2..13
_LOG_C = tuple(2.0 / (2 * k + 1) for k in range(1, 11))  # 2/(2k + 1), k = 1..10
# up to this many elements the scalar twins are cheaper than the array form's ~20 ufunc calls
# (4 elements: 8 µs against 45; 16: 39 against 46) and give the same bits
_SCALAR_MAX = 12


def _by_scalars(f: Callable[[float], float], a: F64) -> F64:
    out: F64 = np.array([f(v) for v in a.ravel().tolist()], dtype=np.float64).reshape(a.shape)
    return out


def exp(x: npt.ArrayLike) -> F64:
    """eˣ elementwise (in place after the first steps; the scalar twin's order of operations)."""
    a = np.asarray(x, dtype=np.float64)
    if a.size <= _SCALAR_MAX:
        return _by_scalars(exp_f, a)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        k = np.clip(a, -800.0, 800.0)
        k *= _INV_LN2
        np.rint(k, out=k)
        r = k * _LN2_HI
        np.subtract(a, r, out=r)
        t = k * _LN2_LO
        r -= t
        p = r * _EXP_C[-1]
        for c in reversed(_EXP_C[1:-1]):
            p += c
            p *= r
        p += _EXP_C[0]
        np.multiply(r, r, out=t)
        p *= t
        p += r
        p += 1.0
        bad = bool((~((a >= _EXP_MIN) & (a <= _EXP_MAX))).any())
        if bad:
            k[np.isnan(k)] = 0.0
        np.ldexp(p, k.astype(np.int32), out=p)
        if bad:
            p[a > _EXP_MAX] = np.inf
            p[a < _EXP_MIN] = 0.0
            nan = np.isnan(a)
            p[nan] = a[nan]
    out: F64 = p
    return out


def exp_f(x: float) -> float:
    """:func:`exp` of one float: the same operations on Python floats, so the same bits."""
    x = float(x)
    if math.isnan(x):
        return x
    if x > _EXP_MAX:
        return math.inf
    if x < _EXP_MIN:
        return 0.0
    k = float(round(min(max(x, -800.0), 800.0) * _INV_LN2))
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = r * _EXP_C[-1]
    for c in reversed(_EXP_C[1:-1]):
        p = (p + c) * r
    p = p + _EXP_C[0]
    y = ((p * (r * r)) + r) + 1.0
    try:
        return math.ldexp(y, int(k))
    except OverflowError:
        return math.inf


def log(x: npt.ArrayLike) -> F64:
    """ln x elementwise (0 → −inf, negative → nan)."""
    a = np.asarray(x, dtype=np.float64)
    if a.size <= _SCALAR_MAX:
        return _by_scalars(log_f, a)
    with np.errstate(invalid="ignore", divide="ignore"):
        f, e = np.frexp(a)
        small = f < _SQRT_HALF
        np.add(f, f, out=f, where=small)
        e -= small
        f -= 1.0
        s = f + 2.0
        np.divide(f, s, out=s)
        z = s * s
        p = z * _LOG_C[-1]
        for c in reversed(_LOG_C[1:-1]):
            p += c
            p *= z
        p += _LOG_C[0]
        p *= z
        h = f * 0.5
        h *= f
        p += h
        p *= s
        dk = e.astype(np.float64)
        np.multiply(dk, _LN2_LO, out=z)
        p += z
        h -= p
        h -= f
        dk *= _LN2_HI
        dk -= h
        bad = ~((a > 0.0) & (a < np.inf))
        if bad.any():
            dk[a == np.inf] = np.inf
            dk[a == 0.0] = -np.inf
            dk[a < 0.0] = np.nan
            nan = np.isnan(a)
            dk[nan] = a[nan]
    out: F64 = dk
    return out


def log_f(x: float) -> float:
    """:func:`log` of one float: the same operations on Python floats, so the same bits."""
    x = float(x)
    if math.isnan(x) or x == math.inf:
        return x
    if x < 0.0:
        return math.nan
    if x == 0.0:
        return -math.inf
    m, e = math.frexp(x)
    if m < _SQRT_HALF:
        m, e = m + m, e - 1
    dk = float(e)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    p = z * _LOG_C[-1]
    for c in reversed(_LOG_C[1:-1]):
        p = (p + c) * z
    p = (p + _LOG_C[0]) * z
    h = (f * 0.5) * f
    p = ((p + h) * s) + dk * _LN2_LO
    return dk * _LN2_HI - ((h - p) - f)


def log1p(x: npt.ArrayLike) -> F64:
    """ln(1 + x) elementwise (−1 → −inf, below → nan), accurate for small x too."""
    a = np.asarray(x, dtype=np.float64)
    u = 1.0 + a
    with np.errstate(invalid="ignore", divide="ignore"):
        out = log(u)
        corrected = out * (a / (u - 1.0))
    res: F64 = np.where(u == 1.0, a, np.where(np.isinf(a) | (u == 0.0), out, corrected))
    return res


def log1p_f(x: float) -> float:
    """:func:`log1p` of one float (the same bits)."""
    x = float(x)
    u = 1.0 + x
    if u == 1.0:
        return x
    if u == 0.0 or math.isinf(x):
        return log_f(u)
    return log_f(u) * (x / (u - 1.0))
