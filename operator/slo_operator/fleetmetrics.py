"""The fleet's goodput signals as the autoscaler reads them: each ready engine pod's sidecar ``/metrics``.

Why the sidecars' metrics: every ModelDeployment has them (a router is optional, may serve several
ModelDeployments and runs several replicas), they are per pod (so the scale-down can pick the
least-loaded pod), and their counters make the window exact however late a scrape comes. They are
also what Prometheus and the dashboards show, so a decision can be checked against the graphs.
What they lack: requests a router rejected before any pod saw them (only the sidecars' rejections
count).

:func:`parse` reads one exposition into a :class:`slo_core.scaling.PodCounters`; turning two scrapes
into signals is :func:`slo_core.scaling.window`, the definition the simulator uses too.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from slo_core.scaling import PodCounters

P = "slofleet_sidecar_"


def parse(text: str, t_s: float) -> PodCounters:
    """The :class:`PodCounters` of a sidecar's Prometheus exposition (``ValueError`` when it is none)."""
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
    return PodCounters(
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
