"""GMAX's per-step token budget (how fast new work may enter) and its latency lane.

Every token prefilled in an engine step lengthens that step for every running request. At overload
an engine that fills each step with up to ``max_num_batched_tokens`` of prompts slows all of its
decodes several-fold, and the requests it already started, whose value is still unpaid (a deadline
or compound request pays only when it completes), miss their deadlines. GMAX therefore caps the
tokens per step so that the step keeps the pace the running requests still need:

    pace(r)  = TBT(r)                                             latency request
    pace(r)  = (deadline(r) − now) / len_rem(r)                    deadline / best-effort
    pace(r)  = (stage sub-deadline(r) − now) / len_rem(r)          compound call (its program's later
                                                                   stages need the rest of its time)
    v_req    = the ``pace_quantile`` quantile of pace(r) over running r that can still make it
               (pace ≥ the bare decode step); the most pressed few are let go
    budget   = n_decodes + max(min_prefill_tokens, (safety·v_req − bare decode step) / a)

with the engine's performance model (bare step = t_c + max(floor, a·n_decodes) + d·Σ KV, a = time
per batched token). No cap without a profile or when nothing running constrains the pace.

The cap trades the waiting requests' start for the running requests' pace, which only pays when the
engine cannot serve both. Demand floor: the prompts still to prefill (non-latency prefills in
progress, then waiting deadline and compound requests, in the order they will be prefilled), each
with its latest start s_k = deadline − now − len_med·(decode step) (len_med: the median remaining
length under GMAX's length model, the bound over e^{zσ}; a compound call: its stage sub-deadline),
need the prefill rates r_k = Σ_{j≤k} prompt_j / s_k (∞ once s_k ≤ 0: a prompt already late counts
as one no step can start); r is their (1 − pace_quantile) quantile (the most pressed few are let go,
as above). A step of P prefill tokens moves
P / (bare + a·P) tokens per ms, so r needs P = r·bare / (1 − a·r). When that P fits the engine's
budget (the queue can still start in time) the step budget rises to n_decodes + P, though never to
a step slower than the pace the ``demand_pace_quantile`` (median) running request needs; when it
does not (overload: not everyone can make it) the pace cap stands and the priority order triages.
Late prompts count: before they did not, so at overload, where much of the queue is already past its
latest start, the floor saw only the survivors, rose, and slowed every running request for prompts
that mostly could not finish anyway (token goodput at the 300 s overload points, 3 seeds: conv x1
0.700 -> 0.741, ShareGPT x1 0.658 -> 0.695, ShareGPT x2 0.627 -> 0.684; light points unchanged).
Not under the request goodput, which pays a short running request as much as a long waiting prompt:
there the floor cost running deadline requests more than it won (measured: bench/results/gmax/issue15).

The cap would starve latency requests, whose value depends on a first token within TTFT and whose
prompts are short: while it holds, waiting latency requests whose first token is still due are
admitted first (the latency lane, at most ``lane_max_tokens`` of prompt per decision) and their
prefill, like that of latency requests already in prefill, is added on top of the cap. Running
requests are ordered decodes first, then latency prefills, then the other prefills.

GMAX's numpy path calls these functions on arrays; its plain-float path (small snapshots) calls
their ``*_small`` twins on lists, which run the same IEEE operations in the same order (sums through
numpy's pairwise order, float_sum) and share the arithmetic after the per-row part, so both agree bit
for bit (tests/unit/core/policies/test_gmax_budget.py compares them on random rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slo_core.perf.model import PerfProfile
from slo_core.policies.float_sum import numpy_sum
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_priority import Lengths, own_or, z_of_quantile
from slo_core.policies.gmax_snapshot import B8, COMPOUND, F64, I64, Columns


def pace_deadlines(c: Columns, est: Lengths, rows: I64) -> F64:
    """The deadline the pace of each of ``rows`` is measured against: a compound call's stage
    sub-deadline (never after its program's), any other request's own deadline (NaN: latency)."""
    prog = est.program_deadline_at_s[rows]
    stage = np.fmin(own_or(c.deadline_at_s[rows], prog), prog)
    out: F64 = np.where(c.kind[rows] == COMPOUND, stage, est.deadline_at_s[rows])
    return out


def median_remaining(p: GMAXParams, bound_tokens: F64, generated_tokens: F64) -> F64:
    """Remaining tokens at the median of GMAX's length model: the analyzer's bound stands for its
    ``bound_quantile`` of a log-normal of spread ``length_sigma`` (true lengths and the mean: as given)."""
    factor = _median_factor(p)
    median = bound_tokens if factor is None else bound_tokens * factor
    out: F64 = np.maximum(median, generated_tokens + 1.0) - generated_tokens
    return out


def _median_factor(p: GMAXParams) -> float | None:
    """The median over the bound of GMAX's length model (None: the bound is the length)."""
    if p.length_source == "analyzer":
        return math.exp(-z_of_quantile(p.bound_quantile) * p.length_sigma)
    return None


def step_budget(
    p: GMAXParams,
    profile: PerfProfile | None,
    max_batched_tokens: int,
    now_s: float,
    *,
    in_prefill: B8,
    kv_tokens: F64,
    is_latency: B8,
    tbt_s: F64,
    deadline_s: F64,
    len_rem_tokens: F64,
    pending_tokens: F64 | None = None,
    pending_start_by_s: F64 | None = None,
) -> int | None:
    """Tokens per step (decodes included) that keep the running requests (the arrays' rows) on pace.

    ``kv_tokens``: computed tokens of each running request; ``deadline_s`` NaN for latency rows.
    ``pending_tokens`` / ``pending_start_by_s``: prompt tokens still to prefill and the latest time
    each must start (absolute seconds) for the demand floor. None: no cap (the engine's own budget).
    """
    if not p.pace_budget or profile is None or len(in_prefill) == 0:
        return None
    decoding = ~in_prefill
    n_dec = int(np.count_nonzero(decoding))
    bare_ms = _bare_step_ms(profile, n_dec, float(np.sum(kv_tokens[decoding] + 1.0)))
    # NaN (no target) propagates quietly and compares False: dropped
    pace = np.where(is_latency, tbt_s, (deadline_s - now_s) / np.maximum(len_rem_tokens, 1.0))
    paces = np.sort(pace[pace * 1000.0 >= bare_ms])
    if len(paces) == 0:
        return None
    return _budget_of(
        p,
        profile,
        max_batched_tokens,
        n_dec=n_dec,
        bare_ms=bare_ms,
        paces=paces.tolist(),
        need=_pending_need(
            p,
            profile,
            demand_tokens,
            room_tokens=max_batched_tokens - n_dec,
            now_s=now_s,
            bare_ms=bare_ms,
            pending_tokens=pending_tokens,
            pending_start_by_s=pending_start_by_s,
        ),
    )


def _bare_step_ms(profile: PerfProfile, n_dec: int, kv_tokens: float) -> float:
    """The modelled step of ``n_dec`` decodes over ``kv_tokens`` of KV, no prefill (ms)."""
    return (
        profile.t_c_ms
        + max(profile.floor_ms, profile.a_ms_per_token * max(1, n_dec))
        + profile.d_ms_per_kv_token * kv_tokens
    )


def demand_floor_applies(p: GMAXParams) -> bool:
    """The demand floor is on (never under the request goodput: module docstring)."""
    return p.demand_floor and p.goodput != "request"


def _pending_need(
    p: GMAXParams,
    profile: PerfProfile,
    demand: Callable[..., int | None],
    *,
    room_tokens: int,
    now_s: float,
    bare_ms: float,
    pending_tokens: Any,
    pending_start_by_s: Any,
) -> int | None:
    """The demand floor's prefill need (``demand``: :func:`demand_tokens` or its plain-float twin), or
    None when the floor is off or nothing is pending."""
    if not demand_floor_applies(p) or pending_tokens is None or pending_start_by_s is None:
        return None
    return demand(
        pending_tokens,
        pending_start_by_s,
        now_s,
        bare_ms=bare_ms,
        a_ms=profile.a_ms_per_token,
        room_tokens=room_tokens,
        quantile=p.pace_quantile,
    )


def _budget_of(
    p: GMAXParams,
    profile: PerfProfile,
    max_batched_tokens: int,
    *,
    n_dec: int,
    bare_ms: float,
    paces: list[float],
    need: int | None,
) -> int:
    """The cap from the sorted paces that can still be kept and the demand floor's prefill ``need``."""
    v_req = paces[int(p.pace_quantile * (len(paces) - 1))]
    spare_ms = v_req * 1000.0 * p.pace_safety - bare_ms
    extra = int(spare_ms / profile.a_ms_per_token) if spare_ms > 0 else 0
    extra = max(p.min_prefill_tokens, extra)
    if need is not None:
        # never slower than the pace of the demand_pace_quantile running request
        v_hi = paces[int(p.demand_pace_quantile * (len(paces) - 1))]
        hi_ms = v_hi * 1000.0 * p.pace_safety - bare_ms
        extra = max(extra, min(need, int(hi_ms / profile.a_ms_per_token) if hi_ms > 0 else 0))
    return min(n_dec + extra, max_batched_tokens)


def demand_tokens(
    tokens: F64,
    start_by_s: F64,
    now_s: float,
    *,
    bare_ms: float,
    a_ms: float,
    room_tokens: int,
    quantile: float = 0.0,
) -> int | None:
    """Prefill tokens per step that start every pending prompt by its latest start (module docstring);
    None when no such step fits ``room_tokens`` or nothing pending can still start in time.

    A prompt whose latest start has passed needs an infinite rate: it counts toward the quantile (a
    queue where more than the let-go share is already late is overload, and the floor stands)."""
    slack_ms = (start_by_s - now_s) * 1000.0
    pending = (tokens > 0) & ~np.isnan(slack_ms)  # no latest start (NaN): not the floor's
    if not pending.any():
        return None
    ahead = np.cumsum(tokens)[pending]  # prefilled in this order: a prompt waits for every one before it
    slack_ms = slack_ms[pending]
    late = slack_ms <= 0
    rates = np.sort(np.where(late, np.inf, ahead / np.where(late, 1.0, slack_ms)))  # tokens per ms each needs
    return _need_of(rates.tolist(), bare_ms=bare_ms, a_ms=a_ms, room_tokens=room_tokens, quantile=quantile)


def _need_of(
    rates: list[float], *, bare_ms: float, a_ms: float, room_tokens: int, quantile: float
) -> int | None:
    """The prefill tokens per step for the sorted rates (tokens per ms) the pending prompts need."""
    rate = rates[int((1.0 - quantile) * (len(rates) - 1))]  # the most pressed few are let go
    if rate * a_ms >= 1.0:
        return None
    need = rate * bare_ms / (1.0 - rate * a_ms)
    return math.ceil(need) if need <= room_tokens else None


@dataclass(frozen=True, slots=True)
class Lane:
    """Admission and running order with the latency lane, and the prefill tokens it adds to the cap."""

    admit: I64
    running_order: I64
    extra_tokens: int


def latency_lane(
    admit: I64,
    running_order: I64,
    *,
    candidates: I64,
    prompt_tokens: F64,
    computed_tokens: F64,
    generated_tokens: F64,
    in_prefill: B8,
    is_latency: B8,
    max_tokens: int,
) -> Lane:
    """Reorder ``admit`` (waiting row indices) and ``running_order`` (running row indices).

    ``candidates``: the rows of ``admit``, in its order, that are latency requests whose first token
    is still due; they enter the lane while it holds fewer than ``max_tokens`` prompt tokens. The
    other arrays are indexed by row.
    """
    prompts = prompt_tokens[candidates]
    lane = candidates[np.cumsum(prompts) - prompts < max_tokens]
    in_lane = np.zeros(len(prompt_tokens), dtype=np.bool_)
    in_lane[lane] = True
    new_admit = np.concatenate((lane, admit[~in_lane[admit]]))
    pre = in_prefill[running_order]
    lat = is_latency[running_order]
    lat_pre = running_order[pre & lat]
    order = np.concatenate((running_order[~pre], lat_pre, running_order[pre & ~lat]))
    uncomputed = np.maximum(
        0.0, prompt_tokens[lat_pre] + generated_tokens[lat_pre] - computed_tokens[lat_pre]
    )
    extra = float(np.sum(prompt_tokens[lane])) + float(np.sum(uncomputed))
    return Lane(new_admit, order, int(extra))


# ---- the same on plain floats, for GMAX's small snapshots ---------------------------------------


def _maximum(a: float, b: float) -> float:
    """``np.maximum`` on two floats (NaN if either is NaN)."""
    if a >= b:
        return a
    if a < b:
        return b
    return math.nan


def median_remaining_small(
    p: GMAXParams, bound_tokens: Sequence[float], generated_tokens: Sequence[float]
) -> list[float]:
    """:func:`median_remaining` on lists."""
    factor = _median_factor(p)
    out: list[float] = []
    for b, g in zip(bound_tokens, generated_tokens, strict=True):
        median = b if factor is None else b * factor
        out.append(_maximum(median, g + 1.0) - g)
    return out


def step_budget_small(
    p: GMAXParams,
    profile: PerfProfile | None,
    max_batched_tokens: int,
    now_s: float,
    *,
    in_prefill: Sequence[bool],
    kv_tokens: Sequence[float],
    is_latency: Sequence[bool],
    tbt_s: Sequence[float],
    deadline_s: Sequence[float],
    len_rem_tokens: Sequence[float],
    pending_tokens: Sequence[float] | None = None,
    pending_start_by_s: Sequence[float] | None = None,
) -> int | None:
    """:func:`step_budget` on lists (one entry per running request; the pending ones per prompt)."""
    if not p.pace_budget or profile is None or len(in_prefill) == 0:
        return None
    kv = [k + 1.0 for pre, k in zip(in_prefill, kv_tokens, strict=True) if not pre]
    n_dec = len(kv)
    bare_ms = _bare_step_ms(profile, n_dec, numpy_sum(kv))
    paces: list[float] = []
    for lat, tbt, deadline, len_rem in zip(is_latency, tbt_s, deadline_s, len_rem_tokens, strict=True):
        pace = tbt if lat else (deadline - now_s) / _maximum(len_rem, 1.0)
        if pace * 1000.0 >= bare_ms:  # NaN compares False: dropped
            paces.append(pace)
    if not paces:
        return None
    paces.sort()
    return _budget_of(
        p,
        profile,
        max_batched_tokens,
        n_dec=n_dec,
        bare_ms=bare_ms,
        paces=paces,
        need=_pending_need(
            p,
            profile,
            demand_tokens_small,
            room_tokens=max_batched_tokens - n_dec,
            now_s=now_s,
            bare_ms=bare_ms,
            pending_tokens=pending_tokens,
            pending_start_by_s=pending_start_by_s,
        ),
    )


def demand_tokens_small(
    tokens: Sequence[float],
    start_by_s: Sequence[float],
    now_s: float,
    *,
    bare_ms: float,
    a_ms: float,
    room_tokens: int,
    quantile: float = 0.0,
) -> int | None:
    """:func:`demand_tokens` on lists (the prompts' running sum in order, as ``np.cumsum``)."""
    rates: list[float] = []
    ahead = 0.0
    for i, (tok, start) in enumerate(zip(tokens, start_by_s, strict=True)):
        ahead = tok if i == 0 else ahead + tok
        slack_ms = (start - now_s) * 1000.0
        if tok > 0 and not math.isnan(slack_ms):
            rates.append(ahead / slack_ms if slack_ms > 0 else math.inf)  # late: no rate starts it
    if not rates:
        return None
    rates.sort()
    return _need_of(rates, bare_ms=bare_ms, a_ms=a_ms, room_tokens=room_tokens, quantile=quantile)


def latency_lane_small(
    admit: Sequence[int],
    running_order: Sequence[int],
    *,
    candidates: Sequence[int],
    prompt_tokens: Sequence[float],
    computed_tokens: Sequence[float],
    generated_tokens: Sequence[float],
    in_prefill: Sequence[bool],
    is_latency: Sequence[bool],
    max_tokens: int,
) -> tuple[list[int], list[int], int]:
    """:func:`latency_lane` on lists: (admit, running order, extra tokens)."""
    if not candidates and not any(in_prefill[i] for i in running_order):
        return list(admit), list(running_order), 0  # no lane, every running request decodes
    lane: list[int] = []
    ahead = 0.0
    for k, i in enumerate(candidates):
        x = prompt_tokens[i]
        ahead = x if k == 0 else ahead + x
        if ahead - x < max_tokens:
            lane.append(i)
    in_lane = set(lane)
    new_admit = lane + [i for i in admit if i not in in_lane]
    decodes: list[int] = []
    lat_pre: list[int] = []
    other_pre: list[int] = []
    for i in running_order:
        if not in_prefill[i]:
            decodes.append(i)
        elif is_latency[i]:
            lat_pre.append(i)
        else:
            other_pre.append(i)
    uncomputed = [_maximum(0.0, prompt_tokens[i] + generated_tokens[i] - computed_tokens[i]) for i in lat_pre]
    extra = numpy_sum([prompt_tokens[i] for i in lane]) + numpy_sum(uncomputed)
    return new_admit, decodes + lat_pre + other_pre, int(extra)
