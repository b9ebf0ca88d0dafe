"""Endpoints (sidecar pods) the router knows, their capabilities, health and circuit breaker."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from slo_core.policies.base import ReplicaCapabilities, ReplicaView, RequestView
from slo_core.routing.pipeline import with_sent


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """How to reach one pod and what it declares it can serve.

    ``mode``: ``proxy`` (``http_url`` is the pod's sidecar, which relays to a stock engine) or ``engine``
    (``http_url`` is the engine itself, vLLM with the slofleet plugin or engine-sim; the request goes
    there with signed SLO tags and no sidecar relays it). Either way ``grpc_target`` is the sidecar's
    state stream."""

    endpoint_id: str
    http_url: str
    grpc_target: str | None = None
    models: tuple[str, ...] = ()
    max_context_tokens: int = 1 << 30
    gpu_class: str = ""
    lora_adapters: tuple[str, ...] = ()
    profile: str | None = None
    deployment: str = ""
    mode: str = "proxy"

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
    """What the router currently believes about one endpoint.

    The load view comes from the pod's sidecar (``view``, refreshed by the state stream; a snapshot is
    turned into a :class:`ReplicaView` only when a dispatch needs it, since most are superseded unread,
    while its health and capabilities are read at once for the filters). Requests this
    router sent after that snapshot was taken are added to it as waiting (``sent``) until a newer
    snapshot covers them, so a burst between two snapshots does not all land on one pod. An endpoint
    with a gRPC state stream is usable only while the stream is live (``feed_ok``).
    """

    spec: EndpointSpec
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    view: ReplicaView | None = None
    last_state_s: float | None = None
    ready: bool = True
    feed_ok: bool | None = None
    sent: list[tuple[float, RequestView]] = field(default_factory=list)
    _build: Callable[[], ReplicaView] | None = field(default=None, repr=False)
    _healthy: bool = True
    _caps: ReplicaCapabilities | None = None

    @property
    def endpoint_id(self) -> str:
        return self.spec.endpoint_id

    def capabilities(self) -> ReplicaCapabilities:
        """What the pod's sidecar reports it serves, else what discovery declared (routing filters)."""
        reported = self.reported_capabilities()
        if reported is not None and reported.models:
            return reported
        return self.spec.capabilities()

    @property
    def usable(self) -> bool:
        if not self.ready or not self.breaker.allow():
            return False
        if self.spec.grpc_target and not self.feed_ok:
            return False
        if self._build is not None:
            return self._healthy
        return self.view is None or self.view.healthy

    def reported_capabilities(self) -> ReplicaCapabilities | None:
        """What the sidecar last said the pod serves (None before any report)."""
        if self._build is not None:
            return self._caps
        return self.view.capabilities if self.view is not None else None

    def update_view(self, view: ReplicaView, now_s: float) -> None:
        """A fresh snapshot: forget sent requests it already accounts for."""
        self.view, self._build = view, None
        self.last_state_s = now_s
        self.feed_ok = True
        self.sent = [(t, r) for t, r in self.sent if t > view.snapshot_s]

    def update_lazy(
        self,
        build: Callable[[], ReplicaView],
        *,
        snapshot_s: float,
        healthy: bool,
        capabilities: ReplicaCapabilities,
        now_s: float,
    ) -> None:
        """A fresh snapshot, converted by ``build`` only if a dispatch asks for it."""
        self._build, self._healthy, self._caps = build, healthy, capabilities
        self.last_state_s = now_s
        self.feed_ok = True
        self.sent = [(t, r) for t, r in self.sent if t > snapshot_s]

    def current_view(self) -> ReplicaView | None:
        if self._build is not None:
            self.view, self._build = self._build(), None
        return self.view

    def feed_lost(self) -> None:
        self.feed_ok = False
        self.sent.clear()

    def note_sent(self, request: RequestView, now_s: float) -> None:
        self.sent.append((now_s, request))
        if len(self.sent) > 4096:  # no snapshot for a long while: keep the newest
            del self.sent[:1024]

    def forget_sent(self, request_id: str) -> None:
        """The request finished (or failed) here: it no longer adds to the pod's load."""
        self.sent = [(t, r) for t, r in self.sent if r.request_id != request_id]

    def replica_view(self, now_s: float) -> ReplicaView:
        """The latest snapshot plus requests sent since, or an empty one before any report."""
        base = self.current_view()
        if base is None:
            base = ReplicaView(
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
        return with_sent(base, [r for _, r in self.sent])  # core's rule, as the simulator's router sees it
