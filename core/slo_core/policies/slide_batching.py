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
Over a deep waiting queue (:attr:`SlideBatching.deep_from`) :meth:`SlideBatching.decide` does not
order the queue at all: its walk needs every running request but only the first few waiting ones, so
it keeps their terms between decisions and sorts only that prefix (``_decide_deep``, the same Decision).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import filterfalse
from operator import attrgetter, itemgetter
from typing import Any, ClassVar, Literal

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
from slo_core.policies.snapshot_slots import SnapshotSlots
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
    watch: int = -1,
    unlisted: tuple[bool, float] = (True, 0.0),
) -> tuple[list[str], dict[str, int], float, bool]:
    """The step's batch in ``order`` until the time or token budget is spent: decodes cost their
    execution time, prefills the largest chunk that fits; returns (batch, chunks, batch time, opened).

    ``opened`` says whether the walk reached position ``watch`` of ``order`` (``len(order)``: its
    end) in a state where a waiting request that ``order`` leaves out, listed there, could have
    joined the batch; the batch is then cut short there (the caller lists more and walks again).
    ``unlisted``: whether any request left out is past its prompt (it would join as a decode), and
    the fewest tokens any of them has computed (the prefill chunk that fits shrinks with them)."""
    t_batch = t_c
    kv_free = engine.kv_tokens_free
    seqs = len(waiting) - sum(waiting)  # running sequences
    max_seqs = engine.max_num_seqs
    tokens_left = engine.max_num_batched_tokens
    batch: list[str] = []
    chunks: dict[str, int] = {}
    at_end = watch == len(order)
    for pos, i in enumerate(order):
        if t_batch >= t_budget or tokens_left <= 0:
            at_end = False
            break
        if pos == watch and _could_join(
            unlisted, seqs < max_seqs, kv_free, t_budget - t_batch, profile, beta
        ):
            return batch, chunks, t_batch, True  # the caller walks a longer order instead
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
    # the walk ran off the end of ``order``: would a request listed after it have been looked at
    opened = (
        at_end
        and t_batch < t_budget
        and tokens_left > 0
        and _could_join(unlisted, seqs < max_seqs, kv_free, t_budget - t_batch, profile, beta)
    )
    return batch, chunks, t_batch, opened


def _could_join(  # noqa: PLR0917 - the walk's state
    unlisted: tuple[bool, float],
    seat: bool,
    kv_free: int,
    time_left_s: float,
    profile: PerfProfile,
    beta: float,
) -> bool:
    """Whether a waiting request left out of a walk could join its batch at this point: a seat is
    free, and it decodes, or a chunk of its prompt fits the KV and time left (no chunk fits once
    none fits the fewest computed tokens: the chunk shrinks as the context grows)."""
    decodes, min_computed = unlisted
    if not seat:
        return False
    return decodes or (kv_free > 0 and max_prefill_chunk(profile, time_left_s / beta, min_computed) > 0)


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
        exec_l, remain, density = _list_terms(terms, beta, now_s)
        return exec_l, remain, density, min(remain), numpy_sum(exec_l)
    n = len(terms)
    exec_a, rem, den = _array_terms(
        np.fromiter(map(_CORE, terms), np.float64, n),
        np.fromiter(map(_DUE, terms), np.float64, n),
        np.fromiter(map(_GAIN, terms), np.float64, n),
        beta,
        now_s,
    )
    t_min = float(rem.min())
    if math.isnan(t_min):  # min() of a list skips what np.min propagates
        t_min = min(rem.tolist())
    return exec_a, rem, den, t_min, float(exec_a.sum())  # numpy_sum is this sum on lists


def _list_terms(
    terms: Sequence[_Terms], beta: float, now_s: float
) -> tuple[list[float], list[float], list[float]]:
    """(exec, remain, density) of ``terms`` as lists (see :func:`term_metrics`)."""
    exec_l = [max(t[1] * beta, 1e-6) for t in terms]  # np.maximum(exec, 1e-6)
    remain = [t[2] - now_s for t in terms]
    density = [t[3] / e for t, e in zip(terms, exec_l, strict=True)]
    return exec_l, remain, density


