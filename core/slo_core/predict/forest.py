"""A quantile regression forest as plain arrays: tree traversal and leaf-sample quantiles in numpy.

Meinshausen's QRF: a query falls into one leaf per tree; every training sample in that leaf gets
weight 1/(T·|leaf|); the predicted distribution of the output length is the weighted set of those
samples' lengths, and the q-bound is its weighted q-quantile. Conditioning on "already longer than
g tokens" keeps only samples > g and renormalizes (JITServe §4.1 refinement without text).
Holding the forest as arrays (not sklearn objects) lets it be stored without pickle and served
without scikit-learn.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


def conditional_quantiles(values: F64, weights: F64, q: float, above: F64) -> F64:
    """For each threshold a in ``above``: the q-quantile of the distribution restricted to values > a.

    The q-quantile is the smallest value v with (weight of kept values ≤ v) ≥ q · kept weight; NaN
    where nothing is kept. ``values`` must be sorted ascending.
    """
    above = np.asarray(above, dtype=np.float64)
    if len(values) == 0:
        return np.full(above.shape, np.nan)
    cum = np.concatenate(([0.0], np.cumsum(weights)))
    start = np.searchsorted(values, above, side="right")
    base = cum[start]
    kept = cum[-1] - base
    target = base + q * kept * (1.0 - 1e-12)
    idx = np.searchsorted(cum[1:], target, side="left")
    idx = np.minimum(np.maximum(idx, start), len(values) - 1)
    out: F64 = np.where(kept > 0.0, values[idx], np.nan)
    return out


def weighted_quantile(values: F64, weights: F64, q: float) -> float:
    """q-quantile of a weighted sample (sorted values); NaN when there is no weight."""
    return float(conditional_quantiles(values, weights, q, np.asarray([-np.inf]))[0])


def conditional_quantile(values: F64, weights: F64, q: float, above: float) -> float:
    """q-quantile of the distribution restricted to values > ``above`` (sorted values); NaN if empty."""
    return float(conditional_quantiles(values, weights, q, np.asarray([above]))[0])


@dataclass(frozen=True)
class ArrayForest:
    """Trees flattened into shared arrays; leaves point at slices of ``leaf_values`` (sorted lengths).

    ``left``/``right`` are absolute node indices (−1 at leaves); ``roots`` the first node of each tree;
    ``leaf_start``/``leaf_count`` index ``leaf_values`` for leaf nodes (0/0 elsewhere).
    """

    left: I32
    right: I32
    feature: I32
    threshold: F64
    roots: I32
    leaf_start: I32
    leaf_count: I32
    leaf_values: F32
    max_depth: int
    marginal: F32  # every training length, sorted (the fallback distribution)

    @property
    def n_trees(self) -> int:
        return len(self.roots)

    def leaves(self, x: F32) -> I64:
        """Leaf node of every row in every tree, shape (rows, trees)."""
        left, right, feat, thr = self._walk
        nodes = np.broadcast_to(self.roots.astype(np.int64), (x.shape[0], self.n_trees)).copy()
        rows = np.arange(x.shape[0])[:, None]
        for depth in range(self.max_depth + 1):
            nxt = np.where(x[rows, feat[nodes]] <= thr[nodes], left[nodes], right[nodes])
            if depth % 8 == 7 and np.array_equal(nxt, nodes):
                break
            nodes = nxt
        return nodes

    @functools.cached_property
    def _walk(self) -> tuple[I64, I64, I64, F64]:
        """Children, feature and threshold with leaves pointing at themselves (branch-free walk)."""
        n = np.arange(len(self.left), dtype=np.int64)
        leaf = self.left < 0
        return (
            np.where(leaf, n, self.left).astype(np.int64),
            np.where(leaf, n, self.right).astype(np.int64),
            np.where(leaf, 0, self.feature).astype(np.int64),
            np.where(leaf, np.inf, self.threshold),
        )

    def distribution(self, leaves_row: I64) -> tuple[F64, F64]:
        """Sorted lengths and their QRF weights for one query's leaves (one per tree)."""
        starts = self.leaf_start[leaves_row].astype(np.int64)
        counts = self.leaf_count[leaves_row].astype(np.int64)
        first = np.cumsum(counts) - counts  # where each leaf's block begins in the gathered array
        idx = np.repeat(starts - first, counts) + np.arange(int(counts.sum()))
        vals = self.leaf_values[idx].astype(np.float64)
        w = np.repeat(1.0 / (self.n_trees * counts.astype(np.float64)), counts)
        order = np.argsort(vals, kind="stable")
        return vals[order], w[order]

    def arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        return {
            "left": self.left,
            "right": self.right,
            "feature": self.feature,
            "threshold": self.threshold,
            "roots": self.roots,
            "leaf_start": self.leaf_start,
            "leaf_count": self.leaf_count,
            "leaf_values": self.leaf_values,
            "max_depth": np.asarray([self.max_depth], dtype=np.int32),
            "marginal": self.marginal,
        }

    @classmethod
    def from_arrays(cls, a: dict[str, npt.NDArray[np.generic]]) -> ArrayForest:
        forest = cls(
            left=np.asarray(a["left"], dtype=np.int32),
            right=np.asarray(a["right"], dtype=np.int32),
            feature=np.asarray(a["feature"], dtype=np.int32),
            threshold=np.asarray(a["threshold"], dtype=np.float64),
            roots=np.asarray(a["roots"], dtype=np.int32),
            leaf_start=np.asarray(a["leaf_start"], dtype=np.int32),
            leaf_count=np.asarray(a["leaf_count"], dtype=np.int32),
            leaf_values=np.asarray(a["leaf_values"], dtype=np.float32),
            max_depth=int(np.asarray(a["max_depth"]).reshape(-1)[0]),
            marginal=np.sort(np.asarray(a["marginal"], dtype=np.float32)),
        )
        forest.check()
        return forest

    def check(self) -> None:
        """Reject inconsistent arrays (a corrupt file must fail loudly, never index out of bounds)."""
        n = len(self.left)
        same = len(self.right) == len(self.feature) == len(self.threshold) == len(self.leaf_start) == n
        if not same or len(self.leaf_count) != n or n == 0 or len(self.roots) == 0:
            raise ValueError("forest arrays have inconsistent lengths")
        for arr in (self.left, self.right):
            if arr.min() < -1 or arr.max() >= n:
                raise ValueError("forest child index out of range")
        if self.roots.min() < 0 or self.roots.max() >= n:
            raise ValueError("forest root index out of range")
        leaf = self.left < 0
        if len(self.marginal) == 0:
            raise ValueError("forest without training lengths")
        if (self.leaf_count[leaf] <= 0).any():
            raise ValueError("forest leaf without samples")
        if (self.leaf_start + self.leaf_count).max() > len(self.leaf_values) or self.leaf_start.min() < 0:
            raise ValueError("forest leaf slice out of range")
