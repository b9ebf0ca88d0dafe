"""Router metrics (prometheus-client), per tier, tenant and model, and per pod; one registry per app."""

from __future__ import annotations

from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_M = TypeVar("_M", Counter, Gauge, Histogram)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        labels = ["tier", "tenant", "model"]
        self.requests = Counter(
            "slofleet_router_requests", "Requests by outcome", [*labels, "outcome"], registry=r
        )
        self.goodput_tokens = Counter(
            "slofleet_router_goodput_tokens", "Token goodput earned (priority-weighted)", labels, registry=r
        )
        self.slo_met = Counter(
            "slofleet_router_slo_met", "Completed requests that met their SLO", labels, registry=r
        )
        self.slo_missed = Counter(
            "slofleet_router_slo_missed", "Completed requests that missed", labels, registry=r
        )
        self.rejects = Counter(
            "slofleet_router_rejects",
            "Rejected requests by reason (tier/tenant/model empty when rejected before they are known)",
            [*labels, "reason"],
            registry=r,
        )
        self.retries = Counter(
            "slofleet_router_retries", "Upstream retries on another pod", labels, registry=r
        )
        self.downgraded = Counter(
            "slofleet_router_downgraded",
            "Requests no pod could serve in time, moved to the best-effort tier",
            labels,
            registry=r,
        )
        self.upstream_failures = Counter(
            "slofleet_router_upstream_failures",
            "Pod failures before the first byte (connect error or retryable status)",
            ["endpoint", "kind"],
            registry=r,
        )
        self.affinity_hits = Counter(
            "slofleet_router_affinity_hits", "Requests kept on their affine pod", ["affinity"], registry=r
        )
        self.stripped = Counter(
            "slofleet_router_stripped",
            "Client-supplied tier/priority beyond the tenant's allowance",
            ["tenant"],
            registry=r,
        )
        self.key_reads_failed = Counter(
            "slofleet_router_key_reads_failed",
            "Reads of a tenant's API-key Secret that failed (its last good keys stay in force)",
            ["tenant"],
            registry=r,
        )
        self.dispatch_seconds = Histogram(
            "slofleet_router_dispatch_seconds",
            "Dispatch decision latency (filters + routing policy)",
            ["policy"],
            buckets=(1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2),
            registry=r,
        )
        self.chosen = Counter("slofleet_router_chosen", "Times each pod was chosen", ["endpoint"], registry=r)
        self.estimated_gain = Gauge(
            "slofleet_router_estimated_gain",
            "Last estimated gain of sending to the pod",
            ["endpoint"],
            registry=r,
        )
        self.endpoints_ready = Gauge("slofleet_router_endpoints_ready", "Usable endpoints", registry=r)
        self.ttft = Histogram(
            "slofleet_router_ttft_seconds",
            "Time to first token seen by the router",
            ["tier"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
            registry=r,
        )

    def of(self, metric: _M, *values: str) -> _M:
        """``metric.labels(*values)``, looked up once per label set (the request path asks for the same
        few children on every request; prometheus-client validates and locks on every call)."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child
