"""History of pattern graphs: incremental matching, decayed-reuse eviction, k-medoids compaction.

Matching (JITServe §4.1): a running compound request reveals its stages one by one. Candidates are
history graphs with more stages than seen whose identities agree on every stage seen so far (and on
the stage now starting, when its model/tool is known): others are pruned for good. Each survivor's
similarity is the mean over seen stages of w·k(node) + (1 − w)·k(edge), k a Gaussian kernel on
log output (node) and log input (edge) weights. The best survivor's φ(s) sets the next sub-deadline.
Reuse counts decay ×0.9 per hour; at capacity the least-reused graph is evicted. K-medoids (PAM-style
alternation) compacts the history offline to representative graphs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field

from slo_core import detmath
from slo_core.predict.patterns import F64, PatternGraph, Stage, gaussian_exponent, gaussian_kernel, ident_hash

I64 = npt.NDArray[np.int64]


class MatchParams(BaseModel):
    """Similarity and history-keeping knobs."""

    sigma_node: float = Field(0.5, gt=0, description="kernel width on ln(output tokens) (log units)")
    sigma_edge: float = Field(0.5, gt=0, description="kernel width on ln(input tokens) (log units)")
    node_weight: float = Field(0.5, ge=0, le=1, description="weight of node vs edge similarity (fraction)")
    capacity: int = Field(10_000, ge=1, description="graphs kept before eviction (count)")
    decay_per_hour: float = Field(0.9, gt=0, le=1, description="reuse decay factor per hour (ratio)")
    top_k: int = Field(
        1, ge=1, description="average φ over this many best matches (1 = the paper's best match) (count)"
    )


class PatternHistory:
    """Stored graphs as padded arrays (rows = graphs, columns = stages) for vectorized matching."""

    def __init__(self, params: MatchParams | None = None, max_stages: int = 32) -> None:
        self.params = params or MatchParams()
        self._n = 0
        self.graphs: list[bytes] = []
        self._resize(64, max_stages)

    def _resize(self, rows: int, cols: int) -> None:
        """(Re)allocate the arrays, keeping the first ``len(self)`` rows."""
        old = dict(self.__dict__)
        self.ident: I64 = np.full((rows, cols), -1, np.int64)
        self.node: F64 = np.zeros((rows, cols))
        self.edge: F64 = np.zeros((rows, cols))
        self.share: F64 = np.ones((rows, cols))
        self.n_stages: I64 = np.zeros(rows, np.int64)
        self.reuse: F64 = np.zeros(rows)
        self.reuse_at_s: F64 = np.zeros(rows)
        n = self._n
        for name in ("ident", "node", "edge", "share", "n_stages", "reuse", "reuse_at_s"):
            prev = old.get(name)
            if prev is None or n == 0:
                continue
            cur = getattr(self, name)
            if cur.ndim == 1:
                cur[:n] = prev[:n]
            else:
                c = min(cols, prev.shape[1])
                cur[:n, :c] = prev[:n, :c]

    def __len__(self) -> int:
        return self._n

    def graph(self, i: int) -> PatternGraph:
        return PatternGraph.from_bytes(self.graphs[i])

    def decayed_reuse(self, now_s: float) -> F64:
        hours = np.maximum(0.0, now_s - self.reuse_at_s[: self._n]) / 3600.0
        out: F64 = self.reuse[: self._n] * self.params.decay_per_hour**hours
        return out

    def add(self, graph: PatternGraph, now_s: float = 0.0, reuse: float = 1.0) -> int:
        """Store a finished request's graph (evicting the least-reused one at capacity); its row."""
        if self._n >= self.params.capacity:
            row = int(np.argmin(self.decayed_reuse(now_s)))
        else:
            if self._n == self.ident.shape[0]:
                self._resize(2 * self._n, self.ident.shape[1])
            row = self._n
            self._n += 1
            self.graphs.append(b"")
        if len(graph) > self.ident.shape[1]:
            self._resize(self.ident.shape[0], max(len(graph), 2 * self.ident.shape[1]))
        stored = graph.to_bytes()
        g = PatternGraph.from_bytes(stored)  # match on exactly what is stored
        n = len(g)
        self.graphs[row] = stored
        self.ident[row] = -1
        self.ident[row, :n] = [st.ident_code for st in g.stages]
        self.node[row, :n] = [st.node_weight for st in g.stages]
        self.edge[row, :n] = [st.edge_weight for st in g.stages]
        self.share[row] = 1.0
        self.share[row, :n] = g.shares()
        self.n_stages[row] = n
        self.reuse[row] = reuse
        self.reuse_at_s[row] = now_s
        return row

    def touch(self, row: int, now_s: float) -> None:
        """Count one reuse of ``row`` (decayed ×0.9 per hour since its last reuse)."""
        self.reuse[row] = float(self.decayed_reuse(now_s)[row]) + 1.0
        self.reuse_at_s[row] = now_s

    def distances(self) -> F64:
        """All pairwise :func:`graph_distance` values of the stored graphs, one numpy pass per row."""
        n, p = self._n, self.params
        ident, node, edge, stages = self.ident[:n], self.node[:n], self.edge[:n], self.n_stages[:n]
        cols = np.arange(ident.shape[1])
        out: F64 = np.zeros((n, n))
        for i in range(n):
            same = np.cumprod(ident == ident[i], axis=1).astype(bool)  # identities agree so far
            same &= cols < np.minimum(stages, stages[i])[:, None]
            k = stage_similarity(node, node[i], edge, edge[i], p)
            out[i] = 1.0 - (k * same).sum(axis=1) / np.maximum(stages, stages[i])
        return out

    def matcher(self) -> PatternMatcher:
        return PatternMatcher(self)

    def compact(self, k: int, rng: random.Random, now_s: float = 0.0) -> list[int]:
        """Replace the history by k medoid graphs (reuse = their clusters' summed reuse).

        Returns the medoids' former rows.
        """
        graphs = [self.graph(i) for i in range(self._n)]
        if k >= len(graphs):
            return list(range(len(graphs)))
        medoids, labels = kmedoids(self.distances(), k, rng)
        reuse = self.decayed_reuse(now_s)
        kept = [(graphs[m], float(reuse[labels == c].sum())) for c, m in enumerate(medoids)]
        self._n = 0
        self.graphs = []
        self._resize(max(64, k), self.ident.shape[1])
        for g, r in kept:
            self.add(g, now_s, reuse=r)
        return medoids


