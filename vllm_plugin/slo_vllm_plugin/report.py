"""The engine view the engine-side scheduler publishes to its sidecar (engine mode), built per step.

In engine mode the router streams straight from the engine, so the sidecar no longer sees tokens: the
scheduler (vLLM plugin, engine-sim) snapshots its requests (phase, token counts, SLO tags) at most once
per report interval, and the analyzer client's thread turns the newest snapshot into one
``Analyzer.Report`` call, whose answer carries the bounds the policy schedules by. A step only stores a
tuple of plain rows (no proto, no I/O); everything else happens on the client's thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from slo_core.wire.tags import EngineTags


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
    """A request that left the engine (stop, length or abort) with its output length."""

    key: str
    generated_tokens: int
    finish_reason: str
    tier: str = ""


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
        msg.stage = tags.stage or 0
        msg.output_bound = tags.output_bound or 0
    return msg


def to_report(snapshot: EngineSnapshot, finished: Iterable[Finished]) -> Any:
    """The ``EngineReport`` message of a snapshot (called on the analyzer client's thread)."""
    from slo_proto import slofleet_pb2 as pb

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
            )
            for f in finished
        ],
        policy=snapshot.policy,
        degraded_reason=snapshot.degraded_reason,
        max_model_len=snapshot.max_model_len,
        models=list(snapshot.models),
    )
