"""The sidecar's Prometheus metrics, per tier and priority class, in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 5, 10, 20)
_DECISION_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)

LABELS = ("tier", "priority_class")


class SidecarMetrics:
    """Every metric the sidecar exports (prefix ``slofleet_sidecar_``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, p = self.registry, "slofleet_sidecar_"
        self.requests = Counter(
            p + "requests_total",
            "requests that ended, by outcome (ok, error, aborted, rejected)",
            [*LABELS, "outcome"],
            registry=r,
        )
        self.rejects = Counter(
            p + "rejects_total",
            "requests refused by admission control or validation, by reason",
            [*LABELS, "reason"],
            registry=r,
        )
        self.goodput_earned = Counter(
            p + "goodput_earned_tokens_total",
            "goodput earned (configured goodput function)",
            LABELS,
            registry=r,
        )
        self.goodput_lost = Counter(
            p + "goodput_lost_tokens_total",
            "ideal goodput minus earned (rejects: estimated)",
            LABELS,
            registry=r,
        )
        self.slo_met = Counter(
            p + "slo_met_total", "completed requests that met their SLO", LABELS, registry=r
        )
        self.slo_missed = Counter(
            p + "slo_missed_total", "requests that ended without meeting their SLO", LABELS, registry=r
        )
        self.attainment = Gauge(
            p + "slo_attainment_ratio", "met / (met + missed) since start", LABELS, registry=r
        )
        self.output_tokens = Counter(
            p + "output_tokens_total", "output tokens delivered to clients", LABELS, registry=r
        )
        self.ttft = Histogram(
            p + "ttft_seconds", "time to first token", LABELS, buckets=_LATENCY_BUCKETS_S, registry=r
        )
        self.tbt = Histogram(
            p + "tbt_seconds",
            "mean time between tokens of a request",
            LABELS,
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            p + "e2e_seconds", "arrival to last token", LABELS, buckets=_LATENCY_BUCKETS_S, registry=r
        )
        self.prompt_tokens = Counter(
            p + "prompt_tokens_total", "prompt tokens of admitted requests", LABELS, registry=r
        )
        self.outstanding_tokens = Gauge(
            p + "outstanding_tokens",
            "admitted work not yet done: prompts not yet prefilled plus output bounds left (tokens)",
            registry=r,
        )
        self.program_requests = Gauge(
            p + "program_requests", "in-flight requests that belong to a compound program", registry=r
        )
        self.engine_waiting = Gauge(
            p + "engine_waiting",
            "requests waiting for a batch slot (the sidecar's queue in proxy mode, vLLM's in engine mode)",
            registry=r,
        )
        self.queue_depth = Gauge(p + "queue_depth", "requests waiting in the sidecar", LABELS, registry=r)
        self.running = Gauge(p + "running", "requests released to the engine", LABELS, registry=r)
        self.bound_ratio = Histogram(
            p + "predictor_bound_ratio",
            "length bound at arrival / true output length (completed requests)",
            LABELS,
            buckets=_RATIO_BUCKETS,
            registry=r,
        )
        self.decision_seconds = Histogram(
            p + "decision_seconds",
            "time of one scheduling decision (policy call)",
            buckets=_DECISION_BUCKETS_S,
            registry=r,
        )
        self.preemptions = Counter(
            p + "preemptions_total", "running requests aborted upstream and resumed later", LABELS, registry=r
        )
        self.config_reloads = Counter(
            p + "config_reloads_total", "policy file reloads by result", ["result"], registry=r
        )
        self.unsigned_requests = Counter(
            p + "unsigned_requests_total",
            "HTTP requests refused (403) for headers the router did not sign, by reason",
            ["reason"],
            registry=r,
        )
        self.grpc_unauthenticated = Counter(
            p + "grpc_unauthenticated_total",
            "gRPC calls refused for a missing, stale or wrong token, by method and reason",
            ["method", "reason"],
            registry=r,
        )
        self.lost_on_restart = Counter(
            p + "lost_on_restart_total",
            "requests in flight at the last checkpoint of a crashed process",
            registry=r,
        )
        self._met: dict[tuple[str, str], list[int]] = {}

    def slo_result(self, tier: str, pclass: str, met: bool) -> None:
        (self.slo_met if met else self.slo_missed).labels(tier, pclass).inc()
        counts = self._met.setdefault((tier, pclass), [0, 0])
        counts[0 if met else 1] += 1
        self.attainment.labels(tier, pclass).set(counts[0] / (counts[0] + counts[1]))
