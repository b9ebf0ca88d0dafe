"""SLOs-Serve's engine scheduler: soft admission control, dynamic batch size, best-effort tier (§3, §4.1).

On each invocation (every ``frame_steps`` steps and on arrivals/finishes, Algorithm 1) the multi-SLO DP
of :mod:`slo_core.policies.slos_serve_dp` decides which *new* requests to admit given the forced ones
(running and previously admitted): admitted requests are guaranteed their SLO by the plan; declined
ones drop to the best-effort tier (§4.1), which is served FCFS from leftover capacity and is preempted
first (recompute, keeping generated tokens) whenever admitted requests need slots or KV memory — or they
are rejected when the tier is off. Prefill deadlines: TTFT for latency requests; for deadline requests
the remaining slack is split, ``deadline_prefill_share`` for the prefill and the rest for a uniform decode
pace TPOT = rest / remaining tokens. Admitted waiting requests are admitted earliest-prefill-deadline
first; running decodes are ordered by their next token's due time (EDF, Algorithm 2).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from slo_core.objective import Objective
from slo_core.perf.model import PerfProfile
from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView, new_decision
from slo_core.policies.seed_estimates import (
    expected_output_tokens,
    first_token_due_s,
    next_token_due_s,
    profile_or_fallback,
    remaining_output_tokens,
    remaining_prompt_tokens,
)
from slo_core.policies.slos_serve_dp import Capacity, DPItem, batch_tokens, dp_item, plan_admission
from slo_core.slo import RequestKind


class SLOsServeParams(BaseModel):
    """Parameters of the SLOs-Serve engine scheduler."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    best_effort_tier: bool = Field(
        True, description="declined requests go to the best-effort tier (else rejected)"
    )
    value: Literal["request", "tokens"] = Field(
        "request", description="DP value of attaining a request: its priority weight, or weight × tokens"
    )
    max_new_per_call: int = Field(16, ge=1, description="new requests one DP call considers (requests)")
    memory_units: int = Field(256, ge=8, description="KV memory discretization of the DP (units)")
    invoke_every_steps: int = Field(
        10, ge=1, description="scheduler invocation period besides events (steps)"
    )
    idle_batch_s: float = Field(0.1, gt=0, description="batch length assumed when nothing decodes (seconds)")
    deadline_prefill_share: float = Field(
        0.5, gt=0, lt=1, description="share of a deadline request's slack given to its prefill (fraction)"
    )


@dataclass(frozen=True, slots=True)
class DPView:
    """A replica's requests turned into DP items: forced prefills, running decoders, and the capacity."""

    forced: tuple[DPItem, ...]
    capacity: Capacity
    unit_tokens: int


def min_iteration_s(profile: PerfProfile) -> float:
    return (profile.t_c_ms + profile.floor_ms) / 1000.0


def to_item(
    r: RequestView, now_s: float, profile: PerfProfile, p: SLOsServeParams, unit: int, *, forced: bool
) -> DPItem:
    """One request's prefill deadline, prompt left, memory units, decode TPOT and value."""
    out = expected_output_tokens(r)
    mem = math.ceil((r.prompt_tokens + out) / unit)
    value = r.priority_weight * (1.0 if p.value == "request" else float(r.prompt_tokens + out))
    if r.kind is RequestKind.LATENCY:
        pddl, tpot = first_token_due_s(r), r.slo.tbt_s
    else:
        deadline = next_token_due_s(r)
        slack = deadline - now_s
        rem = remaining_output_tokens(r)
        tpot = max(min_iteration_s(profile), (1.0 - p.deadline_prefill_share) * slack / rem)
        pddl = deadline - tpot * rem
    return dp_item(
        r.request_id,
        pddl,
        remaining_prompt_tokens(r),
        mem,
        tpot,
        value,
        r.prompt_tokens + r.generated_tokens,
        forced,
    )


