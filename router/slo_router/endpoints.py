"""Endpoints (sidecar pods) the router knows, their capabilities, health and circuit breaker."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from slo_core.policies.base import ReplicaCapabilities, ReplicaView


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """How to reach one pod's sidecar and what it declares it can serve."""

    endpoint_id: str
    http_url: str
    grpc_target: str | None = None
    models: tuple[str, ...] = ()
    max_context_tokens: int = 1 << 30
    gpu_class: str = ""
    lora_adapters: tuple[str, ...] = ()
    profile: str | None = None
    deployment: str = ""

    def capabilities(self) -> ReplicaCapabilities:
        return ReplicaCapabilities(
            models=self.models,
            max_context_tokens=self.max_context_tokens,
            gpu_class=self.gpu_class,
            lora_adapters=self.lora_adapters,
        )


@dataclass
class CircuitBreaker:
    """Opens after ``threshold`` consecutive failures; half-opens after ``cooldown_s``."""

    threshold: int = 3
    cooldown_s: float = 5.0
    failures: int = 0
    opened_at: float | None = None
    clock: Callable[[], float] = time.monotonic

    def allow(self) -> bool:
        if self.opened_at is None:
            return True
        return self.clock() - self.opened_at >= self.cooldown_s

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None

    def failure(self) -> None:
        self.failures += 1
        if self.failures >= self.threshold:
            self.opened_at = self.clock()

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None and not self.allow()


@dataclass
class EndpointState:
    """What the router currently believes about one endpoint."""

    spec: EndpointSpec
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    view: ReplicaView | None = None
    last_state_s: float | None = None
    ready: bool = True

    @property
    def usable(self) -> bool:
        return self.ready and self.breaker.allow() and (self.view is None or self.view.healthy)

    def replica_view(self, now_s: float) -> ReplicaView:
        """The latest state snapshot, or an empty one for an endpoint that has not reported yet."""
        if self.view is not None:
            return self.view
        return ReplicaView(
            replica_id=self.spec.endpoint_id,
            snapshot_s=now_s,
            waiting=(),
            running=(),
            kv_blocks_total=1,
            kv_blocks_free=1,
            max_num_seqs=256,
            max_num_batched_tokens=8192,
            capabilities=self.spec.capabilities(),
        )