class PatternMatcher:
    """Incremental matching of one running compound request against a :class:`PatternHistory`."""

    def __init__(self, history: PatternHistory) -> None:
        self.history = history
        n = len(history)
        self.seen = 0
        self.alive: I64 = np.arange(n, dtype=np.int64)
        self.sim_sum: F64 = np.zeros(n)

    def observe(self, stage: Stage) -> None:
        """A stage finished: prune candidates whose identity differs there, add its similarity."""
        h, p, s = self.history, self.history.params, self.seen
        a = self.alive
        if s >= h.ident.shape[1]:
            self.alive = a[:0]
            self.seen += 1
            return
        a = a[(h.ident[a, s] == stage.ident_code) & (h.n_stages[a] > s)]
        k = stage_similarity(h.node[a, s], stage.node_weight, h.edge[a, s], stage.edge_weight, p)
        self.sim_sum[a] += k
        self.alive = a
        self.seen += 1

    def _eligible(self, next_ident: str | int | None) -> I64:
        h, s = self.history, self.seen
        a = self.alive[h.n_stages[self.alive] > s]
        if next_ident is not None and s < h.ident.shape[1]:
            code = next_ident if isinstance(next_ident, int) else ident_hash(next_ident)
            a = a[h.ident[a, s] == code]
        return a

    def best(self, next_ident: str | int | None = None) -> int | None:
        """Row of the most similar graph with a stage after those seen (matching ``next_ident``)."""
        h, s = self.history, self.seen
        a = self._eligible(next_ident)
        if len(a) == 0:
            return None
        score = self.sim_sum[a] / max(1, s)
        top = a[score >= score.max() - 1e-12]
        return int(top[np.argmax(h.reuse[top])])  # ties: the most reused pattern

    def next_share(self, next_ident: str | int | None = None, now_s: float | None = None) -> float | None:
        """φ(s + 1) of the best match — the share of the deadline the starting stage ends by — or None.

        With ``now_s`` the match counts as a reuse of that pattern.
        """
        h, s = self.history, self.seen
        k = h.params.top_k
        if k == 1:
            row = self.best(next_ident)
            if row is None:
                return None
            rows = np.asarray([row])
        else:
            a = self._eligible(next_ident)
            if len(a) == 0:
                return None
            score = self.sim_sum[a] / max(1, s)
            rows = a[np.argsort(-score, kind="stable")[:k]]
        if now_s is not None:
            for r in rows:
                h.touch(int(r), now_s)
        return float(h.share[rows, s].mean())