def dp_view(
    forced_reqs: Sequence[RequestView],
    now_s: float,
    profile: PerfProfile,
    p: SLOsServeParams,
    *,
    kv_tokens_total: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> DPView:
    """Split forced requests into prefills (DP events) and decoders (the base decode load)."""
    unit = max(1, math.ceil(kv_tokens_total / p.memory_units))
    items, decoders, dec_mem = [], [], 0
    for r in forced_reqs:
        it = to_item(r, now_s, profile, p, unit, forced=True)
        if it.prefill_tokens > 0:  # remaining_prompt_tokens(r)
            items.append(it)
        else:
            assert it.tpot_s is not None
            decoders.append((it.tpot_s, it.decode_kv_tokens))
            dec_mem += it.memory_units
    cap = Capacity(
        profile=profile,
        max_batch_tokens=max_num_batched_tokens,
        memory_units=p.memory_units - dec_mem,
        max_seqs=max_num_seqs,
        base_decoders=tuple(decoders),
        idle_batch_s=p.idle_batch_s,
    )
    return DPView(tuple(items), cap, unit)


_LATENCY = RequestKind.LATENCY
_BEST_EFFORT = RequestKind.BEST_EFFORT


def _next_due_s(r: RequestView) -> float:
    """next_token_due_s, inlined with SLOTargets.token_deadline_s (the sort keys below run for every
    admitted request per call; the same float operations in the same order)."""
    slo = r.slo
    if slo.kind is _LATENCY:
        return r.arrival_s + (slo.ttft_s + r.generated_tokens * slo.tbt_s)  # type: ignore[operator]
    if r.deadline_at_s is not None:
        return r.deadline_at_s
    return r.arrival_s + slo.effective_deadline_s


def _waiting_key(r: RequestView) -> tuple[float, float]:
    """Admitted waiting requests: earliest prefill (first-token) deadline first."""
    slo = r.slo
    if slo.kind is _LATENCY:  # first_token_due_s
        return (r.arrival_s + (slo.ttft_s + 0 * slo.tbt_s), r.arrival_s)  # type: ignore[operator]
    return (_next_due_s(r), r.arrival_s)


def _running_key(r: RequestView) -> tuple[bool, float]:
    """Admitted running requests: decodes first, by their next token's due time (EDF)."""
    return (r.prompt_tokens + r.generated_tokens - r.computed_tokens > 0, _next_due_s(r))


class SLOsServe(BaseEnginePolicy):
    """SLOs-Serve's scheduler with soft admission control (see the module docstring)."""

    name = "slos-serve"
    reschedule_on_events = True
    # a quiet decision (nothing waits, every running request decodes) admits, preempts (only for
    # admitted waiting requests) and rejects nobody, and sets no token budget; its hold_unlisted is
    # every decision's: engines leave it out
    skip_quiet_decisions = True

    @classmethod
    def objective_params(cls, objective: Objective) -> dict[str, object]:
        """The DP's value of attaining a request: its weight (request goodput) or weight × tokens."""
        return {"value": "request" if objective.goodput == "request" else "tokens"}

    def __init__(self, params: SLOsServeParams | None = None, **kwargs: object) -> None:
        self.params = params if params is not None else SLOsServeParams.model_validate(kwargs)
        self.frame_steps = self.params.invoke_every_steps
        self.admitted: set[str] = set()
        self.best_effort: set[str] = set()
        self.last_batch_tokens = 0

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        p, now = self.params, engine.now_s
        prof = profile_or_fallback(engine.profile)
        present = {r.request_id for r in (*waiting, *running)}
        self.admitted &= present
        self.best_effort &= present
        for r in running:  # running SLO requests are admitted, best-effort ones join their tier
            if r.slo.kind is _BEST_EFFORT:
                self.best_effort.add(r.request_id)
            elif r.request_id not in self.best_effort:
                self.admitted.add(r.request_id)
        for r in waiting:
            if r.slo.kind is _BEST_EFFORT:
                self.best_effort.add(r.request_id)
        forced = [r for r in (*running, *waiting) if r.request_id in self.admitted]
        new: list[RequestView] = []
        if waiting:  # most calls find nothing waiting
            new = sorted(
                (
                    r
                    for r in waiting
                    if r.request_id not in self.admitted and r.request_id not in self.best_effort
                ),
                key=lambda r: (r.arrival_s, r.request_id),
            )[: p.max_new_per_call]
        # the DP view (a DPItem per forced request) is needed only to admit new requests or when a
        # forced request decodes with no prompt left (the batch size of Algorithm 2); most calls
        # have neither, and dp_view is pure: skipping it changes nothing
        view = None
        # remaining_prompt_tokens(r) == 0, inlined
        if new or any(r.prompt_tokens + r.generated_tokens - r.computed_tokens <= 0 for r in forced):
            view = dp_view(
                forced,
                now,
                prof,
                p,
                kv_tokens_total=engine.kv_blocks_total * engine.block_size,
                max_num_seqs=engine.max_num_seqs,
                max_num_batched_tokens=engine.max_num_batched_tokens,
            )
        reject: tuple[str, ...] = ()
        if new:
            assert view is not None
            cands = [to_item(r, now, prof, p, view.unit_tokens, forced=False) for r in new]
            plan = plan_admission(view.forced, cands, now, view.capacity)
            self.admitted.update(plan.admitted)
            if p.best_effort_tier:
                self.best_effort.update(plan.declined)
            else:
                reject = plan.declined
        if view is not None and view.capacity.base_decoders:
            t0 = min(t for t, _ in view.capacity.base_decoders)
            self.last_batch_tokens = batch_tokens(
                view.capacity, t0, sum(k for _, k in view.capacity.base_decoders)
            )
        return self._orders(waiting, running, engine, set(reject), reject)

    def _orders(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rejected: set[str],
        reject: tuple[str, ...],
    ) -> Decision:
        slo_wait: list[RequestView] = []
        be_wait: list[RequestView] = []
        if waiting:
            slo_wait = sorted((r for r in waiting if r.request_id in self.admitted), key=_waiting_key)
            be_wait = sorted(
                (r for r in waiting if r.request_id in self.best_effort and r.request_id not in rejected),
                key=lambda r: (r.arrival_s, r.request_id),
            )
        slo_run = sorted(
            (r for r in running if r.request_id in self.admitted),
            key=_running_key,
        )
        be_run = [r for r in running if r.request_id not in self.admitted]
        preempt = self._preempt_best_effort(slo_wait, be_run, len(running), engine)
        keep_be = [r.request_id for r in be_run if r.request_id not in preempt]
        return new_decision(
            admit=tuple(r.request_id for r in (*slo_wait, *be_wait)),
            preempt=tuple(preempt),
            running_order=(*(r.request_id for r in slo_run), *keep_be),
            reject=reject,
            hold_unlisted=True,
            reason=f"admitted={len(self.admitted)} best-effort={len(self.best_effort)}",
        )

    @staticmethod
    def _preempt_best_effort(
        slo_wait: Sequence[RequestView], be_run: Sequence[RequestView], n_running: int, engine: EngineView
    ) -> list[str]:
        """Free slots and KV for admitted requests by preempting best-effort ones, newest first."""
        if not slo_wait or not be_run:
            return []
        slots_short = n_running + len(slo_wait) - engine.max_num_seqs
        kv_short = sum(r.prompt_tokens + r.generated_tokens for r in slo_wait) - engine.kv_tokens_free
        out: list[str] = []
        for r in sorted(be_run, key=lambda r: -r.arrival_s):
            if slots_short <= 0 and kv_short <= 0:
                break
            out.append(r.request_id)
            slots_short -= 1
            kv_short -= r.kv_tokens
        return out
