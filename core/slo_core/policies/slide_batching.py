"""PROSERVE SlideBatching (§4.2, Algorithm 1): a latency-budgeted batch with a sliding URGENT/NORMAL split.

For every queued request r (running and waiting): ``exec_r = β·T̃_pd(r)`` (§4.1 eq. 5–6, β the online
correction factor), ``remain_r = deadline_{r, next token} − now`` (TDG deadlines, eq. 3) and
``density_r = w_r(next token) / exec_r``. The latency budget is ``t_budget = max(min_r remain_r, η)``.
A request is URGENT when ``remain_r < γ·φ(r, Q)`` with the load-judgment function

    φ_a(Q)    = t_budget / (t_budget − t_c) · Σ_{q∈Q} exec_q                      (aggressive, eq. 8)
    φ_c(r, Q) = t_budget / (t_budget − t_c) · Σ_{i ≤ index(r)} Q_by_remain[i].exec  (conservative, eq. 9)

URGENT requests go first by density (descending), NORMAL ones after by remain (ascending): deadline-first
at low load, density-first (a fractional knapsack) at high load. Ties (which the paper leaves open) go
by arrival, then request id, whatever order the engine lists the queue in (:func:`canonical_queue`).
The batch is then filled from that order starting at ``t_batch = t_c`` while ``t_batch < t_budget``: a
decode adds its T̃_d, a prefill adds the largest chunk that still fits (chunked prefill), bounded by
free KV, sequence slots and the token budget.
Waiting requests outside the batch are held (``hold_unlisted``); running ones are ordered batch-first.

The policy decides every engine step, so :meth:`SlideBatching.plan` runs on plain floats (the numpy
functions below are the reference: ``tests/unit/core/policies/test_slide_batching_scalar.py`` checks
the two agree bit for bit) and keeps each request's static terms (its T̃, due time and gain weight)
while its snapshot object is unchanged: a request that merely waits costs a dict lookup per step.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from slo_core.objective import Objective
from slo_core.perf.model import OnlineCorrection, PerfProfile
from slo_core.policies.base import (
    BaseEnginePolicy,
    Decision,
    EngineView,
    RequestView,
    new_decision,
    request_id_of,
)
from slo_core.policies.float_sum import numpy_sum
from slo_core.policies.seed_estimates import (
    decode_core_s,
    max_prefill_chunk,
    next_token_due_s,
    overhead_s,
    prefill_core_s,
    profile_or_fallback,
    remaining_prompt_tokens,
)
from slo_core.slo import RequestKind


def _fill_batch(  # noqa: PLR0917 - the plan's state, shared by the scalar and numpy paths
    queue: Sequence[RequestView],
    order: Sequence[int],
    exec_s: list[float] | np.ndarray,
    waiting: Sequence[bool],
    t_c: float,
    t_budget: float,
    engine: EngineView,
    profile: PerfProfile,
    beta: float,
) -> tuple[list[str], dict[str, int], float]:
    """The step's batch in ``order`` until the time or token budget is spent: decodes cost their
    execution time, prefills the largest chunk that fits; returns (batch, chunks, batch time)."""
    t_batch = t_c
    kv_free = engine.kv_tokens_free
    seqs = len(waiting) - sum(waiting)  # running sequences
    max_seqs = engine.max_num_seqs
    tokens_left = engine.max_num_batched_tokens
    batch: list[str] = []
    chunks: dict[str, int] = {}
    for i in order:
        if t_batch >= t_budget or tokens_left <= 0:
            break
        r = queue[i]
        is_waiting = waiting[i]
        if is_waiting and seqs >= max_seqs:
            continue
        left = remaining_prompt_tokens(r)
        if left <= 0:
            t_batch += exec_s[i]
            chunk = 1
        else:
            fit = max_prefill_chunk(profile, (t_budget - t_batch) / beta, r.computed_tokens)
            chunk = min(left, fit, tokens_left, kv_free)
            if chunk <= 0:
                continue
            t_batch += prefill_core_s(profile, chunk, r.computed_tokens) * beta
            kv_free -= chunk
        tokens_left -= chunk
        seqs += int(is_waiting)
        batch.append(r.request_id)
        chunks[r.request_id] = chunk
    return batch, chunks, t_batch


class SlideBatchingParams(BaseModel):
    """Parameters of SlideBatching (PROSERVE §4.2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eta_s: float = Field(0.025, gt=0, description="η: lower bound of the latency budget (seconds)")
    gamma: float = Field(
        1.0, ge=0, description="γ: aggressiveness; larger marks more requests URGENT (dimensionless)"
    )
    load_judgment: Literal["aggressive", "conservative"] = Field(
        "aggressive", description="φ_a (eq. 8, the paper's choice for PD co-location) or φ_c (eq. 9)"
    )
    first_token_weight: float = Field(1.0, gt=0, description="TDG w_p: gain of a first token (unitless)")
    decode_token_weight: float = Field(1.0, gt=0, description="TDG w_d: gain of a later token (unitless)")
    correction_momentum: float = Field(
        0.9, ge=0, lt=1, description="θ of the online latency correction β ← θβ + (1−θ)·real/est (unitless)"
    )


@dataclass(frozen=True, slots=True)
class SlidePlan:
    """One SlideBatching pass: the ordered queue, its URGENT subset and the batch that fits the budget."""

    order: tuple[str, ...]
    urgent: frozenset[str]
    batch: tuple[str, ...]
    chunks: dict[str, int]
    t_budget_s: float
    t_batch_s: float


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """Per-request exec / remain / density arrays of a queue (PROSERVE Algorithm 1 lines 2–7)."""

    exec_s: np.ndarray
    remain_s: np.ndarray
    density: np.ndarray
    t_budget_s: float
    t_c_s: float


def queue_metrics(
    queue: Sequence[RequestView],
    now_s: float,
    profile: PerfProfile,
    params: SlideBatchingParams,
    latency_factor: float = 1.0,
) -> QueueMetrics:
    """Compute exec (whole remaining prefill, or one decode), remain and density for every request."""
    t_c = overhead_s(profile) * latency_factor
    n = len(queue)
    exec_s = np.empty(n)
    remain = np.empty(n)
    gain = np.empty(n)
    for i, r in enumerate(queue):
        left = remaining_prompt_tokens(r)
        if left > 0:
            exec_s[i] = prefill_core_s(profile, left, r.computed_tokens)
        else:
            exec_s[i] = decode_core_s(profile, r.computed_tokens)
        remain[i] = next_token_due_s(r) - now_s
        w = params.first_token_weight if r.generated_tokens == 0 else params.decode_token_weight
        gain[i] = w * r.priority_weight
    exec_s *= latency_factor
    exec_s = np.maximum(exec_s, 1e-6)
    t_min = float(remain.min()) if n else float("inf")
    t_budget = max(t_min, params.eta_s, t_c + 1e-3)
    return QueueMetrics(exec_s, remain, gain / exec_s, t_budget, t_c)


def urgent_mask(m: QueueMetrics, params: SlideBatchingParams) -> np.ndarray:
    """Algorithm 1 lines 8–12: URGENT where remain < γ·φ(r, Q)."""
    scale = m.t_budget_s / (m.t_budget_s - m.t_c_s)
    if params.load_judgment == "aggressive":
        phi = np.full(len(m.exec_s), scale * float(m.exec_s.sum()))
    else:
        by_remain = np.argsort(m.remain_s, kind="stable")
        cum = np.cumsum(m.exec_s[by_remain])
        phi = np.empty(len(m.exec_s))
        phi[by_remain] = scale * cum
    return np.asarray(m.remain_s < params.gamma * phi)


def slide_order(m: QueueMetrics, urgent: np.ndarray) -> np.ndarray:
    """Algorithm 1 line 13: URGENT by density descending, then NORMAL by remain ascending."""
    idx = np.arange(len(m.exec_s))
    urg = idx[urgent]
    urg = urg[np.lexsort((m.remain_s[urg], -m.density[urg]))]
    nor = idx[~urgent]
    nor = nor[np.argsort(m.remain_s[nor], kind="stable")]
    return np.concatenate([urg, nor]).astype(int)


_LATENCY = RequestKind.LATENCY


def canonical_queue(
    waiting: Sequence[RequestView], running: Sequence[RequestView]
) -> tuple[list[RequestView], list[bool]]:
    """Running and waiting requests in one fixed order (arrival, then id) with each one's waiting flag.

    Every tie of the plan (equal remain or density, the order of the Σexec sum) is broken by this
    order, so a plan is a function of the queue's contents, not of the order the engine lists them in
    (``SlideBatching.order_free_decisions``).
    """
    # by id, then (stable) by arrival: the order of the (arrival, id) pairs, ids being unique, with
    # no key tuple built per request and float compares wherever arrivals differ. It pays here, where
    # the engine lists the queue in the last plan's order; on a list already in arrival order one
    # sort on (arrival, id) is a single linear pass and cheaper (SLOs-Serve's best-effort queue)
    queue = sorted([*running, *waiting], key=request_id_of)
    queue.sort(key=_ARRIVAL)
    if not running:
        return queue, [True] * len(queue)
    running_ids = set(map(request_id_of, running))
    return queue, [r.request_id not in running_ids for r in queue]


_ARRIVAL = attrgetter("arrival_s")
# from this many queued requests the plan's arithmetic and its two sorts run in numpy (below, plain
# lists are cheaper)
_NUMPY_FROM = 256
_CORE, _DUE, _GAIN = itemgetter(1), itemgetter(2), itemgetter(3)

# per request id: (the snapshot the terms were computed from, T̃ before β, next-token due time, gain)
_Terms = tuple[RequestView, float, float, float]


def _terms(r: RequestView, profile: PerfProfile, params: SlideBatchingParams) -> _Terms:
    """A request's static terms (what prefill_core_s / decode_core_s and next_token_due_s compute,
    inlined: a running decode's snapshot is new every step)."""
    computed = r.computed_tokens
    gen = r.generated_tokens
    left = remaining_prompt_tokens(r)
    if left > 0:
        core = prefill_core_s(profile, left, computed)
    else:
        core = (profile.d_ms_per_kv_token * computed + profile.a_ms_per_token) / 1000.0
    slo = r.slo
    if slo.kind is _LATENCY:
        due = r.arrival_s + slo.token_deadline_s(gen)
    elif r.deadline_at_s is not None:
        due = r.deadline_at_s
    else:
        due = r.arrival_s + slo.effective_deadline_s
    w = params.first_token_weight if gen == 0 else params.decode_token_weight
    return (r, core, due, w * slo.priority_weight)


_Floats = list[float] | np.ndarray


def term_metrics(
    terms: Sequence[_Terms], beta: float, now_s: float, *, in_numpy: bool
) -> tuple[_Floats, _Floats, _Floats, float, float]:
    """(exec, remain, density, min remain, Σexec) of the queue's terms at β and ``now_s``, as
    :func:`queue_metrics` computes them: exec = max(T̃·β, 1e-6), remain = due − now, density = gain /
    exec, Σ numpy's pairwise sum. ``in_numpy``: as float64 arrays (a deep queue), else as lists; the
    same IEEE operations on every element either way, so the same bits (tested)."""
    if not in_numpy:
        exec_l = [max(t[1] * beta, 1e-6) for t in terms]  # np.maximum(exec, 1e-6)
        remain = [t[2] - now_s for t in terms]
        density = [t[3] / e for t, e in zip(terms, exec_l, strict=True)]
        return exec_l, remain, density, min(remain), numpy_sum(exec_l)
    n = len(terms)
    exec_a = np.fromiter(map(_CORE, terms), np.float64, n)
    exec_a *= beta
    np.maximum(exec_a, 1e-6, out=exec_a)
    rem = np.fromiter(map(_DUE, terms), np.float64, n)
    rem -= now_s
    den = np.fromiter(map(_GAIN, terms), np.float64, n)
    den /= exec_a
    t_min = float(rem.min())
    if math.isnan(t_min):  # min() of a list skips what np.min propagates
        t_min = min(rem.tolist())
    return exec_a, rem, den, t_min, float(exec_a.sum())  # numpy_sum is this sum on lists


class SlideBatching(BaseEnginePolicy):
    """PROSERVE's local scheduler (see the module docstring)."""

    name = "slide-batching"
    frame_steps = 1
    reschedule_on_events = True
    order_free_decisions = True  # canonical_queue; β moves only through observe_batch; never preempts

    @classmethod
    def objective_params(cls, objective: Objective) -> dict[str, object]:
        """TDG's token weights from spec.goodput (token and request objectives weigh tokens alike)."""
        g = objective.gain
        if objective.goodput in ("tdg", "tempo"):
            return {
                "first_token_weight": max(g.first_token_weight, 1e-6),
                "decode_token_weight": max(g.decode_token_weight, 1e-6),
            }
        return {"first_token_weight": 1.0, "decode_token_weight": 1.0}

    def __init__(self, params: SlideBatchingParams | None = None, **kwargs: object) -> None:
        self.params = params if params is not None else SlideBatchingParams.model_validate(kwargs)
        self.correction = OnlineCorrection(momentum=self.params.correction_momentum)
        self._terms: dict[str, _Terms] = {}
        self._terms_profile: PerfProfile | None = None

    def observe_batch(self, estimated_s: float, measured_s: float) -> float:
        """Fold one measured batch time into the correction factor β (PROSERVE §4.1)."""
        return self.correction.observe(estimated_s, measured_s)

    def plan(
        self, waiting: Sequence[RequestView], running: Sequence[RequestView], engine: EngineView
    ) -> SlidePlan:
        """Order the queue and fill one batch up to the latency budget (plain floats; the same
        arithmetic, in the same order, as queue_metrics, urgent_mask and slide_order)."""
        profile = profile_or_fallback(engine.profile)
        queue, is_waiting = canonical_queue(waiting, running)
        if not queue:
            return SlidePlan((), frozenset(), (), {}, self.params.eta_s, 0.0)
        p = self.params
        beta = self.correction.factor
        now = engine.now_s
        if profile is not self._terms_profile:
            self._terms = {}
            self._terms_profile = profile
        old = self._terms
        ids = list(map(request_id_of, queue))
        terms: list[_Terms] = []
        append = terms.append
        for r, rid in zip(queue, ids, strict=True):
            t = old.get(rid)
            if t is None or t[0] is not r:
                t = _terms(r, profile, p)
            append(t)
        self._terms = dict(zip(ids, terms, strict=True))  # requests that left the queue drop out
        n = len(queue)
        t_c = overhead_s(profile) * beta
        deep = n >= _NUMPY_FROM
        exec_s, remain_s, density_s, t_min, total_exec = term_metrics(terms, beta, now, in_numpy=deep)
        t_budget = max(t_min, p.eta_s, t_c + 1e-3)
        scale = t_budget / (t_budget - t_c)
        if p.load_judgment == "aggressive":
            bar = p.gamma * (scale * total_exec)
            if deep:
                mask = np.asarray(remain_s) < bar
            else:
                urgent = [x < bar for x in remain_s]
        else:
            remain = remain_s.tolist() if isinstance(remain_s, np.ndarray) else remain_s
            exec_l = exec_s.tolist() if isinstance(exec_s, np.ndarray) else exec_s
            by_remain = sorted(range(n), key=remain.__getitem__)
            urgent = [False] * n
            cum = 0.0
            for i in by_remain:
                cum += exec_l[i]
                urgent[i] = remain[i] < p.gamma * (scale * cum)
            if deep:
                mask = np.array(urgent, dtype=bool)
        if deep:  # the same stable sorts (a deep queue at overload: 2.5x faster)
            rem, den = np.asarray(remain_s), np.asarray(density_s)
            idx = np.arange(n)
            u = idx[mask]
            v = idx[~mask]
            urg = u[np.lexsort((rem[u], -den[u]))].tolist()
            nor = v[np.argsort(rem[v], kind="stable")].tolist()
        else:
            urg = [i for i in range(n) if urgent[i]]
            urg.sort(key=lambda i: (-density_s[i], remain_s[i]))
            nor = [i for i in range(n) if not urgent[i]]
            nor.sort(key=remain_s.__getitem__)
        order = urg + nor
        batch, chunks, t_batch = _fill_batch(
            queue, order, exec_s, is_waiting, t_c, t_budget, engine, profile, beta
        )
        return SlidePlan(
            order=tuple(map(ids.__getitem__, order)),
            urgent=frozenset(map(ids.__getitem__, urg)),
            batch=tuple(batch),
            chunks=chunks,
            t_budget_s=t_budget,
            t_batch_s=float(t_batch),  # a numpy float where exec_s is an array
        )

    def plan_reference(
        self, waiting: Sequence[RequestView], running: Sequence[RequestView], engine: EngineView
    ) -> SlidePlan:
        """:meth:`plan` through the numpy functions above (the reference the fast path must match)."""
        profile = profile_or_fallback(engine.profile)
        queue, is_waiting = canonical_queue(waiting, running)
        if not queue:
            return SlidePlan((), frozenset(), (), {}, self.params.eta_s, 0.0)
        beta = self.correction.factor
        m = queue_metrics(queue, engine.now_s, profile, self.params, beta)
        urgent = urgent_mask(m, self.params)
        order = slide_order(m, urgent)
        batch, chunks, t_batch = _fill_batch(
            queue,
            order.tolist(),
            m.exec_s.tolist(),
            is_waiting,
            m.t_c_s,
            m.t_budget_s,
            engine,
            profile,
            beta,
        )
        ids = tuple(queue[i].request_id for i in order)
        return SlidePlan(
            order=ids,
            urgent=frozenset(queue[i].request_id for i in np.flatnonzero(urgent)),
            batch=tuple(batch),
            chunks=chunks,
            t_budget_s=m.t_budget_s,
            t_batch_s=t_batch,
        )

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        plan = self.plan(waiting, running, engine)
        in_batch = set(plan.batch)
        running_ids = set(map(request_id_of, running))
        run_order = list(filter(running_ids.__contains__, plan.order))  # one C-level pass
        run_order.sort(key=lambda rid: rid not in in_batch)
        admit = tuple(rid for rid in plan.batch if rid not in running_ids)
        return new_decision(
            admit=admit,
            running_order=tuple(run_order),
            hold_unlisted=True,
            reason=f"budget={plan.t_budget_s * 1000:.1f}ms urgent={len(plan.urgent)}/{len(plan.order)}",
        )
