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

The cap would starve latency requests, whose value depends on a first token within TTFT and whose
prompts are short: while it holds, waiting latency requests whose first token is still due are
admitted first (the latency lane, at most ``lane_max_tokens`` of prompt per decision) and their
prefill, like that of latency requests already in prefill, is added on top of the cap. Running
requests are ordered decodes first, then latency prefills, then the other prefills.

Both of GMAX's paths (numpy, plain floats) call these functions on arrays, so they agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slo_core.perf.model import PerfProfile
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_priority import Estimates, own_or
from slo_core.policies.gmax_snapshot import B8, COMPOUND, F64, I64, Columns


def pace_deadlines(c: Columns, est: Estimates, rows: I64) -> F64:
    """The deadline the pace of each of ``rows`` is measured against: a compound call's stage
    sub-deadline (never after its program's), any other request's own deadline (NaN: latency)."""
    prog = est.program_deadline_at_s[rows]
    stage = np.fmin(own_or(c.deadline_at_s[rows], prog), prog)
    out: F64 = np.where(c.kind[rows] == COMPOUND, stage, est.deadline_at_s[rows])
    return out


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
) -> int | None:
    """Tokens per step (decodes included) that keep the running requests (the arrays' rows) on pace.

    ``kv_tokens``: computed tokens of each running request; ``deadline_s`` NaN for latency rows.
    None: no cap (the engine's own budget).
    """
    if not p.pace_budget or profile is None or len(in_prefill) == 0:
        return None
    decoding = ~in_prefill
    n_dec = int(np.count_nonzero(decoding))
    kv = float(np.sum(kv_tokens[decoding] + 1.0))
    bare_ms = (
        profile.t_c_ms
        + max(profile.floor_ms, profile.a_ms_per_token * max(1, n_dec))
        + profile.d_ms_per_kv_token * kv
    )
    # NaN (no target) propagates quietly and compares False: dropped
    pace = np.where(is_latency, tbt_s, (deadline_s - now_s) / np.maximum(len_rem_tokens, 1.0))
    paces = np.sort(pace[pace * 1000.0 >= bare_ms])
    if len(paces) == 0:
        return None
    v_req = float(paces[int(p.pace_quantile * (len(paces) - 1))])
    spare_ms = v_req * 1000.0 * p.pace_safety - bare_ms
    extra = int(spare_ms / profile.a_ms_per_token) if spare_ms > 0 else 0
    return min(n_dec + max(p.min_prefill_tokens, extra), max_batched_tokens)


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
