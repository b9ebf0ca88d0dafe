"""Online conformal calibration of the output-length bounds on served traffic, and bounds that tighten.

The forest's q-bound is only calibrated on the distribution it was trained on. Here every completed
request updates a calibration of the bound for its *stratum* (a string chosen by the caller: request
kind, tenant, model) and for each refinement *stage* it passed (stage j: after j·N generated tokens,
N = ``refine_every_tokens``; stages past ``max_stage`` share the last one):

- The *plan* of a request is the forest's raw conditional quantile at every checkpoint,
  ``raw[j] = Q_q(L | L > jN, x)`` from the leaf distributions — one forest pass at submission.
- Conformity score at stage j of a request that finished with L > jN tokens:
  ``s = log((L − jN) / (raw[j] − jN))``, the log-ratio of the *remaining* length to the forest's
  remaining-length bound (conformalized quantile regression with a multiplicative score).
- Correction ``θ`` of a (stratum, stage) cell = the conformal ⌈(n+1)(1−α_t)⌉-th smallest of the last
  ``window`` scores, and the issued bound is ``jN + (raw[j] − jN)·e^θ`` (within [g+1, max_tokens]).
  ``α_t`` follows adaptive conformal inference (Gibbs & Candès 2021): α_{t+1} = α_t + γ(α − err_t),
  err_t = 1 when the completion exceeded the bound the current correction gives. The sliding window
  forgets the old distribution within ``window`` completions; ACI removes what bias remains.
- Until a cell has ``min_scores`` scores its correction is 0 (the forest as trained), and the
  submission cell (stage 0, what admission rests on) only *tightens* the forest's bound (θ < 0) once
  it holds ``tighten_min_scores`` (default: a full window; later stages, reached by few requests,
  tighten after ``min_scores``):
  a bound that is too loose costs some efficiency, one that is too tight admits work that cannot
  finish in time, and a young sample is exactly the one most likely biased short (next point).
- **Requests still generating count too** (right-censoring). Completions alone are a biased sample
  whenever the traffic is not in steady state (after a start, a restart without state, a shift, an
  overload): the short requests of a cohort finish first, so the first scores are the smallest ones
  and the correction tightens below the target (measured in the simulator: the compound stratum's
  factor sat at 0.54-0.9 for the first ~50 s of an overloaded run whose final factor was 1.6, and
  GMAX filled the engine with calls it believed short). A request that has generated g tokens past
  checkpoint jN is a censored score ``s ≥ log((g − jN)/(raw[j] − jN))`` (how far it has run past the
  bound is known, its end is not); ``track``/``untrack`` register the requests in flight, and the
  correction is then the product-limit (Kaplan–Meier) quantile of completed and censored scores —
  with no request in flight exactly the conformal order statistic above. How long a request has run
  does not depend on how long it will run, so the censoring is uninformative, as KM needs.
- **The window is the latest arrivals**, not the latest completions: a score is stamped with its
  request's arrival time (``untrack`` returns it, ``observe`` takes it) and kept in arrival order,
  and requests in flight that arrived before the window's oldest score are outside it. Otherwise,
  under load, the last completions of a burst are its long requests and a correct bound loosens.
- **No correction without evidence**: a cell's θ stays 0 unless its scores reject, at the one-sided
  binomial level ``evidence_p``, that the forest's own bound (score ≤ 0) meets the target — too many
  misses to loosen, too few to tighten. Window noise alone never moves a forest that is right.
- **Per prompt-length band** (``prompt_bands``): the submission cell is also kept per band
  (:func:`prompt_band`, powers of two; cell key ``<stratum>#p<band>``; Mondrian conformal), since
  how wrong the forest is often depends on the prompt length. A band's own θ applies once it holds
  a full window; before that the larger of its θ and the stratum's.

Because every stage is calibrated on the requests that actually reached it, a refined bound is no
longer forced to stay above the submission bound: it is the calibrated conditional quantile of the
remaining length, so bound/true falls as tokens stream.

State is JSON (no pickle): each score carries its origin (replica id), a sequence number and its
request's arrival (wall) time, so states of several replicas merge by union (idempotent,
commutative) — see :meth:`merge`.
The same classes serve the sidecar and the simulator (``slo_core.sim.analyzer``).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, Field

from slo_core.predict.estimator import BoundQuery, OutputBoundEstimator
from slo_core.predict.forest import F64

FORMAT = "slofleet-calibration/1"
_SCORE_LIMIT = 8.0  # |log-ratio| beyond e^8 ≈ 3000× is clipped (a hostile or broken peer cannot blow up θ)
_MAX_CHECKPOINTS = 4096  # plans cover at most this many checkpoints; beyond, the tail growth rule


class CalibrationParams(BaseModel):
    """Knobs of the online calibration."""

    window: int = Field(
        200, ge=10, le=100_000, description="recent scores kept per stratum and stage (count)"
    )
    gamma: float = Field(0.005, ge=0.0, le=0.2, description="ACI step on the miscoverage level (fraction)")
    min_scores: int = Field(20, ge=1, description="scores a cell needs before it corrects the forest (count)")
    tighten_min_scores: int = Field(
        200,
        ge=1,
        description="scores the submission cell (stage 0) needs before it may tighten the forest's bound "
        "(count, at most the window): loosening is safe on little evidence, tightening admission on a "
        "young sample is not",
    )
    max_stage: int = Field(20, ge=0, le=1000, description="last stage with its own correction (checkpoints)")
    prompt_bands: bool = Field(
        True,
        description="the submission cell is also kept per prompt-length band (powers of two, 16..2048 "
        "tokens; Mondrian conformal): a band's own correction applies once it holds a full window, "
        "before that the larger of its and the stratum's (count of bands: 9)",
    )
    evidence_p: float = Field(
        0.1,
        gt=0.0,
        le=1.0,
        description="a cell corrects the forest only when its scores reject, at this one-sided binomial "
        "level, that the forest's own bound covers the target (loosening) or at most the target "
        "(tightening); 1.0: always (probability)",
    )
    tighten: bool = Field(
        True, description="refined bounds may fall below earlier ones (calibrated conditional quantile)"
    )


_BAND = "#p"  # a band cell's key: f"{stratum}{_BAND}{band}"
_MIN_BAND, _MAX_BAND = 3, 11  # prompt bands: < 16 tokens, [16, 32), …, [1024, 2048), ≥ 2048


def prompt_band(prompt_tokens: int) -> int:
    """The prompt-length band of a request: ⌊log2(tokens)⌋ within [3, 11] (9 bands)."""
    return min(max(int(prompt_tokens).bit_length() - 1, _MIN_BAND), _MAX_BAND)


def _split_band(key: str) -> tuple[str, int | None]:
    """(stratum, band) of a cell key; band None for a stratum's own cell."""
    base, sep, band = key.rpartition(_BAND)
    if sep and band.isdigit() and _MIN_BAND <= int(band) <= _MAX_BAND:
        return base, int(band)
    return key, None


