"""GMAX's decision on a small snapshot in plain Python floats, bit-identical to the numpy path.

An engine that is not overloaded holds a handful of requests, and GMAX decides after every arrival,
finish and frame: at that size numpy's per-call overhead (~1 µs × a few hundred array operations)
is the whole cost of a decision. This module computes the same quantities as
:func:`slo_core.policies.gmax_priority.estimate` and the same selection as
:mod:`slo_core.policies.gmax_select`, one request at a time, with the same IEEE operations in the
same order, so the Decision is identical (tests/unit/core/policies/test_gmax_scalar.py compares the
two paths on random snapshots). Transcendental functions (the log-normal feasibility) and sums of
non-integer values still go through numpy on the few rows that need them, so no libm/SIMD
difference can creep in.

It covers snapshots without compound calls, under the 'token' and 'request' goodputs, without
fairness; :func:`supported` says when, and GMAX falls back to the numpy path otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slo_core import detmath
from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_priority import SpeedModel, fit_probability, z_of_quantile
from slo_core.policies.gmax_snapshot import F64, KIND_CODES
from slo_core.slo import RequestKind

_EPS_S = 1e-9
_MIN_T_S = 1e-6
_INF = math.inf
_LATENCY = RequestKind.LATENCY
_DEADLINE = RequestKind.DEADLINE
_COMPOUND = RequestKind.COMPOUND
_BEST_EFFORT = RequestKind.BEST_EFFORT
MAX_ROWS = 64  # above this the vectorized path is as fast


def supported(p: GMAXParams, waiting: Sequence[RequestView], running: Sequence[RequestView]) -> bool:
    """Whether :func:`scores` reproduces the numpy path for this snapshot and these parameters."""
    if p.goodput not in ("token", "request") or p.fairness > 0:
        return False
    if len(waiting) + len(running) > MAX_ROWS:
        return False
    for r in (*waiting, *running):
        slo = r.slo
        if slo.kind is _COMPOUND:
            return False
        if slo.kind is _LATENCY and (slo.ttft_s is None or slo.tbt_s is None):
            return False
    return True


def nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)


def speed_of(
    p: GMAXParams, engine: EngineView, waiting: Sequence[RequestView], running: Sequence[RequestView]
) -> SpeedModel:
    """:meth:`GMAX._speed` without building columns (context sums are integers: exact in any order)."""
    n = len(waiting) + len(running)
    n_seqs = min(engine.max_num_seqs, n)
    if engine.profile is None:
        return SpeedModel(
            p.default_step_s, 1.0 / p.default_prefill_tokens_per_s, 0.0, engine.max_num_batched_tokens
        )
    pool = running if running else waiting
    ctx_sum = 0
    for r in pool:
        ctx_sum += r.prompt_tokens + r.generated_tokens
    mean_ctx = float(ctx_sum) / len(pool)
    return SpeedModel.from_profile(engine.profile, n_seqs, mean_ctx * n_seqs, engine.max_num_batched_tokens)


def prefill_time(speed: SpeedModel, tokens: float, context_before: float) -> float:
    if tokens <= 0:
        return 0.0
    chunks = float(math.ceil(tokens / speed.budget_tokens))
    work = speed.prefill_s_per_token * tokens + speed.prefill_s_per_token_ctx * tokens * (
        context_before + tokens
    )
    return chunks * speed.step_s + work


def _bound(r: RequestView, p: GMAXParams, scale: Sequence[float] | None) -> float:
    g = float(r.generated_tokens)
    max_tokens = float(r.max_tokens)
    cap = min(float(p.fallback_output_tokens), max_tokens)
    if p.length_source == "mean":
        base = p.mean_output_tokens
    else:
        if r.output_bound is None:
            base = cap
        elif scale is None:
            base = float(r.output_bound)
        else:
            base = float(r.output_bound) * scale[KIND_CODES[r.slo.kind]]
        if p.length_source == "oracle" and r.true_output_tokens is not None:
            base = float(r.true_output_tokens)
    if base <= g:
        base = min(g + p.refine_every_tokens, max_tokens)
    return max(min(base, max_tokens), g + 1.0)


def _on_time_tokens(r: RequestView, now_s: float, t_pre: float, bound: float, v: float) -> float:
    """:func:`gmax_priority.latency_on_time_tokens` for one latency request."""
    g = float(r.generated_tokens)
    slo = r.slo
    c0 = now_s + t_pre + (1.0 - g) * v - r.arrival_s - slo.ttft_s - _EPS_S  # type: ignore[operator]
    k = slo.tbt_s - v  # type: ignore[operator]
    if k > 0:
        return max(0.0, bound - max(g, float(math.ceil(c0 / k))))
    if k < 0:
        last = min(bound - 1.0, float(math.floor(c0 / k)))
        return max(0.0, last - g + 1.0)
    return bound - g if c0 <= 0 else 0.0


@dataclass(slots=True)
class Scores:
    """Per-row results the selection needs (rows: waiting first, then running)."""

    score: list[float]
    t_gen_s: list[float]
    len_rem_tokens: list[float]
    reject: list[bool]
    deadline_s: list[float]  # NaN for latency rows
    bound_tokens: list[float]
    # the rows' fields as the scores read them (floats), for the selection and the step budget
    generated: list[float]
    prompt: list[float]
    computed: list[float]
    is_latency: list[bool]


def scores(
    p: GMAXParams,
    waiting: Sequence[RequestView],
    running: Sequence[RequestView],
    now_s: float,
    *,
    speed: SpeedModel,
    frame_s: float,
    z_by_kind: Sequence[float] | None = None,
    scale_by_kind: Sequence[float] | None = None,
) -> Scores:
    """priority = goodput / t_gen per row, as :func:`gmax_priority.estimate` computes it
    (``z_by_kind``: its ``z_bound`` per kind code, gmax_bound's learned reading; ``scale_by_kind``: its
    ``bound_scale`` per kind code)."""
    v = speed.step_s
    rows = [*waiting, *running]
    n_wait = len(waiting)
    gain_l: list[float] = []  # weight-free goodput; deadline rows: tokens, times P(fit) below
    bonus_l: list[float] = []  # δ·frames waited (0.0 while running)
    t_gen_l: list[float] = []
    len_rem_l: list[float] = []
    reject: list[bool] = []
    deadline_l: list[float] = []
    bound_l: list[float] = []
    g_l: list[float] = []
    prompt_l: list[float] = []
    computed_l: list[float] = []
    is_lat_l: list[bool] = []
    prob_rows: list[int] = []  # deadline rows whose P(fit) goes through numpy
    prob_g: list[float] = []
    prob_b: list[float] = []
    prob_slack: list[float] = []
    prob_z: list[float] = []
    probabilistic = p.feasibility == "probabilistic" and p.length_source != "oracle"
    hard = p.drops_past_deadline
    token = p.goodput == "token"
    frame_div = max(frame_s, _MIN_T_S)
    for i, r in enumerate(rows):
        slo = r.slo
        kind = slo.kind
        g = float(r.generated_tokens)
        prompt = float(r.prompt_tokens)
        computed = float(r.computed_tokens)
        bound = _bound(r, p, scale_by_kind)
        len_rem = bound - g
        t_pre = prefill_time(speed, max(0.0, prompt + g - computed), computed)
        t_gen = t_pre + len_rem * v
        waiting_row = i < n_wait
        deadline = math.nan
        g_l.append(g)
        prompt_l.append(prompt)
        computed_l.append(computed)
        is_lat_l.append(kind is _LATENCY)
        if kind is _LATENCY:
            n_on = _on_time_tokens(r, now_s, t_pre, bound, v)
            gain = n_on if token else float(n_on >= len_rem)
        else:
            if kind is _BEST_EFFORT and slo.deadline_s is None:
                slo_d = p.best_effort_deadline_s
            else:
                slo_d = math.nan if slo.deadline_s is None else slo.deadline_s
            deadline = r.arrival_s + slo_d if r.deadline_at_s is None else r.deadline_at_s
            d_or = -_INF if math.isnan(deadline) else deadline
            tokens = prompt + bound + 0.0
            if probabilistic:
                prob_rows.append(i)
                prob_g.append(g)
                prob_b.append(bound)
                prob_slack.append((d_or - now_s - t_pre) / v)
                if z_by_kind is not None:
                    prob_z.append(z_by_kind[KIND_CODES[kind]])
                gain = tokens if token else 1.0
            else:
                fit = 1.0 if now_s + t_gen <= d_or + _EPS_S else 0.0
                gain = tokens * fit if token else fit
        gain_l.append(gain)
        deadline_l.append(deadline)
        bound_l.append(bound)
        if waiting_row:
            ws = r.arrival_s if r.waiting_since_s is None else r.waiting_since_s
            bonus = p.delta_per_frame * max(0.0, now_s - ws) / frame_div
            bonus_l.append(bonus if token else bonus / (prompt + bound))
        else:
            bonus_l.append(0.0)
        t_gen_l.append(t_gen)
        len_rem_l.append(len_rem)
        out = False
        if waiting_row:
            if hard and kind is _DEADLINE and deadline < now_s:
                out = True
            if (
                p.max_wait_s is not None
                and r.generated_tokens == 0
                and r.computed_tokens == 0
                and now_s - r.arrival_s > p.max_wait_s
            ):
                out = True
        reject.append(out)
    if prob_rows:
        z_b: F64 | float = 0.0
        if p.length_source == "analyzer":
            z_b = z_of_quantile(p.bound_quantile) if z_by_kind is None else np.array(prob_z)
        p_fit = fit_probability(np.array(prob_g), np.array(prob_b), np.array(prob_slack), p.length_sigma, z_b)
        with np.errstate(divide="ignore"):
            on_time = detmath.exp(detmath.log(p_fit)).tolist()
        for i, fit in zip(prob_rows, on_time, strict=True):
            gain_l[i] = gain_l[i] * fit if token else fit
    score = [
        (r.slo.priority_weight * gain + bonus) / max(t_gen, _MIN_T_S)
        for r, gain, bonus, t_gen in zip(rows, gain_l, bonus_l, t_gen_l, strict=True)
    ]
    return Scores(score, t_gen_l, len_rem_l, reject, deadline_l, bound_l, g_l, prompt_l, computed_l, is_lat_l)


def batch_capacity(need: list[float], order: Sequence[int], max_num_seqs: int, budget: float) -> int:
    """:func:`gmax_select.batch_capacity` (block counts are integers: the running sum is exact)."""
    if max_num_seqs <= 0 or not order:
        return 0
    total = 0.0
    n = 0
    for i in order[:max_num_seqs]:
        total += need[i]
        if total > budget:
            break
        n += 1
    return n


def cutoff_candidates(score: list[float], pool: list[int], batch_size: int, p: float) -> list[int]:
    """:func:`gmax_select.cutoff_mask` applied to ``pool`` (kept in pool order)."""
    n = len(pool)
    if batch_size <= 0:
        return []
    if n <= batch_size:
        return list(pool)
    pb = sorted(score[i] for i in pool)[n - batch_size]
    threshold = p * pb
    return [i for i in pool if score[i] >= threshold]


def best_window(score: list[float], ctx: list[float], candidates: list[int], batch_size: int) -> list[int]:
    """:func:`gmax_select.best_window` (candidates in ascending index order)."""
    if batch_size <= 0 or not candidates:
        return []
    by_len = sorted(candidates, key=ctx.__getitem__)
    if len(by_len) <= batch_size:
        return by_len
    csum = [0.0]
    acc = 0.0
    for i in by_len:
        acc += score[i]
        csum.append(acc)
    best_start = 0
    best = -_INF
    for start in range(len(by_len) - batch_size + 1):
        s = csum[start + batch_size] - csum[start]
        if s > best:
            best, best_start = s, start
    return by_len[best_start : best_start + batch_size]
