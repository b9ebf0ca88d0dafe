"""A sidecar's ``PodState`` message as the routing policy's :class:`ReplicaView`.

Sidecar times are unix seconds on the pod's clock; the router works on its monotonic clock. A
snapshot is placed at ``now − age`` where ``age = wall_now − snapshot_unix_s`` (never negative), so
GoRouting can subtract the snapshot's age from its execution estimates (PROSERVE §4.3). Request
times (arrival, deadline) are shifted by the same wall→monotonic offset.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

from slo_core.perf.model import PerfProfile, sped_up
from slo_core.policies.base import ReplicaCapabilities, ReplicaView, RequestView
from slo_core.policies.seed_estimates import DEFAULT_OUTPUT_TOKENS
from slo_core.slo import RequestKind, SLOTargets, SLOTier

log = logging.getLogger(__name__)

BLOCK_SIZE_TOKENS = 16
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_BATCHED_TOKENS = 8192


@functools.lru_cache(maxsize=64)
def lookup_profile(name: str) -> PerfProfile | None:
    """The fitted performance profile a pod reports by name, or None (policies then use a fallback)."""
    if not name:
        return None
    try:
        from slo_core.perf import load_profile  # type: ignore[attr-defined,unused-ignore]

        return load_profile(name)  # type: ignore[no-any-return,unused-ignore]
    except (ImportError, ValueError, FileNotFoundError, KeyError) as exc:
        log.info("performance profile %r unavailable (%s); routing estimates use the fallback", name, exc)
        return None


MAX_STEP_TIME_CORRECTION = 1e6  # the sidecar's own limit: a larger report is malformed


@functools.lru_cache(maxsize=256)
def pod_profile(name: str, step_time_correction: float) -> PerfProfile | None:
    """The profile a pod's steps actually follow: its named profile slowed by the step-time correction
    it reports (engine-sim at ``--speedup X`` reports 1/X), the coefficients the simulator's engines run
    with. A correction that is absent (0), not finite or out of range counts as 1."""
    profile = lookup_profile(name)
    c = step_time_correction
    if profile is None or not 0 < c <= MAX_STEP_TIME_CORRECTION or c == 1.0:
        return profile
    return sped_up(profile, 1.0 / c)


def _targets(msg: Any, tiers: Mapping[str, SLOTier]) -> SLOTargets:
    """A request's SLO from its snapshot: its tier's targets, refined by the due time it reports.

    The sidecar reports a latency request's *measured* TTFT/TBT and the due time of its next token;
    before the first token that due time minus arrival is its TTFT target (client overrides included).
    """
    try:
        kind = RequestKind(msg.kind or "best-effort")
    except ValueError:
        kind = RequestKind.BEST_EFFORT
    weight = msg.priority_weight if msg.priority_weight > 0 else 1.0
    tier = tiers.get(msg.tier)
    span = (
        msg.deadline_unix_s - msg.arrival_unix_s if msg.deadline_unix_s > 0 and msg.arrival_unix_s > 0 else 0
    )
    try:
        if kind is RequestKind.LATENCY:
            ttft = span if msg.generated_tokens == 0 and span > 0 else (tier.ttft_s if tier else None)
            tbt = tier.tbt_s if tier else None
            return SLOTargets(kind, ttft_s=ttft or 1.0, tbt_s=tbt or 0.1, priority_weight=weight)
        deadline = span if span > 0 else (tier.deadline_s if tier else None)
        if kind in (RequestKind.DEADLINE, RequestKind.COMPOUND):
            return SLOTargets(kind, deadline_s=deadline or 60.0, priority_weight=weight)
        return SLOTargets(RequestKind.BEST_EFFORT, deadline_s=deadline, priority_weight=weight)
    except ValueError:  # a malformed snapshot entry must not break routing
        return SLOTargets(RequestKind.BEST_EFFORT, priority_weight=weight)


def request_view(msg: Any, offset_s: float, tiers: Mapping[str, SLOTier] | None = None) -> RequestView:
    """One ``RequestState``; ``offset_s`` maps the pod's unix seconds onto the router's clock."""
    targets = _targets(msg, tiers or {})
    generated = max(0, int(msg.generated_tokens))
    prompt = max(0, int(msg.prompt_tokens))
    bound = int(msg.output_bound) if msg.output_bound > 0 else None
    arrival = (msg.arrival_unix_s + offset_s) if msg.arrival_unix_s > 0 else offset_s
    deadline = None
    if targets.kind is not RequestKind.LATENCY and msg.deadline_unix_s > 0:
        deadline = msg.deadline_unix_s + offset_s
    computed = prompt + generated if msg.phase == "decode" else 0
    return RequestView(
        request_id=msg.request_id,
        slo=targets,
        arrival_s=arrival,
        prompt_tokens=prompt,
        max_tokens=max(bound or DEFAULT_OUTPUT_TOKENS, generated + 1),
        generated_tokens=generated,
        computed_tokens=computed,
        deadline_at_s=deadline,
        output_bound=bound,
        program_id=msg.program_id or None,
        stage=msg.stage if msg.program_id else None,
    )


def capabilities_of(msg: Any) -> ReplicaCapabilities:
    caps = msg.capabilities
    return ReplicaCapabilities(
        models=tuple(caps.models),
        max_context_tokens=int(caps.max_context_tokens) or 1 << 30,
        gpu_class=caps.gpu_class,
        lora_adapters=tuple(caps.lora_adapters),
    )


def snapshot_age_s(msg: Any, wall_now_s: float) -> float:
    """How old the snapshot is by the wall clock (never negative: a pod clock ahead counts as fresh)."""
    return max(0.0, wall_now_s - msg.snapshot_unix_s) if msg.snapshot_unix_s > 0 else 0.0


def replica_view(
    msg: Any,
    *,
    replica_id: str,
    now_s: float,
    wall_now_s: float,
    tiers: Mapping[str, SLOTier] | None = None,
) -> ReplicaView:
    """A ``PodState`` as a replica snapshot placed on the router's clock (``now_s`` ↔ ``wall_now_s``)."""
    offset = now_s - wall_now_s
    age = snapshot_age_s(msg, wall_now_s)
    waiting: list[RequestView] = []
    running: list[RequestView] = []
    for r in msg.requests:
        (waiting if r.phase == "waiting" else running).append(request_view(r, offset, tiers))
    kv_total_tokens = max(BLOCK_SIZE_TOKENS, int(msg.kv_cache_tokens) or 1 << 20)
    blocks_total = kv_total_tokens // BLOCK_SIZE_TOKENS
    usage = min(1.0, max(0.0, msg.kv_usage))
    return ReplicaView(
        replica_id=replica_id,
        snapshot_s=now_s - age,
        waiting=tuple(waiting),
        running=tuple(running),
        kv_blocks_total=blocks_total,
        kv_blocks_free=int(blocks_total * (1.0 - usage)),
        max_num_seqs=DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens=DEFAULT_MAX_BATCHED_TOKENS,
        block_size=BLOCK_SIZE_TOKENS,
        profile=pod_profile(msg.profile, float(msg.step_time_correction)),
        engine_policy=msg.engine_policy or "fcfs",
        healthy=bool(msg.healthy) and not msg.draining,
        capabilities=capabilities_of(msg),
        reported_outstanding_tokens=(
            int(msg.outstanding_tokens) if msg.outstanding_tokens > 0 or not msg.requests else None
        ),
    )
