"""The engine view the engine-side scheduler publishes to its sidecar (engine mode), built per step.

In engine mode the router streams straight from the engine, so the sidecar no longer sees tokens: the
scheduler (vLLM plugin, engine-sim) snapshots its requests (phase, token counts, SLO tags) at most once
per report interval, and the analyzer client's thread turns the newest snapshot into one
``Analyzer.Report`` call, whose answer carries the bounds the policy schedules by. A step only stores a
tuple of plain rows (no proto, no I/O); everything else happens on the client's thread.

A request leaving the engine is reported with its SLO outcome, judged by core's rule
(:class:`slo_core.gain.SLOWatch`) from its tags, arrival and the times its output count grew: the
engine keeps one :func:`watch` per request, feeds it after each step that made tokens for it, and
:func:`judge` turns it and the finish reason into the row's outcome.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from slo_core.gain import SLOWatch
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags

BEST_EFFORT = SLOTargets(RequestKind.BEST_EFFORT)
# a finished request's outcome (proto SloOutcome): "" none (aborted), met, missed, rejected (by the policy)
MET, MISSED, REJECTED = "met", "missed", "rejected"


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One live request as the engine sees it."""

    key: str
    phase: str  # waiting | prefill | decode
    prompt_tokens: int
    generated_tokens: int
    max_tokens: int
    arrival_unix_s: float
    tags: EngineTags | None
    first_token_unix_s: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The engine at one step: load, KV use and its live requests."""

    snapshot_unix_s: float
    step: int
    waiting: int
    running: int
    kv_usage: float
    kv_cache_tokens: int
    requests: tuple[RequestRow, ...]
    policy: str = ""
    degraded_reason: str = ""
    max_model_len: int = 0
    models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Finished:
    """A request that left the engine (stop, length or abort): its output length, SLO outcome, prompt."""

    key: str
    generated_tokens: int
    finish_reason: str
    tier: str = ""
    outcome: str = ""  # "" (no outcome: aborted) | met | missed | rejected
    prompt_tokens: int = 0


def watch(tags: EngineTags | None, arrival_unix_s: float) -> SLOWatch:
    """A request's SLO watch: its tags' targets and absolute deadline (untagged: best effort)."""
    if tags is None:
        return SLOWatch(BEST_EFFORT, arrival_unix_s)
    return SLOWatch(tags.targets, arrival_unix_s, tags.deadline_at_s)


def finish_reason(request: Any) -> str:
    """Why a vLLM request left the engine: "stop", "length", "abort", ... (``FinishReason.STOP`` is 0,
    a false value: it must not read as no reason)."""
    reason = request.get_finished_reason()
    return "abort" if reason is None else str(reason)


def judge(w: SLOWatch | None, finish_reason: str, *, rejected: bool = False) -> str:
    """The outcome of a request that left the engine: rejected by the policy, none when aborted (the
    client left, as the proxy sidecar counts it), else met or missed by core's rule."""
    if rejected:
        return REJECTED
    if w is None or finish_reason not in ("stop", "length"):
        return ""
    return MET if w.met(True) else MISSED


class Throttle:
    """True at most once per ``interval_s`` (a step builds a snapshot only when one is due)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next = float("-inf")

    def due(self, now_s: float) -> bool:
        if now_s < self._next:
            return False
        self._next = now_s + self.interval_s
        return True


def _request(pb: Any, row: RequestRow) -> Any:
    msg = pb.EngineRequest(
        request_key=row.key,
        phase=row.phase,
        prompt_tokens=row.prompt_tokens,
        generated_tokens=row.generated_tokens,
        max_tokens=row.max_tokens,
        arrival_unix_s=row.arrival_unix_s,
        first_token_unix_s=row.first_token_unix_s,
    )
    tags = row.tags
    if tags is not None:
        t = tags.targets
        msg.kind = t.kind.value
        msg.tier = tags.tier or ""
        msg.priority_weight = t.priority_weight
        msg.ttft_s = t.ttft_s or 0.0
        msg.tbt_s = t.tbt_s or 0.0
        msg.deadline_s = t.deadline_s or 0.0
        msg.deadline_unix_s = tags.deadline_at_s or 0.0
        msg.tenant = tags.tenant
        msg.program_id = tags.program_id or ""
        msg.stages = tags.stages or 0
        msg.program_start_unix_s = tags.program_start_at_s or 0.0
        if tags.stage is not None:  # stage 0 is a stage: only a call without one leaves it unset
            msg.stage = tags.stage
        msg.output_bound = tags.output_bound or 0
    return msg


def to_report(snapshot: EngineSnapshot, finished: Iterable[Finished]) -> Any:
    """The ``EngineReport`` message of a snapshot (called on the analyzer client's thread)."""
    from slo_proto import slofleet_pb2 as pb

    outcomes = {
        "": pb.SLO_OUTCOME_UNSPECIFIED,
        MET: pb.SLO_OUTCOME_MET,
        MISSED: pb.SLO_OUTCOME_MISSED,
        REJECTED: pb.SLO_OUTCOME_REJECTED,
    }
    return pb.EngineReport(
        snapshot_unix_s=snapshot.snapshot_unix_s,
        step=snapshot.step,
        waiting=snapshot.waiting,
        running=snapshot.running,
        kv_usage=snapshot.kv_usage,
        kv_cache_tokens=snapshot.kv_cache_tokens,
        requests=[_request(pb, r) for r in snapshot.requests],
        finished=[
            pb.FinishedRequest(
                request_key=f.key,
                generated_tokens=f.generated_tokens,
                finish_reason=f.finish_reason,
                tier=f.tier,
                outcome=outcomes[f.outcome],
                prompt_tokens=f.prompt_tokens,
            )
            for f in finished
        ],
        policy=snapshot.policy,
        degraded_reason=snapshot.degraded_reason,
        max_model_len=snapshot.max_model_len,
        models=list(snapshot.models),
    )
