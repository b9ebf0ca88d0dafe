"""SLOs-Serve's multi-SLO admission dynamic program and dynamic batch formation (SLOs-Serve §3.2).

Batch formation (§3.2.2, Algorithm 2): every batch lasts the tightest TPOT ``t0`` among decoding requests
and holds ``time2bs(t0)`` tokens (the largest batch the performance model finishes within t0, capped by
the engine's token budget); decoding requests get their tokens earliest-scheduled-deadline first (one
per TPOT_i), and what is left is *prefill budget*. In steady state that is a prefill rate of

    ρ(decoders) = (time2bs(t0) − Σ_i t0/TPOT_i) / t0   tokens/s   (negative: decode SLOs infeasible)

Admission (§3.2.1, the DP of eq. 5 with the Appendix C refactoring): requests are taken in order of
prefill deadline ``pDDL``. Between two consecutive deadlines the prefill budget grows by ρ·Δt with every
request whose pDDL has passed counted as decoding (the paper's Δpb = PB*(pDDL_i − pDDL_j, n)); at each
deadline the request's prompt is paid from the budget, which must stay ≥ 0. Running and already
admitted requests are *forced* (they may not lose budget they would otherwise get: their deficit, if
any, can only be matched, never deepened); new requests are admitted or declined. The state is
(admitted count per TPOT tier, memory units used) and each state keeps the Pareto front of
(value, prefill budget) with the admitted set, which is exact for any request values (the paper's
pb-in-state form) while staying small. Memory counts each request's prompt + expected output in units.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from slo_core.perf.model import PerfProfile
from slo_core.policies.base import slots_twin
from slo_core.policies.seed_estimates import tokens_within_s

_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class DPItem:
    """One request as the admission DP sees it (times absolute, seconds)."""

    request_id: str
    pddl_s: float
    prefill_tokens: int
    memory_units: int
    tpot_s: float | None
    value: float
    decode_kv_tokens: int = 0
    forced: bool = False


# built for every queued request at every decision: through slots_twin, not the frozen __init__
_DPItemSlots = slots_twin(
    DPItem,
    (
        "request_id",
        "pddl_s",
        "prefill_tokens",
        "memory_units",
        "tpot_s",
        "value",
        "decode_kv_tokens",
        "forced",
    ),
)


def dp_item(  # noqa: PLR0917 - DPItem's fields, in its order
    request_id: str,
    pddl_s: float,
    prefill_tokens: int,
    memory_units: int,
    tpot_s: float | None,
    value: float,
    decode_kv_tokens: int,
    forced: bool,
) -> DPItem:
    """``DPItem(...)`` with every field given (equal to it), built fast."""
    it = object.__new__(_DPItemSlots)
    it.request_id = request_id
    it.pddl_s = pddl_s
    it.prefill_tokens = prefill_tokens
    it.memory_units = memory_units
    it.tpot_s = tpot_s
    it.value = value
    it.decode_kv_tokens = decode_kv_tokens
    it.forced = forced
    it.__class__ = DPItem
    out: DPItem = it
    return out


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one replica offers the DP: its performance model and limits."""

    profile: PerfProfile
    max_batch_tokens: int
    memory_units: int
    max_seqs: int
    base_decoders: tuple[tuple[float, int], ...] = ()
    idle_batch_s: float = 0.1


@dataclass(frozen=True, slots=True)
class PlannedBatch:
    """One batch of Algorithm 2: its token size, decode tokens and leftover prefill budget."""

    tokens: int
    decode_tokens: int
    prefill_budget: int


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    """The DP's answer: which candidates to admit, the value gained, and whether the forced set fits."""

    admitted: tuple[str, ...]
    declined: tuple[str, ...]
    value: float
    forced_feasible: bool


def batch_tokens(cap: Capacity, t0_s: float, kv_sum: float) -> int:
    """time2bs: the tokens one batch may hold and still finish within t0."""
    return min(cap.max_batch_tokens, tokens_within_s(cap.profile, t0_s, kv_sum))


