"""Simulated-annealing priority mapping co-optimized with batch sizes (SLO-aware scheduler §3.1, §4.2–§4.4).

Objective (eq. 2–13): ``G = n / t`` with n the number of requests predicted to meet their SLO and
``t = Σ_i t_e2e,i`` the summed latency, ``t_e2e = t_wait + t_exec``. Requests run in the priority
sequence cut into batches b_0, b_1, …; a batch lasts as long as its slowest member and
``t_wait,i = waited so far + Σ_{batches before i's} batch time``. An e2e request (deadline kinds) meets its
SLO if ``t_e2e ≤ deadline``; a latency request if ``TTFT = t_wait + t_p ≤ TTFT_SLO`` and
``TPOT = t_d / l_o ≤ TBT_SLO``. The latency predictor (§4.2, eq. 14–17) is fitted by least squares to
the engine's profile: ``t_p(b, l_i) = α_p·b·l_i + β_p·b + γ_p·l_i + δ_p``,
``τ_d(b, l_a) = α_d·b·l_a + β_d·b + γ_d·l_a + δ_d`` and ``t_d = Σ_{k=1}^{l_o} τ_d(b, l_i + k)``. The
output length l_o is learned online per task (tenant, priority class, kind) from finished requests
(a quantile of the last ``history_per_task``), else the request's predicted bound or max_tokens.

Search (Algorithm 1): two starting solutions — the arrival order with full batches, and the order by
predicted e2e latency (returned at once if it meets every SLO); from the better one, annealing with
three moves (squeeze a request into the previous batch, delay it to the next, swap two requests),
Metropolis acceptance ``exp((G_new − G)/T)`` and ``T ← τ·T`` until ``T < T_thres``. The best solution
seen is returned, so the result is never worse than the better starting solution.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from slo_core.perf.model import PerfProfile
from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, FinishedView, RequestView
from slo_core.policies.seed_estimates import DEFAULT_OUTPUT_TOKENS, profile_or_fallback
from slo_core.slo import RequestKind


class AnnealingParams(BaseModel):
    """Parameters of the simulated-annealing priority mapper."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    initial_temperature: float = Field(
        0.05, gt=0, description="T0 as a fraction of the starting G (unitless)"
    )
    threshold_temperature: float = Field(
        5e-4, gt=0, description="T_thres as a fraction of the starting G (unitless)"
    )
    decay: float = Field(0.8, gt=0, lt=1, description="τ: temperature decay per level (unitless)")
    iterations_per_temperature: int = Field(12, ge=1, description="moves tried at each temperature (moves)")
    max_batch_size: int | None = Field(
        None, ge=1, description="largest batch; default max_num_seqs (requests)"
    )
    max_jobs: int = Field(48, ge=2, description="waiting requests mapped per call, oldest first (requests)")
    frame_steps: int = Field(8, ge=1, description="engine steps between priority mappings (steps)")
    history_per_task: int = Field(512, ge=8, description="finished output lengths kept per task (requests)")
    min_task_samples: int = Field(
        8, ge=1, description="samples before a task's distribution is used (requests)"
    )
    length_quantile: float = Field(0.5, gt=0, lt=1, description="quantile of the task's output lengths used")
    hold_later_batches: bool = Field(
        False, description="admit only the first planned batch (else the whole order)"
    )


