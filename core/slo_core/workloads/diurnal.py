"""A diurnal workload from a real trace: the trace's request lengths and burstiness, its arrival rate
bent onto a day-shaped curve.

The trace's own inter-arrival gaps (normalised to mean 1) are replayed in order, each divided by the
day curve's rate at that moment::

    rate(t) = peak_rps · (trough + (1 − trough) · (1 − cos(2π t / day_s)) / 2)

so the run starts at the night trough, peaks at ``day_s / 2`` and falls back. Request lengths cycle
through the trace in order. Each request draws a tier from ``tiers`` (name → (share, SLO targets)).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

import numpy as np

from slo_core.slo import SLOTargets
from slo_core.workloads.jobs import Job
from slo_core.workloads.traces import load_trace


def day_rate_rps(t_s: float, *, peak_rps: float, trough: float, day_s: float) -> float:
    return peak_rps * (trough + (1.0 - trough) * (1.0 - math.cos(2.0 * math.pi * t_s / day_s)) / 2.0)


def diurnal_jobs(
    trace_name: str,
    *,
    peak_rps: float,
    day_s: float,
    tiers: Mapping[str, tuple[float, SLOTargets]],
    trough: float = 0.15,
    seed: int = 0,
    max_tokens: int = 2048,
) -> list[Job]:
    """One simulated day of arrivals (see the module docstring)."""
    trace = load_trace(trace_name)
    if trace.arrival_s is None or len(trace) < 2:
        raise ValueError(f"trace {trace_name!r} has no arrival times to take the burstiness from")
    gaps = np.diff(trace.arrival_s)
    gaps = gaps / max(float(gaps.mean()), 1e-12)
    rng = random.Random(seed)
    names = list(tiers)
    weights = [tiers[n][0] for n in names]
    jobs: list[Job] = []
    t, k = 0.0, 0
    n = len(trace)
    while t < day_s:
        i = k % n
        tier = rng.choices(names, weights)[0]
        jobs.append(
            Job(
                f"d{k}",
                t,
                tiers[tier][1],
                prompt_tokens=max(1, int(trace.input_tokens[i])),
                output_tokens=max(1, min(int(trace.output_tokens[i]), max_tokens)),
                max_tokens=max_tokens,
                tier=tier,
            )
        )
        t += float(gaps[k % len(gaps)]) / day_rate_rps(t, peak_rps=peak_rps, trough=trough, day_s=day_s)
        k += 1
    return jobs