def prefill_rate(cap: Capacity, min_tpot_s: float, inv_tpot_sum: float, kv_sum: float) -> float:
    """ρ: prefill tokens per second left after the decode SLOs (negative when they cannot all be met)."""
    if inv_tpot_sum <= 0:
        t = cap.idle_batch_s
        return batch_tokens(cap, t, kv_sum) / t
    t0 = min_tpot_s
    return (batch_tokens(cap, t0, kv_sum) - t0 * inv_tpot_sum) / t0


def form_batches(
    cap: Capacity, horizon_s: float, decoders: Sequence[tuple[float, int]]
) -> list[PlannedBatch]:
    """Algorithm 2: batches of length t0 = min TPOT, decode tokens EDF by scheduled deadline."""
    if not decoders:
        return []
    t0 = min(tpot for tpot, _ in decoders)
    size = batch_tokens(cap, t0, sum(kv for _, kv in decoders))
    queue = [(0.0, i) for i in range(len(decoders))]
    heapq.heapify(queue)
    out: list[PlannedBatch] = []
    for i in range(int(horizon_s / t0 + _EPS)):
        left, dec = size, 0
        while queue and queue[0][0] < (i + 1) * t0 - _EPS and left > 0:
            sch, j = heapq.heappop(queue)
            left -= 1
            dec += 1
            heapq.heappush(queue, (sch + decoders[j][0], j))
        out.append(PlannedBatch(size, dec, left))
    return out


@dataclass(slots=True)
class _Decoders:
    """Running aggregate of a decoder multiset (what ρ needs)."""

    min_tpot: float = math.inf
    inv_sum: float = 0.0
    kv_sum: float = 0.0

    def plus(self, tpot: float | None, kv: float) -> _Decoders:
        if tpot is None:
            return _Decoders(self.min_tpot, self.inv_sum, self.kv_sum + kv)
        return _Decoders(min(self.min_tpot, tpot), self.inv_sum + 1.0 / tpot, self.kv_sum + kv)

    def rate(self, cap: Capacity) -> float:
        return prefill_rate(cap, self.min_tpot, self.inv_sum, self.kv_sum)

    @staticmethod
    def of(decoders: Sequence[tuple[float | None, int]]) -> _Decoders:
        """``_Decoders()`` plus each of ``decoders`` in order (:meth:`plus`'s operations, on plain
        floats: a replica's hundreds of running decoders, without an aggregate object for each)."""
        min_tpot, inv_sum, kv_sum = math.inf, 0.0, 0.0
        for tpot, kv in decoders:
            if tpot is not None:
                min_tpot = min(min_tpot, tpot)
                inv_sum += 1.0 / tpot
            kv_sum += kv
        return _Decoders(min_tpot, inv_sum, kv_sum)


Entry = tuple[float, float, tuple[str, ...]]  # (value, prefill budget, admitted ids)
Key = tuple[int, ...]


def _prune(entries: list[Entry], keep: int) -> list[Entry]:
    """Pareto front of (value ↑, budget ↑), at most ``keep`` entries."""
    entries.sort(key=lambda e: (-e[0], -e[1]))
    front: list[Entry] = []
    best_pb = -math.inf
    for e in entries:
        if e[1] > best_pb + _EPS:
            front.append(e)
            best_pb = e[1]
    return front[:keep]


