"""PROSERVE GoRouting (§4.3, Algorithm 2), PD co-located form: gain-oriented, capability-aware dispatch.

For each replica p, with Q_p its prefill queue (waiting and running requests that still have prompt to
compute), n_d its decoding requests and b_d their mean per-token decode time (T̃_d of §4.1):

    t_budget     = max(η, min(min_{r∈Q_p, remain_r>0} remain_r, min TPOT_SLO))      (§4.3, co-located)
    EXEC(p, Q)   = t_budget · Σ_{r∈Q} exec_r / (t_budget − t_c − n_d·b_d) − (now − ts_p)   (φ_a + decode term,
                   minus the age of p's snapshot)
    GAIN(p, Q)   = Σ_{r∈Q} w_p·w_{p(r)} · 𝟙[EXEC(p, Q) ≤ remain_r]        (conservative: all finish last)
    Δ_p          = GAIN(p, Q_p ∪ {req}) − GAIN(p, Q_p)

Candidates ``C = {p | Δ_p ≥ α·Δ_max}``. If Δ_max > 0: with ``L = {p ∈ C | EXEC(p) < μ·TTFT}`` and
``H = {p ∈ C | EXEC(p, req) > λ·TTFT}`` pick argmin EXEC over L if L ≠ ∅, else the *busiest* of C∖H
(it still meets the SLO and keeps lighter replicas free for later long or high-priority requests), else
the least-loaded of C. If no replica gains (Δ_max ≤ 0) fall back to the least-loaded replica (or a random
one, as in the paper). TTFT is the request's remaining time to its first-token deadline.

**Queue order (a deviation from the paper, ``queue_order``).** The paper's GAIN is conservative: every
request in Q_p ∪ {req} finishes when the whole queue does, as if the engine served it in arrival order.
That holds for FCFS engines; an SLO-aware engine (EDF, GMAX, Tempo, SLOs-Serve, SlideBatching) serves
the prefill whose first token is due soonest first, so a chat request due in 4 s does not wait behind
3 s of deep-research prompts due in minutes. Measured on ``slofleet demo``'s workload (GMAX engine, one
replica, 40 s at 12 req/s): the conservative form demoted 25 of 162 chat requests to best effort (chat
attainment 84/88 %), while the live router, which then estimated with the GPU's full-speed profile,
served them all in time. With ``queue_order="engine"`` (the default) the queue is ordered by
first-token due time on replicas whose engine policy serves that way (:data:`DUE_ORDER_ENGINES`), each
request finishing when the work up to it does, and kept in arrival order on the others; ``"arrival"``
is the paper's form on every replica.

**Late requests (a deviation).** A queued request whose first token is already past due has no time
left to budget for (it gains nothing either way), so it does not set ``t_budget``: counted, one such
request pinned the budget at η, below one step of a few hundred decodes, and the replica looked
infinitely slow to every arrival (on the demo's workload this demoted 150 deep-research calls). The
same holds for a request due sooner than one iteration of the replica's decodes plus its own prefill
(``remain_r ≤ t_c + n_d·b_d + exec_r``): it cannot get its first token in time whatever is routed
there. Counted, one such request (due within the next ~25 ms while ~180 requests decode) left
``t_budget − t_c − n_d·b_d`` negative at that moment, and every deep-research call routed then was
demoted; which moments those were depended on how stale the router's snapshot was, so the live demo
demoted 10–18 calls where the simulator demoted 4, none of them the same (``slofleet demo``,
2026-11-29).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from slo_core.objective import Objective
from slo_core.policies.base import BaseRouterPolicy, ReplicaView, RequestView, RouteDecision
from slo_core.policies.seed_estimates import (
    decode_core_s,
    first_token_due_s,
    overhead_s,
    prefill_core_s,
    profile_or_fallback,
    remaining_prompt_tokens,
)
from slo_core.slo import RequestKind

DUE_ORDER_ENGINES = frozenset(
    {
        "edf",
        "gmax",
        "gmax-oracle",
        "gmax-no-analyzer",
        "gmax-no-gmax",
        "slide-batching",
        "slos-serve",
        "tempo",
    }
)
"""Engine policies that serve queued prefills roughly earliest first-token due time first (the SLO-aware
ones); every other engine policy (FCFS, Sarathi, priority or length orders) counts as arrival order."""


class GoRoutingParams(BaseModel):
    """Parameters of GoRouting (PROSERVE §4.3)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(0.9, gt=0, le=1, description="α: candidates gain at least α·Δ_max (unitless)")
    mu: float = Field(0.1, ge=0, description="μ: a replica is light if EXEC < μ·TTFT (fraction of TTFT)")
    lam: float = Field(
        0.8, gt=0, description="λ: a replica is heavy if EXEC with req > λ·TTFT (fraction of TTFT)"
    )
    eta_s: float = Field(0.025, gt=0, description="η: lower bound of the estimated latency budget (seconds)")
    first_token_weight: float = Field(1.0, gt=0, description="TDG w_p: gain of a first token (unitless)")
    fallback: Literal["least-loaded", "random"] = Field(
        "least-loaded", description="where a request goes when no replica gains from it"
    )
    queue_order: Literal["engine", "arrival"] = Field(
        "engine",
        description="engine: Q_p in the order the replica's engine policy serves it (first-token due time "
        "for the SLO-aware ones, arrival otherwise); arrival: the paper's (all finish with the whole queue)",
    )


