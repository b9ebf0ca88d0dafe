"""The snapshots a policy (EngineView) and a router (ReplicaView) see of a simulated engine."""

from __future__ import annotations

from slo_core.perf.model import PerfProfile
from slo_core.policies.base import EnginePolicy, EngineView, ReplicaCapabilities, ReplicaView, slots_twin
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.request import SimRequest
from slo_core.sim.views import new_engine_view, request_views

_ReplicaViewSlots = slots_twin(
    ReplicaView,
    (
        "replica_id",
        "snapshot_s",
        "waiting",
        "running",
        "kv_blocks_total",
        "kv_blocks_free",
        "max_num_seqs",
        "max_num_batched_tokens",
        "block_size",
        "profile",
        "engine_policy",
        "healthy",
        "capabilities",
        "reported_outstanding_tokens",
    ),
)


class EngineSnapshots:
    """Mixin of :class:`~slo_core.sim.engine.SimEngine`: its state as immutable snapshots."""

    engine_id: str
    profile: PerfProfile
    policy: EnginePolicy
    config: EngineConfig
    capabilities: ReplicaCapabilities
    waiting: list[SimRequest]
    running: list[SimRequest]
    step: int
    kv_blocks_total: int
    free_blocks: int
    block_size: int
    prompt_left_tokens: int
    output_left_tokens: int

    def engine_view(self, now_s: float) -> EngineView:
        """The engine state and limits a policy sees at ``now_s``."""
        cfg = self.config
        return new_engine_view(
            now_s=now_s,
            step=self.step,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            kv_blocks_total=self.kv_blocks_total,
            kv_blocks_free=self.free_blocks,
            block_size=self.block_size,
            profile=self.profile,
            engine_id=self.engine_id,
        )

    def _apply_deferred(self) -> None:
        """Bring the queues' order up to date before it is read (see SimEngine)."""

    def replica_view(self, now_s: float, *, with_requests: bool = True) -> ReplicaView:
        """This replica as a router sees it; without requests only the counters are filled in."""
        cfg = self.config
        if with_requests:
            self._apply_deferred()
        # the fleet takes one per replica at every arrival: through the slots twin (what
        # ReplicaView(...) builds, without the frozen __init__'s per-field object.__setattr__)
        v = object.__new__(_ReplicaViewSlots)
        v.replica_id = self.engine_id
        v.snapshot_s = now_s
        v.waiting = tuple(request_views(self.waiting)) if with_requests else ()
        v.running = tuple(request_views(self.running)) if with_requests else ()
        v.kv_blocks_total = self.kv_blocks_total
        v.kv_blocks_free = self.free_blocks
        v.max_num_seqs = cfg.max_num_seqs
        v.max_num_batched_tokens = cfg.max_num_batched_tokens
        v.block_size = self.block_size
        v.profile = self.profile
        v.engine_policy = str(getattr(self.policy, "name", ""))
        v.healthy = True
        v.capabilities = self.capabilities
        v.reported_outstanding_tokens = self.outstanding_tokens
        v.__class__ = ReplicaView
        out: ReplicaView = v
        return out

    @property
    def outstanding_tokens(self) -> int:
        return self.prompt_left_tokens + self.output_left_tokens
