"""The one routing pipeline the router service and the fleet simulator both run (see ``pipeline``)."""

from slo_core.routing.pipeline import (
    FILTERS,
    Affinity,
    Endpoint,
    ProgramClock,
    Routed,
    RoutingPipeline,
    SessionTable,
    SnapshotEndpoint,
    bounded_scores,
    rendezvous,
    retry_hint_s,
    with_sent,
)

__all__ = [
    "FILTERS",
    "Affinity",
    "Endpoint",
    "ProgramClock",
    "Routed",
    "RoutingPipeline",
    "SessionTable",
    "SnapshotEndpoint",
    "bounded_scores",
    "rendezvous",
    "retry_hint_s",
    "with_sent",
]