def _array_terms(
    core: np.ndarray, due: np.ndarray, gain: np.ndarray, beta: float, now_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(exec, remain, density) from arrays of T̃, due time and gain: :func:`_list_terms`'s operations
    on every element (new arrays; the inputs are left as they are)."""
    exec_a = core * beta
    np.maximum(exec_a, 1e-6, out=exec_a)
    return exec_a, due - now_s, gain / exec_a


def _plan_key(urgent: bool, density: float, remain: float, r: RequestView) -> tuple[Any, ...]:
    """A request's place in the plan's order (URGENT by density, then by remain; NORMAL by remain;
    ties by arrival, then id): the deep path sorts and merges running and waiting requests by it."""
    if urgent:
        return (0, -density, remain, r.arrival_s, r.request_id)
    return (1, remain, r.arrival_s, r.request_id)


# the deep path's per-request values: T̃ before β, due time, gain weight, prompt tokens left (≤ 0: a
# decode), tokens computed
_WAITING_FIELDS = ("core", "due", "gain", "left", "computed")


def _same_terms(old: RequestView, new: RequestView) -> bool:
    """Whether two snapshots of one request give the same terms (the fields :func:`_terms` reads: a
    waiting request's snapshot is renewed when its program's attained service moves, which they do
    not carry)."""
    return (
        old.computed_tokens == new.computed_tokens
        and old.generated_tokens == new.generated_tokens
        and old.deadline_at_s == new.deadline_at_s
        and old.slo is new.slo
        and old.arrival_s == new.arrival_s
        and old.prompt_tokens == new.prompt_tokens
    )


def _waiting_prefix(k: int, urgent: np.ndarray, density: np.ndarray, remain: np.ndarray) -> list[int]:
    """The slots of the first ``k`` or more waiting requests in the plan's order (every request tied
    with the k-th on its first key included, so the list is a prefix of that order), unsorted."""
    if k <= 0:
        return []
    first = np.flatnonzero(urgent)
    if len(first) > k:
        key = -density[first]
        first = first[key <= np.partition(key, k - 1)[k - 1]]
    left = k - len(first)  # below 0 where the k-th URGENT one has ties
    rest = np.flatnonzero(~urgent) if left > 0 else first[:0]
    if 0 < left < len(rest):
        key = remain[rest]
        rest = rest[key <= np.partition(key, left - 1)[left - 1]]
    out: list[int] = [*first.tolist(), *rest.tolist()]
    return out


class SlideBatching(BaseEnginePolicy):
    """PROSERVE's local scheduler (see the module docstring)."""

    name = "slide-batching"
    frame_steps = 1
    reschedule_on_events = True
    order_free_decisions = True  # canonical_queue; β moves only through observe_batch; never preempts
    # from this many waiting requests (and under the aggressive load judgment) decide() takes
    # _decide_deep, which does not order the whole queue
    deep_from: ClassVar[int] = 512
    # the waiting requests a deep decision lists at first (a walk at a deep queue looks at a handful)
    deep_prefix: ClassVar[int] = 16

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
        # the deep path's waiting requests, with their terms under _waiting_profile
        self._waiting = SnapshotSlots(_WAITING_FIELDS, self._waiting_terms, _same_terms)
        self._waiting_profile: PerfProfile = profile_or_fallback(None)

    def _waiting_terms(self, r: RequestView) -> tuple[float, ...]:
        """A waiting request's values in the deep path's slots (_WAITING_FIELDS)."""
        _, core, due, gain = _terms(r, self._waiting_profile, self.params)
        return core, due, gain, float(remaining_prompt_tokens(r)), float(r.computed_tokens)

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
        batch, chunks, t_batch, _ = _fill_batch(
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

    def _decide_deep(
        self, waiting: Sequence[RequestView], running: Sequence[RequestView], engine: EngineView
    ) -> Decision | None:
        """:meth:`decide` over a deep waiting queue without ordering it: the same Decision, or None
        where this path cannot vouch for it (a NaN term, or a request's remain within the rounding of
        Σexec from the URGENT bar), and :meth:`plan` decides.

        The batch is walked in the plan's order, of which it needs every running request and only
        the first waiting ones: from a free sequence slot on, a walk looks at waiting requests in
        that order until its time, token or KV budget is spent (a handful at a deep queue). So the
        waiting requests' terms are kept between decisions (:class:`SnapshotSlots`), the URGENT bar
        and the budget come from C-level reductions over them (Σexec in any order, checked against
        every remain for the rounding the plan's pairwise order could change), and the walk gets
        the first ``k`` waiting requests of the order (a partition, then a sort of those), ``k``
        growing until the walk ends before it needs the next one. Ties go as in the plan: by
        arrival, then id."""
        p = self.params
        profile = profile_or_fallback(engine.profile)
        store = self._waiting
        if profile is not self._waiting_profile:
            store.reset()
            self._waiting_profile = profile
        store.sync(waiting)
        m = store.size
        if m == 0:
            return None
        col = store.col
        beta = self.correction.factor
        now = engine.now_s
        t_c = overhead_s(profile) * beta
        exec_w, rem_w, den_w = _array_terms(col["core"][:m], col["due"][:m], col["gain"][:m], beta, now)
        exec_r, rem_r, den_r = _list_terms([_terms(r, profile, p) for r in running], beta, now)
        if np.isnan(rem_w).any() or np.isnan(den_w).any() or any(map(math.isnan, [*rem_r, *den_r])):
            return None  # the plan's min and sorts place a NaN by position
        n = m + len(running)
        t_min = min([float(rem_w.min()), *rem_r])
        t_budget = max(t_min, p.eta_s, t_c + 1e-3)
        scale = t_budget / (t_budget - t_c)
        total = float(exec_w.sum()) + math.fsum(exec_r)
        # the plan sums the same terms pairwise in its canonical order: within 8·n·2⁻⁵³ of this
        # total (all terms positive), and the bar is monotone in the total: a remain between the
        # bars of the two ends of that interval is the one membership rounding could change
        slack = 8.0 * n * 2.0**-53 * total
        lo = p.gamma * (scale * (total - slack))
        hi = p.gamma * (scale * (total + slack))
        if bool(((rem_w >= lo) & (rem_w < hi)).any()) or any(lo <= x < hi for x in rem_r):
            return None
        bar = p.gamma * (scale * total)
        urgent_w = rem_w < bar
        urgent_r = [x < bar for x in rem_r]
        n_urgent = int(urgent_w.sum()) + sum(urgent_r)
        run_keys = list(map(_plan_key, urgent_r, den_r, rem_r, running))
        run_order = sorted(range(len(running)), key=run_keys.__getitem__)
        # what any waiting request can do in the walk (the unlisted ones are among them)
        unlisted = (bool((col["left"][:m] <= 0).any()), float(col["computed"][:m].min()))
        # a full engine skips every waiting request (no slot frees up within a step)
        k = 0 if len(running) >= engine.max_num_seqs else self.deep_prefix
        while True:
            first = _waiting_prefix(k, urgent_w, den_w, rem_w)
            entries = [(run_keys[j], j, True) for j in run_order]
            entries += [
                (_plan_key(bool(urgent_w[s]), float(den_w[s]), float(rem_w[s]), store.view(s)), s, False)
                for s in first
            ]
            entries.sort()  # two sorted runs: one merge
            queue = [running[i] if is_run else store.view(i) for _, i, is_run in entries]
            exec_m = [exec_r[i] if is_run else float(exec_w[i]) for _, i, is_run in entries]
            flags = [not is_run for _, _, is_run in entries]
            watch = -1
            if len(first) < m:  # the walk must end before the first waiting request not listed
                watch = max(pos for pos, e in enumerate(entries) if not e[2]) + 1 if first else 0
            batch, _, _, opened = _fill_batch(
                queue, range(len(queue)), exec_m, flags, t_c, t_budget, engine, profile, beta, watch, unlisted
            )
            if not opened:
                break
            k = 4 * k + 1
        in_batch = set(batch)
        ids = [running[j].request_id for j in run_order]
        running_ids = set(ids)
        return new_decision(
            admit=tuple(rid for rid in batch if rid not in running_ids),
            running_order=(*filter(in_batch.__contains__, ids), *filterfalse(in_batch.__contains__, ids)),
            hold_unlisted=True,
            reason=f"budget={t_budget * 1000:.1f}ms urgent={n_urgent}/{n}",
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
        batch, chunks, t_batch, _ = _fill_batch(
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
        if len(waiting) >= self.deep_from and self.params.load_judgment == "aggressive":
            deep = self._decide_deep(waiting, running, engine)
            if deep is not None:
                return deep
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
