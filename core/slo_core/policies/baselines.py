"""Baseline engine policies of the evaluations (JITServe §6.1, PROSERVE §5.1), behind the policy Protocol.

``fcfs``             vLLM FCFS, prefill-first: admit in arrival order before scheduling running
                     requests (vLLM v0's order; PROSERVE §5.1 "vLLM-FCFS prioritizes prefill").
``sarathi``          Sarathi-Serve: decode-first (running requests first, decodes before prefill
                     chunks), FCFS admission, chunked prefill under a fixed token budget.
``edf``              earliest deadline first: admit by the due time of the next token (latency
                     requests: arrival + TTFT + i·TBT; others: their (sub-)deadline).
``sjf-oracle``       shortest job first with true lengths: admit by remaining output tokens.
``ltr``              learning to rank: admit by predicted length (slo_core.policies.ltr).
``autellix``         program-level least attained service (slo_core.policies.autellix).
``strict-priority``  Sarathi-Priority (PROSERVE §5.1): decode-first under Sarathi's fixed budget;
                     prefills and admission by priority weight (higher first), then arrival.

The ordering baselines are non-preemptive (only KV exhaustion preempts); apart from Sarathi's and
strict priority's decode-first order they keep running requests in the engine's order. Their keys
do not change while a request waits, so they decide on events only (arrivals, finishes,
preemptions): ``frame_steps`` is :data:`EVENTS_ONLY`. Sarathi's fixed budget is 512 tokens by default
(its strict-TBT setting; PROSERVE §5.1 uses a budget profiled from the TBT target).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from slo_core.policies.autellix import AutellixPLAS, AutellixPLASParams
from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView, request_id_of
from slo_core.policies.ltr import LTR, LTRParams, NoisyOraclePredictor
from slo_core.slo import RequestKind

__all__ = [
    "EDF",
    "EVENTS_ONLY",
    "FCFS",
    "LTR",
    "AutellixPLAS",
    "AutellixPLASParams",
    "LTRParams",
    "NoisyOraclePredictor",
    "SJFOracle",
    "Sarathi",
    "StrictPriority",
    "next_due_s",
]

# A frame that never ends: the policy is asked again only after an event.
EVENTS_ONLY = 1 << 30


def next_due_s(r: RequestView) -> float:
    """When ``r``'s next output token is due (absolute seconds): EDF's key."""
    if r.slo.kind is RequestKind.LATENCY:
        return r.token_due_at_s(r.generated_tokens)
    if r.deadline_at_s is not None:
        return r.deadline_at_s
    return r.arrival_s + r.slo.effective_deadline_s


class _NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FCFSParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prefill_first: bool = Field(
        True,
        description="admit new prefills before running decodes (vLLM v0); False: vLLM v1's running-first",
    )


class FCFS(BaseEnginePolicy):
    """vLLM's FCFS: admission in queue order (preempted requests first, then by arrival)."""

    name = "fcfs"
    frame_steps = EVENTS_ONLY
    # decide() returns the queue order unchanged: an engine may skip calling it (identical result)
    fifo_fast_path = True

    def __init__(self, **params: Any) -> None:
        self.params = FCFSParams.model_validate(params)

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        return Decision(
            admit=tuple(r.request_id for r in waiting), prefill_first=self.params.prefill_first, reason="fcfs"
        )


class SarathiParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    token_budget: int = Field(
        512,
        ge=1,
        description="tokens per step (prefill chunks + decodes); Sarathi-Serve's strict-TBT setting",
    )


class Sarathi(BaseEnginePolicy):
    """Sarathi-Serve: decodes first, then ongoing prefill chunks, then new prefills, FCFS, fixed budget.

    With FCFS admission and running-first scheduling the engine's running order already has every
    decode ahead of every prefill (a prefill completes only once all requests ahead of it have
    their tokens), so the decision is a pure function of the queue order: ``fifo_fast_path``.
    """

    name = "sarathi"
    frame_steps = EVENTS_ONLY
    fifo_fast_path = True

    def __init__(self, **params: Any) -> None:
        self.params = SarathiParams.model_validate(params)

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        decodes = [r.request_id for r in running if not r.in_prefill]
        prefills = [r.request_id for r in running if r.in_prefill]
        return Decision(
            admit=tuple(r.request_id for r in waiting),
            running_order=(*decodes, *prefills),
            token_budget=self.params.token_budget,
            reason="sarathi",
        )


def _ordered_admission(waiting: Sequence[RequestView], key: Callable[[RequestView], Any]) -> tuple[str, ...]:
    """Waiting ids sorted by ``key``, ties kept in queue order (the sort is stable)."""
    return tuple(map(request_id_of, sorted(waiting, key=key)))


class EDF(BaseEnginePolicy):
    """Earliest deadline first over the waiting queue (non-preemptive, running-first)."""

    name = "edf"
    frame_steps = EVENTS_ONLY
    keyed_admission = True  # next_due_s of a waiting request does not move

    def __init__(self, **params: Any) -> None:
        self.params = _NoParams.model_validate(params)

    def admission_key(self, r: RequestView) -> float:
        return next_due_s(r)

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        return Decision(admit=_ordered_admission(waiting, next_due_s), reason="edf")


def _remaining_true_tokens(r: RequestView) -> tuple[float, ...]:
    true_len = r.true_output_tokens if r.true_output_tokens is not None else r.max_tokens
    return (float(max(0, true_len - r.generated_tokens)),)


class SJFOracle(BaseEnginePolicy):
    """Shortest job first with the true output length (an oracle no real system has)."""

    name = "sjf-oracle"
    frame_steps = EVENTS_ONLY
    keyed_admission = True  # a waiting request's remaining true length does not move

    def __init__(self, **params: Any) -> None:
        self.params = _NoParams.model_validate(params)

    def admission_key(self, r: RequestView) -> tuple[float, ...]:
        return _remaining_true_tokens(r)

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        return Decision(admit=_ordered_admission(waiting, _remaining_true_tokens), reason="sjf-oracle")


class StrictPriorityParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    token_budget: int | None = Field(
        512,
        ge=1,
        description="tokens per step, as Sarathi's (tokens); None: the engine's max_num_batched_tokens",
    )


def _priority_key(r: RequestView) -> tuple[float, ...]:
    return (-r.priority_weight, r.arrival_s)


class StrictPriority(BaseEnginePolicy):
    """Sarathi-Priority: decodes first, then prefills by priority weight (higher first), then arrival."""

    name = "strict-priority"
    frame_steps = EVENTS_ONLY
    keyed_admission = True  # a waiting request's priority and arrival do not move
    keyed_running = True  # decodes first, then prefills by the same key

    def __init__(self, **params: Any) -> None:
        self.params = StrictPriorityParams.model_validate(params)

    def admission_key(self, r: RequestView) -> tuple[float, ...]:
        return _priority_key(r)

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        decodes = tuple(r.request_id for r in running if not r.in_prefill)
        prefills = _ordered_admission([r for r in running if r.in_prefill], _priority_key)
        return Decision(
            admit=_ordered_admission(waiting, _priority_key),
            running_order=(*decodes, *prefills),
            token_budget=self.params.token_budget,
            reason="strict-priority",
        )