def plan_admission(
    forced: Sequence[DPItem],
    candidates: Sequence[DPItem],
    now_s: float,
    cap: Capacity,
    *,
    max_states: int = 2048,
    front_size: int = 8,
) -> AdmissionPlan:
    """Choose the subset of ``candidates`` with the largest total value whose SLOs stay attainable."""
    tiers = sorted({c.tpot_s for c in candidates if c.tpot_s is not None})
    tier_kv = {t: [c.decode_kv_tokens for c in candidates if c.tpot_s == t] for t in tiers}
    tier_mean_kv = {t: sum(v) / len(v) for t, v in tier_kv.items()}
    events = sorted([*forced, *candidates], key=lambda x: (x.pddl_s, not x.forced, x.request_id))
    base = _Decoders.of(cap.base_decoders)
    forced_mem = sum(f.memory_units for f in forced)
    forced_seqs = len(forced) + len(cap.base_decoders)
    # key: (count per tier..., untiered count, memory units used by candidates)
    zero: Key = (*([0] * len(tiers)), 0, 0)
    states: dict[Key, list[Entry]] = {zero: [(0.0, 0.0, ())]}
    baseline_pb, t_prev, forced_ok = 0.0, now_s, True

    forced_dec = base
    # a key's rate is a function of the key and the forced decoders, which change only at a forced
    # event: each is computed once between two (the same floats, from the same operations)
    known: dict[Key, float] = {}

    def rate_of(key: Key) -> float:
        rate = known.get(key)
        if rate is None:
            d = forced_dec
            for k, t in enumerate(tiers):
                for _ in range(key[k]):
                    d = d.plus(t, tier_mean_kv[t])
            rate = known[key] = d.rate(cap)
        return rate

    for ev in events:
        dt = max(0.0, ev.pddl_s - t_prev)
        t_prev = max(t_prev, ev.pddl_s)
        rates = {key: rate_of(key) for key in states}
        baseline_pb += forced_dec.rate(cap) * dt
        states = {
            key: [(v, pb + rates[key] * dt, ids) for v, pb, ids in entries] for key, entries in states.items()
        }
        if ev.forced:
            baseline_pb -= ev.prefill_tokens
            floor = min(0.0, baseline_pb) - _EPS
            forced_ok = forced_ok and baseline_pb >= -_EPS
            nxt: dict[Key, list[Entry]] = {}
            for key, entries in states.items():
                kept = [
                    (v, pb - ev.prefill_tokens, ids)
                    for v, pb, ids in entries
                    if pb - ev.prefill_tokens >= floor
                ]
                if kept:
                    nxt[key] = kept
            states = nxt
            forced_dec = forced_dec.plus(ev.tpot_s, ev.decode_kv_tokens)
            known.clear()
            continue
        new_states: dict[Key, list[Entry]] = {k: list(v) for k, v in states.items()}
        for key, entries in states.items():
            mem = key[-1] + ev.memory_units
            n_adm = sum(key[:-1])
            if mem + forced_mem > cap.memory_units or forced_seqs + n_adm + 1 > cap.max_seqs:
                continue
            nk = list(key)
            if ev.tpot_s is None:
                nk[len(tiers)] += 1
            else:
                nk[tiers.index(ev.tpot_s)] += 1
            nk[-1] = mem
            new_key: Key = tuple(nk)
            if rate_of(new_key) < -_EPS:
                continue  # its decode demand cannot be met together with the others'
            grown = [
                (v + ev.value, pb - ev.prefill_tokens, (*ids, ev.request_id))
                for v, pb, ids in entries
                if pb - ev.prefill_tokens >= -_EPS
            ]
            if grown:
                new_states.setdefault(new_key, []).extend(grown)
        states = {k: _prune(v, front_size) for k, v in new_states.items()}
        if sum(len(v) for v in states.values()) > max_states:
            ranked = sorted(states.items(), key=lambda kv: -kv[1][0][0])
            states = dict(ranked[: max(1, max_states // front_size)])
    best: Entry = (0.0, 0.0, ())
    for entries in states.values():
        for e in entries:
            if (e[0], e[1]) > (best[0], best[1]):
                best = e
    admitted = best[2]
    declined = tuple(c.request_id for c in candidates if c.request_id not in set(admitted))
    return AdmissionPlan(admitted, declined, best[0], forced_ok)


def schedule_feasible(items: Sequence[DPItem], now_s: float, cap: Capacity) -> bool:
    """Independent check that every item's prefill fits before its pDDL and decode SLOs hold."""
    if sum(i.memory_units for i in items) > cap.memory_units:
        return False
    if len(items) + len(cap.base_decoders) > cap.max_seqs:
        return False
    dec = _Decoders.of(cap.base_decoders)
    pb, t_prev = 0.0, now_s
    for it in sorted(items, key=lambda x: (x.pddl_s, not x.forced, x.request_id)):
        pb += dec.rate(cap) * max(0.0, it.pddl_s - t_prev)
        t_prev = max(t_prev, it.pddl_s)
        pb -= it.prefill_tokens
        if pb < -_EPS:
            return False
        dec = dec.plus(it.tpot_s, it.decode_kv_tokens)
        if dec.rate(cap) < -_EPS:
            return False
    return True