def least_squares(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """argmin_c ||A c - y||₂ for a tall full-rank A (``rows``), by Householder QR in plain floats.

    Not ``np.linalg.lstsq``: LAPACK's result depends on the BLAS kernel the CPU selects (OpenBLAS'
    SkylakeX and Haswell kernels differ in the last bits here), and annealing turns the last bit
    of a coefficient into a different Metropolis draw, so a seeded run would differ from machine to
    machine. Every operation here is a correctly rounded IEEE one (``math.fsum`` for the dot
    products, ``math.sqrt``) in a fixed order: the same coefficients on every machine.
    """
    a = [list(map(float, r)) for r in rows]
    b = [float(v) for v in y]
    m, n = len(a), len(a[0])
    if m < n:
        raise ValueError(f"least squares needs at least as many rows as columns, got {m}x{n}")
    for k in range(n):
        v = [a[i][k] for i in range(k, m)]
        norm = math.sqrt(math.fsum(t * t for t in v))
        if norm == 0.0:
            raise ValueError(f"least squares: column {k} is linearly dependent on the ones before it")
        alpha = -math.copysign(norm, v[0])
        v[0] -= alpha
        vv = math.fsum(t * t for t in v)
        if vv == 0.0:
            continue
        for j in range(k, n):  # A[k:, j] -= 2 v (vᵀ A[k:, j]) / vᵀv
            f = 2.0 * math.fsum(v[i] * a[k + i][j] for i in range(m - k)) / vv
            for i in range(m - k):
                a[k + i][j] -= f * v[i]
        f = 2.0 * math.fsum(v[i] * b[k + i] for i in range(m - k)) / vv
        for i in range(m - k):
            b[k + i] -= f * v[i]
    c = [0.0] * n
    for k in reversed(range(n)):  # back substitution on R (the upper n×n of the reduced A)
        c[k] = (b[k] - math.fsum(a[k][j] * c[j] for j in range(k + 1, n))) / a[k][k]
    return c


@dataclass(frozen=True, slots=True)
class LatencyPredictor:
    """eq. 14–16: prefill and per-token decode time, each linear in b, l and b·l (seconds)."""

    prefill: tuple[float, float, float, float]
    decode: tuple[float, float, float, float]

    @classmethod
    def fit(cls, profile: PerfProfile) -> LatencyPredictor:
        """Least squares over a grid of batch sizes and lengths sampled from the profile."""
        rows, y_p, y_d = cls.samples(profile)
        cp = least_squares(rows, y_p)
        cd = least_squares(rows, y_d)
        return cls(tuple(cp), tuple(cd))  # type: ignore[arg-type]

    @staticmethod
    def samples(profile: PerfProfile) -> tuple[list[list[float]], list[float], list[float]]:
        """The fit's design rows (b·l, b, l, 1) and the profile's prefill and decode times at them."""
        bs = np.array([1, 2, 4, 8, 16, 32, 64, 128], dtype=float)
        ls = np.array([32, 64, 128, 256, 512, 1024, 2048], dtype=float)
        b, ln = (g.ravel() for g in np.meshgrid(bs, ls))
        x = np.column_stack([b * ln, b, ln, np.ones_like(b)])
        y_p = [
            profile.iteration_time_from_sums_s(int(bi * li), bi * li * li, 0.0, int(bi))
            for bi, li in zip(b, ln, strict=True)
        ]
        y_d = [
            profile.iteration_time_from_sums_s(int(bi), 0.0, bi * li) for bi, li in zip(b, ln, strict=True)
        ]
        return x.tolist(), y_p, y_d

    def times(self, b: np.ndarray, l_in: np.ndarray, l_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(t_p, t_d) per request for batch sizes b (eq. 14 and the closed form of eq. 16)."""
        ap, bp, gp, dp = self.prefill
        ad, bd, gd, dd = self.decode
        t_p = np.maximum(0.0, ap * b * l_in + bp * b + gp * l_in + dp)
        sum_la = l_out * l_in + l_out * (l_out + 1) / 2.0
        t_d = np.maximum(0.0, l_out * (bd * b + dd) + (ad * b + gd) * sum_la)
        return t_p, t_d


@dataclass(frozen=True, slots=True)
class Jobs:
    """The arrays the objective needs, in input order."""

    ids: tuple[str, ...]
    l_in: np.ndarray
    l_out: np.ndarray
    waited_s: np.ndarray
    e2e_slo_s: np.ndarray  # inf for latency requests
    ttft_slo_s: np.ndarray  # inf for e2e requests
    tpot_slo_s: np.ndarray  # inf for e2e requests


@dataclass(frozen=True, slots=True)
class Mapping:
    """A priority sequence (indices into Jobs) with its batch sizes and objective."""

    order: tuple[int, ...]
    sizes: tuple[int, ...]
    g: float
    met: int


def evaluate(
    jobs: Jobs, pred: LatencyPredictor, order: Sequence[int], sizes: Sequence[int]
) -> tuple[float, int]:
    """G = n / Σ t_e2e and n for one sequence and batch split."""
    idx = np.asarray(order)
    sz = np.asarray(sizes)
    batch_of = np.repeat(np.arange(len(sz)), sz)
    b = sz[batch_of].astype(float)
    t_p, t_d = pred.times(b, jobs.l_in[idx], jobs.l_out[idx])
    exe = t_p + t_d
    starts = np.concatenate([[0], np.cumsum(sz)[:-1]])
    batch_s = np.maximum.reduceat(exe, starts)
    before = np.concatenate([[0.0], np.cumsum(batch_s)[:-1]])
    wait = jobs.waited_s[idx] + before[batch_of]
    e2e = wait + exe
    ok = (e2e <= jobs.e2e_slo_s[idx]) & (wait + t_p <= jobs.ttft_slo_s[idx])
    ok &= t_d / np.maximum(jobs.l_out[idx], 1.0) <= jobs.tpot_slo_s[idx]
    met = int(ok.sum())
    return met / max(float(e2e.sum()), 1e-9), met


def full_batches(n: int, first_cap: int, max_b: int) -> list[int]:
    sizes = [min(n, first_cap)]
    while sum(sizes) < n:
        sizes.append(min(max_b, n - sum(sizes)))
    return [s for s in sizes if s > 0]


def _neighbour(
    order: list[int], sizes: list[int], caps: list[int], rng: random.Random
) -> tuple[list[int], list[int]]:
    """One of Algorithm 1's three moves (may return the input unchanged when the move is not allowed)."""
    order, sizes = list(order), list(sizes)
    n = len(order)
    op = rng.randrange(3)
    if op == 2 or (len(sizes) == 1 and sizes[0] == 1):
        i, j = rng.randrange(n), rng.randrange(n)
        order[i], order[j] = order[j], order[i]
        return order, sizes
    pos = rng.randrange(n)
    starts = [0, *itertools.accumulate(sizes)]
    k = bisect.bisect_right(starts, pos) - 1
    job = order.pop(pos)
    if op == 0:  # squeeze into the previous batch
        if k == 0 or sizes[k - 1] >= caps[min(k - 1, len(caps) - 1)]:
            order.insert(pos, job)
            return order, sizes
        order.insert(starts[k], job)
        sizes[k - 1] += 1
        sizes[k] -= 1
    else:  # delay to the next batch
        if (k + 1 < len(sizes) and sizes[k + 1] >= caps[min(k + 1, len(caps) - 1)]) or (
            sizes[k] == 1 and k + 1 == len(sizes)
        ):
            order.insert(pos, job)
            return order, sizes
        order.insert(starts[k + 1] - 1, job)
        sizes[k] -= 1
        if k + 1 == len(sizes):
            sizes.append(1)
        else:
            sizes[k + 1] += 1
    return order, [s for s in sizes if s > 0]


def map_priorities(
    jobs: Jobs,
    pred: LatencyPredictor,
    params: AnnealingParams,
    rng: random.Random,
    *,
    first_cap: int,
    max_b: int,
) -> tuple[Mapping, Mapping, Mapping]:
    """Algorithm 1. Returns (best found, arrival-order start, e2e-sorted start)."""
    n = len(jobs.ids)
    caps = [first_cap, max_b]
    sizes = full_batches(n, first_cap, max_b)
    arrival = list(range(n))
    g0, m0 = evaluate(jobs, pred, arrival, sizes)
    start_a = Mapping(tuple(arrival), tuple(sizes), g0, m0)
    t_p, t_d = pred.times(np.full(n, float(max_b)), jobs.l_in, jobs.l_out)
    by_e2e = sorted(range(n), key=lambda i: float(t_p[i] + t_d[i]))
    g1, m1 = evaluate(jobs, pred, by_e2e, sizes)
    start_e = Mapping(tuple(by_e2e), tuple(sizes), g1, m1)
    if m1 == n or n < 2:
        return start_e, start_a, start_e
    cur = start_e if g1 >= g0 else start_a
    best = cur
    temp = params.initial_temperature * max(cur.g, 1e-9)
    t_end = params.threshold_temperature * max(cur.g, 1e-9)
    order, sz, g = list(cur.order), list(cur.sizes), cur.g
    while temp >= t_end:
        for _ in range(params.iterations_per_temperature):
            new_order, new_sz = _neighbour(order, sz, caps, rng)
            g_new, met_new = evaluate(jobs, pred, new_order, new_sz)
            if g_new > g or rng.random() < math.exp((g_new - g) / temp):
                order, sz, g = new_order, new_sz, g_new
                if g > best.g:
                    best = Mapping(tuple(order), tuple(sz), g, met_new)
        temp *= params.decay
    return best, start_a, start_e


class Annealing(BaseEnginePolicy):
    """The SA scheduler's engine policy: maps waiting requests to priorities every frame."""

    name = "annealing"
    reschedule_on_events = False

    def __init__(self, params: AnnealingParams | None = None, **kwargs: object) -> None:
        self.params = params if params is not None else AnnealingParams.model_validate(kwargs)
        self.frame_steps = self.params.frame_steps
        # with nothing waiting a decision is Decision(): no order, no budget, nothing held, which is what
        # the last decision left in force unless it held later batches; then engines leave it out
        # (BaseEnginePolicy.skip_quiet_decisions; a frame-only policy: arrivals meet the kept knobs)
        self.skip_quiet_decisions = not self.params.hold_later_batches
        self._predictors: dict[str, LatencyPredictor] = {}
        self._lengths: dict[tuple[str, str, str], deque[int]] = {}
        self._quantile: dict[tuple[str, str, str], float] = {}

    @staticmethod
    def task_of(r: RequestView) -> tuple[str, str, str]:
        return (r.tenant, r.slo.priority_class, r.kind.value)

    def observe(self, finished: Sequence[FinishedView], now_s: float) -> None:
        """Learn each task's output-length distribution from finished requests (§4.2)."""
        for f in finished:
            key = self.task_of(f.request)
            hist = self._lengths.setdefault(key, deque(maxlen=self.params.history_per_task))
            hist.append(f.request.generated_tokens)
            self._quantile.pop(key, None)

    def predicted_output_tokens(self, r: RequestView) -> float:
        key = self.task_of(r)
        hist = self._lengths.get(key)
        if hist is not None and len(hist) >= self.params.min_task_samples:
            q = self._quantile.get(key)
            if q is None:
                q = self._quantile[key] = float(np.quantile(np.asarray(hist), self.params.length_quantile))
            return max(q, r.generated_tokens + 1.0)
        if r.output_bound is not None:
            return float(r.output_bound)
        return float(r.max_tokens if r.max_tokens > 0 else DEFAULT_OUTPUT_TOKENS)

    def jobs_of(self, reqs: Sequence[RequestView], now_s: float) -> Jobs:
        inf = math.inf
        lat = [r.kind is RequestKind.LATENCY for r in reqs]
        return Jobs(
            ids=tuple(r.request_id for r in reqs),
            l_in=np.array([float(r.prompt_tokens) for r in reqs]),
            l_out=np.array([self.predicted_output_tokens(r) for r in reqs]),
            waited_s=np.array([now_s - r.arrival_s for r in reqs]),
            e2e_slo_s=np.array(
                [
                    inf
                    if is_lat
                    else (r.deadline_at_s or r.arrival_s + r.slo.effective_deadline_s) - r.arrival_s
                    for r, is_lat in zip(reqs, lat, strict=True)
                ]
            ),
            ttft_slo_s=np.array(
                [(r.slo.ttft_s or inf) if is_lat else inf for r, is_lat in zip(reqs, lat, strict=True)]
            ),
            tpot_slo_s=np.array(
                [(r.slo.tbt_s or inf) if is_lat else inf for r, is_lat in zip(reqs, lat, strict=True)]
            ),
        )

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        if not waiting:
            return Decision()
        prof = profile_or_fallback(engine.profile)
        pred = self._predictors.get(prof.name)
        if pred is None:
            pred = self._predictors[prof.name] = LatencyPredictor.fit(prof)
        fifo = sorted(waiting, key=lambda r: (r.arrival_s, r.request_id))
        head, tail = fifo[: self.params.max_jobs], fifo[self.params.max_jobs :]
        max_b = self.params.max_batch_size or engine.max_num_seqs
        first_cap = max(1, min(max_b, engine.max_num_seqs - len(running)))
        jobs = self.jobs_of(head, engine.now_s)
        best, _, _ = map_priorities(jobs, pred, self.params, rng, first_cap=first_cap, max_b=max_b)
        ordered = [jobs.ids[i] for i in best.order]
        if self.params.hold_later_batches:
            ordered = ordered[: best.sizes[0]]
        return Decision(
            admit=(*ordered, *(r.request_id for r in tail)),
            hold_unlisted=self.params.hold_later_batches,
            reason=f"G={best.g:.4f} met={best.met}/{len(head)} batches={len(best.sizes)}",
        )
