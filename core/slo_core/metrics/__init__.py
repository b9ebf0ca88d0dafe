"""Run metrics: every goodput function, SLO attainment, latency percentiles, throughput, over time."""

from __future__ import annotations

from slo_core.metrics.summary import (
    JobOutcome,
    goodput_over_time,
    group_metrics,
    job_outcomes,
    latency_samples,
    summarize,
)

__all__ = ["JobOutcome", "goodput_over_time", "group_metrics", "job_outcomes", "latency_samples", "summarize"]
