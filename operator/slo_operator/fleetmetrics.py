"""The fleet's goodput signals as the autoscaler reads them: each ready engine pod's sidecar ``/metrics``.

Why the sidecars' metrics: every ModelDeployment has them (a router is optional, may serve several
ModelDeployments and runs several replicas), they are per pod (so the scale-down can pick the
least-loaded pod), and their counters make the window exact however late a scrape comes. They are
also what Prometheus and the dashboards show, so a decision can be checked against the graphs.
What they lack: requests a router rejected before any pod saw them (only the sidecars' rejections
count).

:func:`parse` reads one exposition into a :class:`PodSample` (cumulative counters and current gauges);
:func:`window` turns two scrapes per pod into :class:`slo_core.scaling.FleetSignals`. Both pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from slo_core.scaling import FleetSignals, TierSignal

P = "slofleet_sidecar_"


@dataclass(frozen=True)
class PodSample:
    """One scrape of one pod's sidecar: counters since the sidecar started, gauges now."""

    t_s: float
    met: Mapping[str, float] = field(default_factory=dict)  # per tier
    missed: Mapping[str, float] = field(default_factory=dict)
    rejected: float = 0.0
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    outstanding_tokens: float = 0.0
    program_requests: float = 0.0
    waiting: float = 0.0


def parse(text: str, t_s: float) -> PodSample:
    """A :class:`PodSample` from a sidecar's Prometheus exposition (``ValueError`` when it is none)."""
    met: dict[str, float] = {}
    missed: dict[str, float] = {}
    sums = {"rejects_total": 0.0, "prompt_tokens_total": 0.0, "output_tokens_total": 0.0}
    gauges = {"outstanding_tokens": 0.0, "program_requests": 0.0, "engine_waiting": 0.0}
    seen = False
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith(P) or not math.isfinite(s.value):
                continue
            seen = True
            name = s.name[len(P) :]
            tier = s.labels.get("tier", "-")
            if name == "slo_met_total":
                met[tier] = met.get(tier, 0.0) + s.value
            elif name == "slo_missed_total":
                missed[tier] = missed.get(tier, 0.0) + s.value
            elif name in sums:
                sums[name] += s.value
            elif name in gauges:
                gauges[name] = s.value
    if not seen:
        raise ValueError("no slofleet_sidecar_ metrics in the response")
    return PodSample(
        t_s=t_s,
        met=met,
        missed=missed,
        rejected=sums["rejects_total"],
        prompt_tokens=sums["prompt_tokens_total"],
        output_tokens=sums["output_tokens_total"],
        outstanding_tokens=gauges["outstanding_tokens"],
        program_requests=gauges["program_requests"],
        waiting=gauges["engine_waiting"],
    )


def _delta(now: float, before: float) -> float:
    """A counter's increase; a counter below its last value means the sidecar restarted from zero."""
    return now - before if now >= before else now


def window(
    before: Mapping[str, PodSample],
    now: Mapping[str, PodSample],
    *,
    ready: int,
    starting: int,
    capacity_tokens_per_s: float,
    target: Callable[[str], float],
) -> FleetSignals:
    """Signals over the period between two scrapes of each pod (pods scraped once add only gauges).

    Demand is the prompt and output tokens the pods took in per second; admitted work, queue and
    in-flight programs are the gauges of the latest scrape.
    """
    finished: dict[str, float] = {}
    met: dict[str, float] = {}
    rejected = demand = admitted = queue = 0.0
    protected = 0
    for pod, cur in now.items():
        admitted += cur.outstanding_tokens
        queue += cur.waiting
        protected += cur.program_requests > 0
        old = before.get(pod)
        if old is None or cur.t_s <= old.t_s:
            continue
        for tier in set(cur.met) | set(cur.missed):
            m = _delta(cur.met.get(tier, 0.0), old.met.get(tier, 0.0))
            x = _delta(cur.missed.get(tier, 0.0), old.missed.get(tier, 0.0))
            met[tier] = met.get(tier, 0.0) + m
            finished[tier] = finished.get(tier, 0.0) + m + x
        rejected += _delta(cur.rejected, old.rejected)
        tokens = _delta(cur.prompt_tokens, old.prompt_tokens) + _delta(cur.output_tokens, old.output_tokens)
        demand += tokens / (cur.t_s - old.t_s)
    tiers = tuple(
        TierSignal(t, round(finished[t]), round(met.get(t, 0.0)), target(t))
        for t in sorted(finished)
        if t != "-"
    )
    return FleetSignals(
        ready=ready,
        starting=starting,
        tiers=tiers,
        rejected=round(rejected),
        admitted_tokens=admitted,
        demand_tokens_per_s=demand,
        capacity_tokens_per_s=capacity_tokens_per_s,
        protected=protected,
        queue_len=round(queue),
    )


def deletion_cost(sample: PodSample | None) -> int:
    """``controller.kubernetes.io/pod-deletion-cost`` for a pod: its outstanding work, and far above any
    work while it holds calls of an in-flight program (the ReplicaSet removes the lowest cost first)."""
    if sample is None:
        return 0
    cost = int(min(sample.outstanding_tokens, 1e9)) + (1_000_000_000 if sample.program_requests > 0 else 0)
    return min(cost, 2**31 - 1)