def stage_similarity(
    node: F64, node_ref: F64 | float, edge: F64, edge_ref: F64 | float, p: MatchParams
) -> F64:
    """w·k(node) + (1 − w)·k(edge) elementwise, k the :func:`gaussian_kernel` of each against its
    reference, both kernels' exponentials in one :func:`detmath.exp` call (its fixed cost of ~20 µs
    paid once a finished stage instead of twice; each value the two calls give, tested)."""
    x_node = gaussian_exponent(node, node_ref, p.sigma_node)
    x_edge = gaussian_exponent(edge, edge_ref, p.sigma_edge)
    e = detmath.exp(np.concatenate((x_node.ravel(), x_edge.ravel())))
    n = x_node.size
    k: F64 = p.node_weight * e[:n].reshape(x_node.shape)
    k += (1.0 - p.node_weight) * e[n:].reshape(x_edge.shape)
    return k


def graph_distance(a: PatternGraph, b: PatternGraph, params: MatchParams) -> float:
    """1 − mean stage similarity over the longer graph (identity mismatch or missing stage: 0)."""
    n = max(len(a), len(b))
    total = 0.0
    for sa, sb in zip(a.stages, b.stages, strict=False):
        if sa.ident_code != sb.ident_code:
            break
        total += params.node_weight * float(
            gaussian_kernel(sa.node_weight, sb.node_weight, params.sigma_node)
        )
        total += (1.0 - params.node_weight) * float(
            gaussian_kernel(sa.edge_weight, sb.edge_weight, params.sigma_edge)
        )
    return 1.0 - total / n


def distance_matrix(graphs: Sequence[PatternGraph], params: MatchParams) -> F64:
    n = len(graphs)
    d = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            d[i, j] = d[j, i] = graph_distance(graphs[i], graphs[j], params)
    return d


def kmedoids(dist: F64, k: int, rng: random.Random, max_iter: int = 50) -> tuple[list[int], I64]:
    """Alternating k-medoids on a distance matrix with k-medoids++ seeding: (medoid rows, labels)."""
    n = dist.shape[0]
    k = max(1, min(k, n))
    medoids = [rng.randrange(n)]
    while len(medoids) < k:
        near = dist[:, medoids].min(axis=1)
        weights = near * near
        total = float(weights.sum())
        if total <= 0.0:
            rest = [i for i in range(n) if i not in medoids]
            medoids.append(rest[0])
            continue
        medoids.append(int(np.searchsorted(np.cumsum(weights), rng.random() * total, side="right")))
    labels: I64 = np.argmin(dist[:, medoids], axis=1)
    for _ in range(max_iter):
        new = []
        for c in range(k):
            members = np.flatnonzero(labels == c)
            if len(members) == 0:
                new.append(medoids[c])
                continue
            cost = dist[np.ix_(members, members)].sum(axis=1)
            new.append(int(members[np.argmin(cost)]))
        new_labels: I64 = np.argmin(dist[:, new], axis=1)
        if new == medoids:
            break
        medoids, labels = new, new_labels
    return medoids, labels