@dataclass(frozen=True, slots=True)
class Plan:
    """A request's raw forest bounds at every checkpoint (``raw[j]`` for g ∈ [jN, (j+1)N)), and its
    prompt-length band (:func:`prompt_band`; −1: none, the stratum's cell alone)."""

    stratum: str
    every_tokens: int
    max_tokens: int
    raw: tuple[float, ...]
    tail_growth: float = 1.25
    band: int = -1

    def raw_at(self, stage: int) -> float:
        if stage < len(self.raw):
            return self.raw[stage]
        g = stage * self.every_tokens
        return max(g * self.tail_growth, g + self.every_tokens)


class LiveBound(Protocol):
    """A request in flight, as :meth:`OnlineCalibrator.track` reads it (its plan, tokens so far)."""

    @property
    def plan(self) -> Plan: ...

    @property
    def generated_tokens(self) -> int: ...


@dataclass(slots=True)
class _Cell:
    """One (stratum, stage): recent scores (origin, seq, unix time, score) and the ACI level."""

    alpha: float
    scores: deque[tuple[str, int, float, float]]
    theta: float = 0.0
    covered: int = 0  # completions within the issued bound (this stage), since start
    seen: int = 0
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=200))  # 1 = covered, last 200


class OnlineCalibrator:
    """Per (stratum, stage) conformal corrections, updated by every completion (thread-safe)."""

    def __init__(
        self,
        target: float = 0.95,
        params: CalibrationParams | None = None,
        origin: str = "local",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.params = params or CalibrationParams()
        self.origin = origin
        self._clock = clock
        self._cells: dict[tuple[str, int], _Cell] = {}
        # stratum -> id -> (request in flight, its arrival time on this calibrator's clock)
        self._live: dict[str, dict[int, tuple[LiveBound, float]]] = {}
        self._seq = 0
        self._lock = threading.Lock()
        self.updates = 0

    # ---- reading ------------------------------------------------------------------------------
    def stage_of(self, generated_tokens: int, every_tokens: int) -> int:
        return min(max(0, generated_tokens) // every_tokens, self.params.max_stage)

    def correction(self, stratum: str, stage: int) -> float:
        """θ of a cell (0 until it has ``min_scores`` scores)."""
        cell = self._cells.get((stratum, min(stage, self.params.max_stage)))
        return cell.theta if cell is not None else 0.0

    def _theta(self, plan: Plan, stage: int) -> float:
        """θ for ``plan`` at ``stage``: at submission its band's cell once that holds a full window,
        the larger of the band's and the stratum's while the band is young, else the stratum's."""
        theta = self.correction(plan.stratum, stage)
        if stage != 0 or plan.band < 0 or not self.params.prompt_bands:
            return theta
        cell = self._cells.get((f"{plan.stratum}{_BAND}{plan.band}", 0))
        if cell is None or len(cell.scores) < self.params.min_scores:
            return theta
        if len(cell.scores) >= min(self.params.tighten_min_scores, self.params.window):
            return cell.theta
        return max(cell.theta, theta)

    def bound(self, plan: Plan, generated_tokens: int) -> int:
        """The calibrated bound after ``generated_tokens`` tokens (in [g+1, max_tokens])."""
        g = max(0, int(generated_tokens))
        j = g // plan.every_tokens
        c = j * plan.every_tokens
        raw = plan.raw_at(j)
        theta = self._theta(plan, min(j, self.params.max_stage))
        value = math.ceil(c + max(raw - c, 1e-9) * math.exp(theta))
        return max(min(max(value, g + 1), plan.max_tokens), g, 1)

    # ---- learning -----------------------------------------------------------------------------
    def track(self, live: LiveBound) -> None:
        """``live`` arrived and is in flight: its progress counts as a censored score until
        :meth:`untrack`, and its arrival time orders its score in the windows (module docstring)."""
        now = self._clock()
        with self._lock:
            self._live.setdefault(live.plan.stratum, {})[id(live)] = (live, now)

    def untrack(self, live: LiveBound) -> float | None:
        """``live`` left (finished, aborted or dropped); idempotent. Returns its arrival time (pass it
        to :meth:`observe`), None if it was not tracked."""
        with self._lock:
            group = self._live.get(live.plan.stratum)
            entry = group.pop(id(live), None) if group is not None else None
            return entry[1] if entry is not None else None

    def in_flight(self) -> int:
        """How many tracked requests are in flight (all strata)."""
        with self._lock:
            return sum(len(group) for group in self._live.values())

    def _censored(self, key: str, stage: int) -> list[float]:
        """Censored scores of the requests in flight that passed checkpoint ``stage`` (its cell)."""
        stratum, band = _split_band(key)
        group = self._live.get(stratum)
        if not group:
            return []
        cell = self._cells.get((key, stage))
        # the window holds the latest `window` arrivals: the requests in flight that arrived before
        # its oldest score are outside it, as completions of that age would be
        full = cell is not None and len(cell.scores) == cell.scores.maxlen
        since = cell.scores[0][2] if cell is not None and full else -math.inf
        out = []
        for live, arrived_s in group.values():
            plan, g = live.plan, live.generated_tokens
            if (band is not None and plan.band != band) or arrived_s < since:
                continue
            c = stage * plan.every_tokens
            if g > c:
                out.append(_clip(math.log((g - c) / max(plan.raw_at(stage) - c, 1e-9))))
        return out

    def observe(
        self,
        plan: Plan,
        output_tokens: int,
        issued: Sequence[int] | None = None,
        arrived_s: float | None = None,
    ) -> None:
        """A request of ``plan`` finished naturally with ``output_tokens`` tokens.

        Updates every stage it passed. ``issued``: the bounds it was actually given at stages 0, 1, …
        (for the coverage figures); absent, coverage is judged against the current corrections.
        ``arrived_s``: its arrival time (what :meth:`untrack` returned); absent, now.
        """
        length = int(output_tokens)
        if length < 1:
            return
        now = self._clock() if arrived_s is None else float(arrived_s)
        last = (length - 1) // plan.every_tokens
        with self._lock:
            for j in range(min(last, len(plan.raw) + self.params.max_stage) + 1):
                c = j * plan.every_tokens
                if c >= length:
                    break
                raw = plan.raw_at(j)
                score = math.log((length - c) / max(raw - c, 1e-9))
                bound_now = self.bound(plan, c)
                given = issued[j] if issued is not None and j < len(issued) else bound_now
                keys = [plan.stratum]
                if j == 0 and plan.band >= 0 and self.params.prompt_bands:
                    keys.append(f"{plan.stratum}{_BAND}{plan.band}")
                for key in keys:
                    cell = self._cell(key, min(j, self.params.max_stage))
                    cell.seen += 1
                    cell.covered += int(length <= given)
                    cell.recent.append(int(length <= given))
                    err = 1.0 if length > bound_now else 0.0
                    alpha0 = 1.0 - self.target
                    cell.alpha = min(max(cell.alpha + self.params.gamma * (alpha0 - err), 1e-3), 0.5)
                    self._seq += 1
                    _insert(cell.scores, (self.origin, self._seq, now, _clip(score)))
                    self._refresh(cell, key, min(j, self.params.max_stage))
            self.updates += 1

    def _cell(self, stratum: str, stage: int) -> _Cell:
        cell = self._cells.get((stratum, stage))
        if cell is None:
            cell = _Cell(1.0 - self.target, deque(maxlen=self.params.window))
            self._cells[(stratum, stage)] = cell
        return cell

    def _refresh(self, cell: _Cell, stratum: str, stage: int) -> None:
        n = len(cell.scores)
        if n < self.params.min_scores:
            cell.theta = 0.0
            return
        s = np.sort(np.fromiter((x[3] for x in cell.scores), dtype=np.float64, count=n))
        censored = self._censored(stratum, stage)
        if censored:
            theta = km_quantile(s, np.sort(np.asarray(censored, dtype=np.float64)), cell.alpha)
        else:
            k = math.ceil((n + 1) * (1.0 - cell.alpha))
            theta = float(s[min(max(k, 1), n) - 1])
        if theta < 0.0 and stage == 0 and n < min(self.params.tighten_min_scores, self.params.window):
            theta = 0.0
        if theta != 0.0 and self.params.evidence_p < 1.0:
            # misses of the forest's own bound (score > 0): completed, and in flight already past it
            misses = int(np.count_nonzero(s > 0.0)) + sum(1 for c in censored if c > 0.0)
            total = n + sum(1 for c in censored if c > 0.0)
            alpha = 1.0 - self.target
            # loosening needs too many misses for a forest at its target; tightening, too few
            p = binom_sf(misses, total, alpha) if theta > 0.0 else binom_cdf(misses, total, alpha)
            if p >= self.params.evidence_p:
                theta = 0.0
        cell.theta = theta

    # ---- figures for metrics and reports ------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        """Per cell: stratum, stage, correction, scores held, ACI level, observed coverage."""
        with self._lock:
            out = []
            for (stratum, stage), cell in sorted(self._cells.items()):
                out.append(
                    {
                        "stratum": stratum,
                        "stage": stage,
                        "correction": round(cell.theta, 5),
                        "factor": round(math.exp(cell.theta), 5),
                        "scores": len(cell.scores),
                        "alpha": round(cell.alpha, 5),
                        "completions": cell.seen,
                        "coverage": cell.covered / cell.seen if cell.seen else None,
                        "coverage_recent": sum(cell.recent) / len(cell.recent) if cell.recent else None,
                    }
                )
            return out

    # ---- persistence and sharing --------------------------------------------------------------
    def to_json(self, origin_only: bool = False) -> dict[str, Any]:
        """State as JSON; ``origin_only``: only this replica's own scores (what peers fetch)."""
        with self._lock:
            cells = []
            for (stratum, stage), cell in self._cells.items():
                scores = [
                    [o, s, round(t, 3), v]
                    for o, s, t, v in cell.scores
                    if not origin_only or o == self.origin
                ]
                cells.append(
                    {
                        "stratum": stratum,
                        "stage": stage,
                        "alpha": cell.alpha,
                        "seen": cell.seen,
                        "covered": cell.covered,
                        "recent": list(cell.recent),
                        "scores": scores,
                    }
                )
            return {
                "format": FORMAT,
                "origin": self.origin,
                "seq": self._seq,
                "target": self.target,
                "window": self.params.window,
                "cells": cells,
            }

    def load_json(self, doc: dict[str, Any]) -> None:
        """Restore this replica's own state (a checkpoint): levels, counters and scores."""
        state = CalibrationState.model_validate(doc)
        with self._lock:
            self.origin = state.origin  # the same replica identity as before the restart
            self._cells.clear()
            self._seq = max(self._seq, state.seq)
            for c in state.cells:
                cell = self._cell(c.stratum, min(c.stage, self.params.max_stage))
                cell.alpha = min(max(c.alpha, 1e-3), 0.5)
                cell.seen, cell.covered = c.seen, min(c.covered, c.seen)
                cell.recent.extend(1 if x else 0 for x in c.recent[-200:])
                self._add_scores(cell, c.scores)
                self._refresh(cell, c.stratum, min(c.stage, self.params.max_stage))

    def merge(self, doc: dict[str, Any]) -> int:
        """Merge a peer's state: its scores join ours (dedup by origin and sequence, newest
        ``window`` kept); our ACI levels and counters stay ours. Returns the number of new scores."""
        state = CalibrationState.model_validate(doc)
        added = 0
        with self._lock:
            for c in state.cells:
                foreign = [x for x in c.scores if x[0] != self.origin]
                if not foreign:
                    continue
                cell = self._cell(c.stratum, min(c.stage, self.params.max_stage))
                added += self._add_scores(cell, foreign)
                self._refresh(cell, c.stratum, min(c.stage, self.params.max_stage))
        return added

    def _add_scores(self, cell: _Cell, rows: Iterable[tuple[str, int, float, float]]) -> int:
        known = {(o, s) for o, s, _, _ in cell.scores}
        new = [(str(o), int(s), float(t), _clip(float(v))) for o, s, t, v in rows if (o, s) not in known]
        if not new:
            return 0
        merged = sorted([*cell.scores, *new], key=lambda x: (x[2], x[0], x[1]))
        cell.scores = deque(merged[-self.params.window :], maxlen=self.params.window)
        return len(new)


class CellState(BaseModel):
    stratum: str = Field(max_length=200)
    stage: int = Field(ge=0, le=100_000)
    alpha: float = Field(0.05, ge=0.0, le=1.0)
    seen: int = Field(0, ge=0)
    covered: int = Field(0, ge=0)
    recent: list[int] = Field(default_factory=list, max_length=10_000)
    scores: list[tuple[str, int, float, float]] = Field(default_factory=list, max_length=100_000)


class CalibrationState(BaseModel):
    """The JSON document of :meth:`OnlineCalibrator.to_json` (validated on load and on merge)."""

    format: str = Field(pattern=f"^{FORMAT}$")
    origin: str = Field(max_length=200)
    seq: int = Field(0, ge=0)
    target: float = Field(0.95, gt=0.0, lt=1.0)
    window: int = Field(200, ge=1)
    cells: list[CellState] = Field(default_factory=list, max_length=10_000)


def km_quantile(events: F64, censored: F64, alpha: float) -> float:
    """The smallest completed score θ with product-limit P(S > θ) ≤ 1 − (1 − α)(n + 1)/n.

    ``events``: completed scores, ``censored``: lower bounds of scores still running (both sorted);
    n counts both. Without censored scores this is the conformal ⌈(n+1)(1−α)⌉-th order statistic.
    When the requests in flight keep the estimate above the level past every completed score, θ is
    the largest score seen, completed or running (the bound must at least cover what is known).
    """
    n_ev, n = len(events), len(events) + len(censored)
    level = 1.0 - (1.0 - alpha) * (n + 1) / n
    surv, i = 1.0, 0
    while i < n_ev:
        t = events[i]
        d = int(np.searchsorted(events, t, side="right")) - i
        at_risk = (n_ev - i) + (len(censored) - int(np.searchsorted(censored, t, side="left")))
        surv *= 1.0 - d / at_risk
        if surv <= level + 1e-12:
            return float(t)
        i += d
    return float(max(events[-1], censored[-1] if len(censored) else events[-1]))


def _insert(scores: deque[tuple[str, int, float, float]], row: tuple[str, int, float, float]) -> None:
    """Insert ``row`` in arrival order; a full window drops its oldest arrival (maybe ``row``)."""
    full = len(scores) == scores.maxlen
    if full and row[2] < scores[0][2]:
        return  # arrived before every score in the window: outside it
    if full:
        scores.popleft()
    if not scores or row[2] >= scores[-1][2]:
        scores.append(row)
    else:
        scores.insert(bisect.bisect_right(scores, row[2], key=lambda x: x[2]), row)


def _binom_pmf(k: int, n: int, p: float) -> float:
    log = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    return math.exp(log + k * math.log(p) + (n - k) * math.log1p(-p))


def _tail(k: int, n: int, p: float, step: int) -> float:
    """Σ P(X = i) from i = k outwards (step +1: up to n, −1: down to 0), away from the mode."""
    term = _binom_pmf(k, n, p)
    total, i = term, k
    while term > 1e-15 * total and 0 <= i + step <= n:
        term *= (n - i) / (i + 1) * p / (1.0 - p) if step > 0 else i / (n - i + 1) * (1.0 - p) / p
        i += step
        total += term
    return total


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p), 0 < p < 1 (summed from the thin tail: a few dozen terms)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if k > n * p:
        return min(1.0, _tail(k, n, p, +1))
    return max(0.0, 1.0 - _tail(k - 1, n, p, -1))


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X ≤ k) for X ~ Binomial(n, p), 0 < p < 1."""
    return 1.0 - binom_sf(k + 1, n, p)


def _clip(v: float) -> float:
    if not math.isfinite(v):
        return _SCORE_LIMIT if v > 0 else -_SCORE_LIMIT
    return min(max(v, -_SCORE_LIMIT), _SCORE_LIMIT)


class CalibratedEstimator:
    """The forest's bounds through an :class:`OnlineCalibrator` (what the sidecar and simulator use).

    ``plan(...)`` runs the forest once per request; ``bound_at(plan, g)`` is then a few arithmetic
    operations (no forest pass per refinement); ``observe(plan, length, issued)`` learns.
    The old ``bound``/``refine`` calls keep working (stratum = request kind).
    """

    learns_online = True

    def __init__(
        self,
        estimator: OutputBoundEstimator,
        calibrator: OnlineCalibrator | None = None,
    ) -> None:
        self.estimator = estimator
        q = estimator.params.quantile
        self.calibrator = calibrator or OnlineCalibrator(target=q)

    @property
    def every_tokens(self) -> int:
        return self.estimator.params.refine_every_tokens

    def plans(self, queries: Sequence[BoundQuery], strata: Sequence[str]) -> list[Plan]:
        """One forest pass for many requests (prompt features only: the forest never saw responses)."""
        raws = self.estimator.raw_quantile_schedules(queries, limit=_MAX_CHECKPOINTS)
        growth = self.estimator.params.tail_growth
        return [
            Plan(
                stratum,
                self.every_tokens,
                max(1, int(q.max_tokens)),
                tuple(r.tolist()),
                growth,
                prompt_band(q.prompt_tokens),
            )
            for q, stratum, r in zip(queries, strata, raws, strict=True)
        ]

    def plan(  # noqa: PLR0917 - mirrors bound()
        self,
        prompt_text: str | None,
        prompt_tokens: int,
        kind: str,
        max_tokens: int,
        stratum: str | None = None,
        model: str = "",
    ) -> Plan:
        query = BoundQuery(prompt_text, prompt_tokens, kind, max_tokens, model=model)
        return self.plans([query], [stratum if stratum is not None else kind])[0]

    def bound_at(self, plan: Plan, generated_tokens: int = 0) -> int:
        return self.calibrator.bound(plan, generated_tokens)

    def observe(
        self,
        plan: Plan,
        output_tokens: int,
        issued: Sequence[int] | None = None,
        arrived_s: float | None = None,
    ) -> None:
        self.calibrator.observe(plan, output_tokens, issued, arrived_s)

    # ---- the LengthEstimator protocol (stratum = kind; re-plans on every call) --------------
    def bound(self, prompt_text: str | None, prompt_tokens: int, kind: str, max_tokens: int) -> int:
        return self.bound_at(self.plan(prompt_text, prompt_tokens, kind, max_tokens))

    def refine(  # noqa: PLR0917 - the predictor's signature
        self,
        bound_at_start: int,
        prompt_text: str | None,
        prompt_tokens: int,
        generated_tokens: int,
        generated_text: str | None,
        kind: str,
        max_tokens: int,
    ) -> int:
        value = self.bound_at(self.plan(prompt_text, prompt_tokens, kind, max_tokens), generated_tokens)
        if not self.calibrator.params.tighten:
            value = max(value, bound_at_start)
        return value


def raw_schedule_array(est: OutputBoundEstimator, query: BoundQuery, limit: int) -> F64:
    """``raw[j] = Q_q(L | L > jN, x)`` for j = 0 … ⌈cap/N⌉ (capped at ``limit`` checkpoints)."""
    return est.raw_quantile_schedules([query], limit=limit)[0]
