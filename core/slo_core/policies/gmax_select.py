"""GMAX's batch selection (Algorithm 1 lines 17–26) and its cost-aware preemption rule (§4.2).

cutoff:  keep r with priority(r) ≥ p · priority(r_(B))   (r_(B): the B-th highest priority)
window:  sort the kept requests by input length; take the B consecutive ones with the largest
         summed priority (first such window on ties)
preempt: victim v (running, outside the chosen group) yields its slot to a blocked waiting
         member w of the group only if  (P(w) − P(v)) · horizon  >  stall_s(v) · Σ_running P
         — the goodput the whole batch loses while v's KV is recomputed — and P(w) ≥ ratio·P(v).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slo_core.policies.gmax_snapshot import B8, F64, I64


def batch_capacity(kv_blocks_needed: F64, order: I64, max_num_seqs: int, kv_blocks_budget: float) -> int:
    """B: how many requests, taken in ``order``, fit in ``max_num_seqs`` slots and the KV budget."""
    if max_num_seqs <= 0 or len(order) == 0:
        return 0
    cum = np.cumsum(kv_blocks_needed[order[:max_num_seqs]])
    return int(np.searchsorted(cum, kv_blocks_budget, side="right"))


def cutoff_mask(priority: F64, batch_size: int, p: float) -> B8:
    """Candidates of Algorithm 1 line 18: priority ≥ p · (B-th highest priority)."""
    n = len(priority)
    if batch_size <= 0:
        return np.zeros(n, dtype=np.bool_)
    if n <= batch_size:
        return np.ones(n, dtype=np.bool_)
    pb = float(np.partition(priority, n - batch_size)[n - batch_size])
    mask: B8 = priority >= p * pb
    return mask


def best_window(priority: F64, input_tokens: F64, candidates: I64, batch_size: int) -> I64:
    """Algorithm 1 lines 19–26: the length-sorted window of ``batch_size`` with the largest Σ priority.

    Sorting is stable on (input length, candidate order), so ties resolve deterministically.
    """
    if batch_size <= 0 or len(candidates) == 0:
        return np.zeros(0, dtype=np.int64)
    by_len = candidates[np.argsort(input_tokens[candidates], kind="stable")]
    if len(by_len) <= batch_size:
        return by_len
    csum = np.concatenate(([0.0], np.cumsum(priority[by_len])))
    sums = csum[batch_size:] - csum[:-batch_size]
    start = int(np.argmax(sums))
    out: I64 = by_len[start : start + batch_size]
    return out


@dataclass(frozen=True, slots=True)
class Swap:
    """One preemption: ``victim`` (running) makes room for ``preemptor`` (waiting)."""

    victim: int
    preemptor: int
    gain: float
    loss: float


def preemption_gain_loss(
    p_preemptor: float, p_victim: float, horizon_s: float, stall_s: float, batch_rate: float
) -> tuple[float, float]:
    """(projected gain, goodput loss) of one swap; both in goodput units."""
    return (p_preemptor - p_victim) * horizon_s, stall_s * batch_rate


def plan_preemptions(
    blocked: I64,
    victims: I64,
    *,
    priority: F64,
    stall_s: F64,
    horizon_s: F64,
    batch_rate: float,
    min_ratio: float,
) -> list[Swap]:
    """Pair blocked preemptors (highest priority first) with victims (lowest first); keep net gains.

    ``blocked`` must be sorted by descending priority and ``victims`` by ascending priority; each
    victim is used at most once. Greedy: pairing stops at the first pair that does not pay off, as
    later pairs have a weaker preemptor and a stronger victim.
    """
    swaps: list[Swap] = []
    for w, v in zip(blocked.tolist(), victims.tolist(), strict=False):
        pw, pv = float(priority[w]), float(priority[v])
        gain, loss = preemption_gain_loss(pw, pv, float(horizon_s[w]), float(stall_s[v]), batch_rate)
        if pw < min_ratio * pv or gain <= loss:
            break
        swaps.append(Swap(victim=v, preemptor=w, gain=gain, loss=loss))
    return swaps