@dataclass(frozen=True, slots=True)
class ReplicaEstimate:
    """GoRouting's view of one replica for one request."""

    replica_id: str
    exec_s: float
    exec_with_req_s: float
    delta: float


class GoRouting(BaseRouterPolicy):
    """PROSERVE's global scheduler for PD co-located pools (see the module docstring)."""

    name = "go-routing"
    gain_scored = True  # scores are Δ_p: Δ_max ≤ 0 means no replica serves the request in time

    @classmethod
    def objective_params(cls, objective: Objective) -> dict[str, object]:
        """TDG's first-token weight from spec.goodput (1 under the other objectives)."""
        if objective.goodput == "tdg":
            return {"first_token_weight": max(objective.gain.first_token_weight, 1e-6)}
        return {"first_token_weight": 1.0}

    def __init__(self, params: GoRoutingParams | None = None, **kwargs: object) -> None:
        self.params = params if params is not None else GoRoutingParams.model_validate(kwargs)

    def estimate(self, request: RequestView, replica: ReplicaView, now_s: float) -> ReplicaEstimate:
        """EXEC and Δ of sending ``request`` to ``replica`` (Algorithm 2 lines 2–6)."""
        prof = profile_or_fallback(replica.profile)
        t_c = overhead_s(prof)
        prefill = [r for r in (*replica.waiting, *replica.running) if remaining_prompt_tokens(r) > 0]
        decoding = [r for r in replica.running if remaining_prompt_tokens(r) == 0]
        n_d = len(decoding)
        b_d = decode_core_s(prof, sum(r.kv_tokens for r in decoding) / n_d) if n_d else 0.0
        tpots = [r.slo.tbt_s for r in (*decoding, request) if r.kind is RequestKind.LATENCY and r.slo.tbt_s]
        queue = [*prefill, request]
        remains = [first_token_due_s(r) - now_s for r in queue]
        execs = [prefill_core_s(prof, max(1, remaining_prompt_tokens(r)), r.computed_tokens) for r in queue]
        weights = [self.params.first_token_weight * r.priority_weight for r in queue]
        step_s = t_c + n_d * b_d  # one iteration of the replica's decodes, before any prefill
        # a queued request that cannot get its first token in time even if its prefill ran alone in the
        # next iteration is late: it does not set the budget (module docstring, "Late requests")
        live = (x for x, e in zip(remains, execs, strict=True) if x > step_s + e)
        t_budget = max(self.params.eta_s, min([*live, *tpots], default=0.0))
        capacity = t_budget - step_s
        age = max(0.0, now_s - replica.snapshot_s)
        by_due = self.params.queue_order == "engine" and replica.engine_policy in DUE_ORDER_ENGINES

        def exec_of(work: float) -> float:
            if work == 0:
                return 0.0
            if capacity <= 0:
                return float("inf")
            return max(0.0, t_budget * work / capacity - age)

        def finish_times(n: int) -> list[float]:
            """When each of the first ``n`` requests of ``queue`` gets its first token: all when the whole
            work is done (arrival order), or each when the work due before it and its own is done."""
            if not by_due:
                return [exec_of(sum(execs[:n]))] * n
            finish = [0.0] * n
            done = 0.0
            for i in sorted(range(n), key=remains.__getitem__):
                done += execs[i]
                finish[i] = exec_of(done)
            return finish

        def gain_of(finish: list[float]) -> float:
            return sum(w for w, rem, f in zip(weights, remains, finish, strict=False) if f <= rem)

        before, after = finish_times(len(prefill)), finish_times(len(queue))
        delta = gain_of(after) - gain_of(before)
        return ReplicaEstimate(replica.replica_id, max(before, default=0.0), after[-1], delta)

    def route(
        self,
        request: RequestView,
        replicas: Sequence[ReplicaView],
        now_s: float,
        rng: random.Random,
    ) -> RouteDecision:
        if not replicas:
            return RouteDecision(None, reason="no replica offered", retry_after_s=1.0)
        est = [self.estimate(request, p, now_s) for p in replicas]
        scores = tuple((e.replica_id, e.delta) for e in est)
        d_max = max(e.delta for e in est)
        if d_max <= 0:
            if self.params.fallback == "random":
                pick = est[rng.randrange(len(est))]
            else:
                pick = min(est, key=lambda e: e.exec_with_req_s)
            return RouteDecision(pick.replica_id, reason="fallback: no replica gains", scores=scores)
        ttft = max(1e-6, first_token_due_s(request) - now_s)
        cands = [e for e in est if e.delta >= self.params.alpha * d_max]
        light = [e for e in cands if e.exec_s < self.params.mu * ttft]
        not_heavy = [e for e in cands if e.exec_with_req_s <= self.params.lam * ttft]
        if light:
            pick, why = min(light, key=lambda e: e.exec_s), "lightest of the light candidates"
        elif not_heavy:
            pick, why = max(not_heavy, key=lambda e: e.exec_s), "busiest candidate that still meets the SLO"
        else:
            pick, why = min(cands, key=lambda e: e.exec_s), "all candidates heavy: least loaded"
        return RouteDecision(pick.replica_id, reason=why, scores=scores)
