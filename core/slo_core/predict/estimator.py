"""OutputBoundEstimator: q-quantile output-length bounds at submission and refined while generating.

At submission: bound = Q_q(lengths | prompt) from the forest (JITServe §4.1), within [1, max_tokens];
q = ``quantile`` (0.95), or ``compound_quantile`` for the calls of compound programs when it is set.
Every ``refine_every_tokens`` generated tokens (checkpoint g = N·⌊generated/N⌋) the bound is
re-estimated as Q_q(lengths | features, length > g) — features from prompt + generated text when the
text is known, from the prompt alone otherwise (the simulator). Bounds only relax (loosen): a refined
bound is never below the bound it refines, never below generated + 1, never above max_tokens.
Where the forest's samples run out, the training marginal is conditioned instead, and past every
training length the bound grows geometrically. :meth:`OutputBoundEstimator.schedules` precomputes
every refinement of a request in one pass (the simulator's fast path).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from slo_core.predict import artefact
from slo_core.predict.features import FeatureParams, RequestFeatures, featurize, n_features
from slo_core.predict.forest import F64, ArrayForest, conditional_quantiles

_SCHEDULE_CACHE = 1 << 16  # text-free schedules kept (entries)
_Key = tuple[int, str, str, int, int | None]  # (prompt tokens, kind, model, max tokens, start bound)


class EstimatorParams(BaseModel):
    """Serving-time knobs of the bound estimator."""

    quantile: float = Field(0.95, gt=0.0, lt=1.0, description="quantile used as the upper bound (fraction)")
    compound_quantile: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description=(
            "quantile for the calls of compound programs (fraction); None: `quantile`. Lower values "
            "buy compound (and token) goodput with latency attainment; the trade-off is measured in "
            "bench/results/gmax/README.md"
        ),
    )
    refine_every_tokens: int = Field(50, ge=1, description="re-estimate every N generated tokens (tokens)")
    tail_growth: float = Field(
        1.25, ge=1.0, description="beyond every sample the forest knows: bound = g·growth (ratio)"
    )

    def quantile_for(self, kind: str) -> float:
        """The quantile that bounds a request of ``kind`` (a ``RequestKind`` value)."""
        if kind == "compound" and self.compound_quantile is not None:
            return self.compound_quantile
        return self.quantile


@dataclass(frozen=True, slots=True)
class BoundSchedule:
    """A request's bound at every refinement checkpoint: ``bounds_tokens[k]`` holds for g ∈ [kN, (k+1)N)."""

    every_tokens: int
    max_tokens: int
    bounds_tokens: tuple[int, ...]

    def at(self, generated_tokens: int) -> int:
        """The bound after ``generated_tokens`` tokens (never below them + 1, never above max_tokens)."""
        g = max(0, generated_tokens)
        b = self.bounds_tokens[min(g // self.every_tokens, len(self.bounds_tokens) - 1)]
        return max(min(max(b, g + 1), self.max_tokens), g, 1)

    def held(self, generated_tokens: int) -> tuple[int, int]:
        """``(at(g), until)``: the bound after ``g`` tokens and the first count past ``g`` where it may
        change (``at(h) == at(g)`` for every ``g <= h < until``), so a caller that sees the count grow
        one token at a time asks again only when it reaches ``until``."""
        g = max(0, generated_tokens)
        last = len(self.bounds_tokens) - 1
        k = min(g // self.every_tokens, last)
        b = self.bounds_tokens[k]
        bracket_end = (k + 1) * self.every_tokens if k < last else 1 << 62
        cap = self.max_tokens
        if b >= cap and g <= cap:  # at(h) = cap for h <= cap in this bracket
            return max(cap, 1), min(bracket_end, cap + 1)
        if g + 1 <= b <= cap:  # at(h) = b while h + 1 <= b in this bracket
            return max(b, 1), min(bracket_end, b)
        return self.at(g), g + 1


@dataclass(frozen=True, slots=True)
class BoundQuery:
    """One request for :meth:`OutputBoundEstimator.bounds` (generated_tokens = 0: a submission bound)."""

    prompt_text: str | None
    prompt_tokens: int
    kind: str = ""
    max_tokens: int = 1 << 30
    generated_tokens: int = 0
    generated_text: str | None = None
    bound_at_start: int | None = None
    model: str = ""


class OutputBoundEstimator:
    """Quantile-forest output-length bounds (see the module docstring)."""

    def __init__(
        self,
        forest: ArrayForest,
        features: FeatureParams,
        params: EstimatorParams | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        width = n_features(features)
        if int(forest.feature.max()) >= width:
            raise artefact.ArtefactError("forest uses features beyond the recorded feature width")
        self.forest = forest
        self.features = features
        self._params = params or EstimatorParams()
        self.meta = dict(meta or {})
        self._marginal = (forest.marginal.astype(np.float64), np.ones(len(forest.marginal)))
        # text-free schedules depend only on (tokens, kind, model, cap, start): the simulator's case
        self._schedule_cache: dict[_Key, BoundSchedule] = {}

    @property
    def params(self) -> EstimatorParams:
        return self._params

    @params.setter
    def params(self, value: EstimatorParams) -> None:
        """New knobs (e.g. ``slofleet predictor eval --quantile``) invalidate precomputed schedules."""
        self._params = value
        self._schedule_cache.clear()

    @property
    def training_mean_tokens(self) -> float:
        """Mean output length of the training rows (the mean-length baseline)."""
        return float(self._marginal[0].mean())

    # ---- one request ----------------------------------------------------------------------
    def bound(self, prompt_text: str | None, prompt_tokens: int, kind: str, max_tokens: int) -> int:
        """Upper bound on the total output tokens of a request about to be scheduled."""
        return self.bounds([BoundQuery(prompt_text, prompt_tokens, kind, max_tokens)])[0]

    def refine(  # noqa: PLR0917 - the sidecar's fixed positional API
        self,
        bound_at_start: int,
        prompt_text: str | None,
        prompt_tokens: int,
        generated_tokens: int,
        generated_text: str | None,
        kind: str,
        max_tokens: int,
    ) -> int:
        """The bound after ``generated_tokens`` tokens (pass the latest bound as ``bound_at_start``)."""
        q = BoundQuery(
            prompt_text, prompt_tokens, kind, max_tokens, generated_tokens, generated_text, bound_at_start
        )
        return self.bounds([q])[0]

    # ---- many at once ---------------------------------------------------------------------
    def bounds(self, batch: Sequence[BoundQuery]) -> list[int]:
        """Bounds for many requests in one forest pass (submission or refinement per query)."""
        if not batch:
            return []
        step = self.params.refine_every_tokens
        feats = [self._features_of(b) for b in batch]
        leaves = self.forest.leaves(featurize(feats, self.features))
        out: list[int] = []
        for b, row in zip(batch, leaves, strict=True):
            g = max(0, int(b.generated_tokens))
            checkpoint = (g // step) * step
            vals, w = self.forest.distribution(row)
            above = np.asarray([checkpoint], dtype=np.float64)
            est = float(self.quantiles_above(vals, w, above, self.params.quantile_for(b.kind))[0])
            out.append(self._finish(b, g, est))
        return out

    def schedules(self, batch: Sequence[BoundQuery]) -> list[BoundSchedule]:
        """Every refinement of each query at once: the bound at g = 0, N, 2N, … up to max_tokens.

        ``schedule.at(g)`` equals ``refine(bound(...), ..., g, None, ...)`` without another forest
        pass: what a simulator needs to refine thousands of requests cheaply. Generated text is not
        known in advance, so queries are featurized from the prompt alone.
        """
        if not batch:
            return []
        out: list[BoundSchedule | None] = [None] * len(batch)
        shared: dict[_Key, list[int]] = {}  # one computation per distinct text-free query
        own: list[int] = []  # queries with text are computed one by one
        for i, b in enumerate(batch):
            if b.prompt_text is not None:
                own.append(i)
                continue
            key = self._cache_key(b)
            hit = self._schedule_cache.get(key)
            if hit is None:
                shared.setdefault(key, []).append(i)
            else:
                out[i] = hit
        groups: list[tuple[_Key | None, list[int]]] = [(None, [i]) for i in own]
        groups += list(shared.items())
        if groups:
            computed = self._compute_schedules([batch[rows[0]] for _, rows in groups])
            for (group_key, rows), sched in zip(groups, computed, strict=True):
                for i in rows:
                    out[i] = sched
                if group_key is not None and len(self._schedule_cache) < _SCHEDULE_CACHE:
                    self._schedule_cache[group_key] = sched
        return [s for s in out if s is not None]

    @staticmethod
    def _cache_key(b: BoundQuery) -> _Key:
        return (b.prompt_tokens, b.kind, b.model, b.max_tokens, b.bound_at_start)

    def _compute_schedules(self, batch: Sequence[BoundQuery]) -> list[BoundSchedule]:
        step = self.params.refine_every_tokens
        feats = [self._features_of(dataclasses.replace(b, generated_text=None)) for b in batch]
        leaves = self.forest.leaves(featurize(feats, self.features))
        out: list[BoundSchedule] = []
        for b, row in zip(batch, leaves, strict=True):
            cap = max(1, int(b.max_tokens))
            checkpoints = np.arange(0, cap + step, step, dtype=np.float64)
            vals, w = self.forest.distribution(row)
            est = np.ceil(self.quantiles_above(vals, w, checkpoints, self.params.quantile_for(b.kind)))
            est = np.maximum(est, checkpoints + 1.0)
            if b.bound_at_start is not None:
                est = np.maximum(est, float(b.bound_at_start))
            est = np.minimum(np.maximum.accumulate(est), cap)
            out.append(BoundSchedule(step, cap, tuple(est.astype(np.int64).tolist())))
        return out

    def raw_quantile_schedules(self, batch: Sequence[BoundQuery], limit: int = 4096) -> list[F64]:
        """Per query, ``Q_q(L | L > jN, x)`` at checkpoints j = 0 … ⌈max_tokens/N⌉ (at most ``limit``),
        prompt features only, with no monotone or cap adjustment: the raw material the online
        calibration (:mod:`slo_core.predict.calibration`) scales."""
        if not batch:
            return []
        step = self.params.refine_every_tokens
        feats = [self._features_of(dataclasses.replace(b, generated_text=None)) for b in batch]
        leaves = self.forest.leaves(featurize(feats, self.features))
        out: list[F64] = []
        for b, row in zip(batch, leaves, strict=True):
            n = min(limit, max(1, int(b.max_tokens)) // step + 1)
            checkpoints = np.arange(n, dtype=np.float64) * step
            vals, w = self.forest.distribution(row)
            est = self.quantiles_above(vals, w, checkpoints, self.params.quantile_for(b.kind))
            out.append(np.maximum(est, checkpoints + 1.0))
        return out

    def distribution(self, query: BoundQuery) -> tuple[F64, F64]:
        """The forest's predicted length distribution for one query: (sorted lengths, weights)."""
        x = featurize([self._features_of(query)], self.features)
        return self.forest.distribution(self.forest.leaves(x)[0])

    # ---- helpers --------------------------------------------------------------------------
    def _features_of(self, b: BoundQuery) -> RequestFeatures:
        text = b.prompt_text
        if b.generated_text:
            text = (text or "") + b.generated_text
        return RequestFeatures(max(1, int(b.prompt_tokens)), text, b.kind, b.model)

    def quantiles_above(self, vals: F64, w: F64, above: F64, q: float) -> F64:
        """Q_q(length | length > a) for each a, with the fallbacks of the module docstring."""
        est = conditional_quantiles(vals, w, q, above)
        # the request outlived every similar sample: use all training lengths ...
        est = np.where(np.isnan(est), conditional_quantiles(*self._marginal, q, above), est)
        # ... and every training length: grow geometrically
        grow = np.maximum(above * self.params.tail_growth, above + self.params.refine_every_tokens)
        out: F64 = np.where(np.isnan(est), grow, est)
        return out

    @staticmethod
    def _finish(b: BoundQuery, generated: int, estimate: float) -> int:
        cap = max(1, int(b.max_tokens))
        value = max(math.ceil(estimate), generated + 1)
        if b.bound_at_start is not None:
            value = max(value, int(b.bound_at_start))
        return max(min(value, cap), generated, 1)

    # ---- persistence ----------------------------------------------------------------------
    def save(self, path: Path) -> str:
        """Write the artefact and its SHA-256 file; returns the digest."""
        meta = {
            **self.meta,
            "features": self.features.model_dump(),
            "params": self.params.model_dump(),
        }
        return artefact.save(path, self.forest.arrays(), meta)

    @classmethod
    def load(cls, path: Path, expected_sha256: str | None = None) -> OutputBoundEstimator:
        """Load a verified artefact (raises ArtefactError when the hash does not match)."""
        arrays, meta = artefact.load(path, expected_sha256)
        try:
            forest = ArrayForest.from_arrays(arrays)
            features = FeatureParams(**meta["features"])
            params = EstimatorParams(**meta["params"])
        except (KeyError, TypeError, ValueError) as exc:
            raise artefact.ArtefactError(f"{path}: malformed artefact ({exc})") from exc
        extra = {k: v for k, v in meta.items() if k not in ("features", "params", "format")}
        return cls(forest, features, params, extra)
