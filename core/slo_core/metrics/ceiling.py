"""An offline upper bound on a trace's goodput that no online schedule can exceed.

Relaxation (every step only loosens the real problem, so the optimum of the relaxation bounds every
schedule, online or offline, on the simulated engines):

* job j either earns its instant-service gain V_j (the ratios' denominator) or a fraction x_j of it,
  0 ≤ x_j ≤ 1 (fractional);
* earning it needs W_j engine-seconds of work before its due time d_j (for a latency request, the
  due time of its last token; deadline and compound jobs, their deadline), where W_j is a lower
  bound on the time its tokens take on the fastest replica. A step of the performance model costs
  t_c + max(floor, a·tokens) + b·Σ chunk·context + d·Σ KV tokens read, so for a call with input p
  and output o (compound: summed over its calls):
  a·(p + o)                 every token passes the linear layers once;
  b·p²/2                    a prompt prefilled in chunks attends to at least p²/2 token pairs;
  d·kv, kv = o·p + o(o−1)/2 each decode step reads the call's whole context;
  t_c·(o/(2·S) + kv/(2·K))  the steps' fixed cost: there are at least max(Σo/S, Σkv/K) steps (a step
                            decodes at most S = max_num_seqs calls and holds at most K KV tokens),
                            and the mean of two lower bounds is one;
* M replicas offer at most M·t engine-seconds by time t (release times, KV limits, the chunk
  budget and attention costs are ignored).

    maximize Σ_j V_j·x_j   s.t.   Σ_{j: d_j ≤ t} W_j·x_j ≤ M·t  for every due time t,  0 ≤ x ≤ 1

The constraints are nested (a laminar family), so the feasible set of y_j = W_j·x_j is a polymatroid
and filling jobs greedily by V_j / W_j, each as far as the tightest later capacity allows, is optimal.

Release times: split the jobs by arrival into n equal windows; jobs of window k cannot start before
its start r_k, so each group alone is bounded by the same relaxation with capacity M·(t − r_k). The
groups share the engines, so the sum of the group bounds is still an upper bound (each group gets
all the capacity); it is tighter when arrivals, not total work, are what limits (a late burst cannot
use the idle time before it). The bound reported is the least over n ∈ {1, 2, 4, 8, 16, 32}.
Defined for the hard-deadline functions (token, request, tdg); Tempo's gain decays but never drops
to zero, so its bound would be the instant gain itself (reported as None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slo_core.gain import GainParams
from slo_core.perf.model import PerfProfile
from slo_core.slo import RequestKind
from slo_core.workloads.jobs import Job

BOUNDED_GOODPUTS = ("token", "request", "tdg")


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The bound (goodput units) and the instant-service gain of the same jobs (its denominator)."""

    bound: float
    ideal: float

    @property
    def ratio(self) -> float:
        return self.bound / self.ideal if self.ideal > 0 else 1.0


def _calls(job: Job) -> list[tuple[int, int]]:
    if job.stages:
        return [(p, o) for stage in job.stages for p, o in stage]
    return [(job.prompt_tokens, job.output_tokens)]


def job_value(job: Job, goodput: str, params: GainParams) -> float:
    """V_j: the job's gain under instant service (what the goodput ratios divide by)."""
    w = job.slo.priority_weight
    calls = _calls(job)
    p_in = sum(p for p, _ in calls)
    out = sum(o for _, o in calls)
    if out <= 0:
        return 0.0
    if goodput == "request":
        return w
    if goodput == "token":
        return w * (out if job.slo.kind is RequestKind.LATENCY else p_in + out)
    if goodput == "tdg":
        return w * (params.first_token_weight + params.decode_token_weight * (out - 1))
    raise ValueError(f"no offline bound for goodput {goodput!r}; bounded: {', '.join(BOUNDED_GOODPUTS)}")


def job_due_s(job: Job) -> float:
    """d_j: latest time at which any of the job's gain can still be earned."""
    return job.last_useful_s()


def job_work_s(job: Job, profiles: Sequence[PerfProfile], max_num_seqs: int) -> float:
    """W_j: a lower bound on the engine-seconds the job's tokens take (fastest profile)."""
    calls = _calls(job)
    tokens = sum(p + o for p, o in calls)
    out = sum(o for _, o in calls)
    sq = sum(p * p / 2.0 for p, _ in calls)
    kv = sum(o * p + o * (o - 1) / 2.0 for p, o in calls)
    return min(
        (
            prof.a_ms_per_token * tokens
            + prof.b_ms_per_token_ctx * sq
            + prof.d_ms_per_kv_token * kv
            + prof.t_c_ms * (out / (2.0 * max(1, max_num_seqs)) + kv / (2.0 * max(1, prof.kv_cache_tokens)))
        )
        / 1000.0
        for prof in profiles
    )


def offline_bound(
    jobs: Sequence[Job],
    goodput: str,
    *,
    profiles: Sequence[PerfProfile],
    replicas: int,
    max_num_seqs: int,
    params: GainParams | None = None,
) -> Ceiling | None:
    """The relaxation's optimum for ``jobs`` on ``replicas`` engines; None for unbounded functions."""
    if goodput not in BOUNDED_GOODPUTS:
        return None
    gp = params or GainParams()
    if not jobs:
        return Ceiling(0.0, 0.0)
    value = np.array([job_value(j, goodput, gp) for j in jobs])
    work = np.maximum(np.array([job_work_s(j, profiles, max_num_seqs) for j in jobs]), 1e-12)
    due = np.array([job_due_s(j) for j in jobs])
    arrival = np.array([j.arrival_s for j in jobs])
    lo, hi = float(arrival.min()), float(arrival.max())
    best = np.inf
    for n in (1, 2, 4, 8, 16, 32):
        edges = np.linspace(lo, hi, n + 1) if hi > lo else np.array([lo, lo])
        window = np.clip(np.searchsorted(edges, arrival, side="right") - 1, 0, len(edges) - 2)
        total = 0.0
        for k in np.unique(window):
            rows = np.flatnonzero(window == k)
            start = float(edges[k]) if n > 1 else 0.0
            total += _nested_knapsack(value[rows], work[rows], due[rows], start, replicas)
        best = min(best, total)
    return Ceiling(bound=float(best), ideal=float(value.sum()))


def _nested_knapsack(
    value: np.ndarray, work: np.ndarray, due: np.ndarray, start: float, replicas: int
) -> float:
    """max Σ v·x s.t. Σ_{due ≤ t} w·x ≤ M·(t − start) at every due time t, 0 ≤ x ≤ 1 (greedy)."""
    by_due = np.argsort(due, kind="stable")
    pos = np.empty(len(due), dtype=np.int64)
    pos[by_due] = np.arange(len(due))
    # slack[k]: capacity left at the k-th due time after what jobs due by then already use.
    slack = replicas * np.maximum(due[by_due] - start, 0.0)
    total = 0.0
    for j in np.argsort(-value / work, kind="stable"):
        if value[j] <= 0:
            continue
        k = pos[j]
        room = float(slack[k:].min())
        if room <= 0:
            continue
        take = min(work[j], room)
        slack[k:] -= take
        total += value[j] * take / work[j]
    return total
