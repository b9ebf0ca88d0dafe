"""numpy's float64 summation on plain floats, for the policies' plain-float paths that must match their
numpy references bit for bit (SlideBatching, Tempo)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["numpy_sum"]


def numpy_sum(xs: Sequence[float]) -> float:
    """``float(np.sum(xs))`` for float64 values, on plain floats: numpy's pairwise summation (blocks of
    up to 128 summed in 8 interleaved lanes, halved above that), so the result is bit-identical."""
    return _pairwise_sum(xs, 0, len(xs))


def _pairwise_sum(a: Sequence[float], lo: int, n: int) -> float:
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= 128:
        r0, r1, r2, r3, r4, r5, r6, r7 = a[lo : lo + 8]
        i = lo + 8
        stop = lo + n - n % 8
        while i < stop:
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < lo + n:
            res += a[i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise_sum(a, lo, n2) + _pairwise_sum(a, lo + n2, n - n2)
