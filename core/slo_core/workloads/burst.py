"""A burst on top of a workload: the arrival rate multiplied for one window (SLOs-Serve §6 setting).

``burst_workload(spec, BurstSpec(start_s=60, length_s=60, factor=5))`` is the jobs of ``spec`` plus,
inside ``[start_s, start_s + length_s)``, the arrivals of a second workload built from the same spec at
``(factor - 1) × rps`` over ``length_s`` (its own seed, ``seed + 1``; ids ``b<index>``): the window
sees ``factor`` times the base rate with the same kind mix, SLOs, priorities and trace lengths, and
everything outside the window is the base workload unchanged. Deterministic for a given spec.
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel, ConfigDict, Field

from slo_core.workloads.builder import WorkloadSpec, build_workload
from slo_core.workloads.jobs import Job


class BurstSpec(BaseModel):
    """Where the burst is and how strong."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start_s: float = Field(60.0, ge=0, description="the burst window opens this long after the start (s)")
    length_s: float = Field(60.0, gt=0, description="length of the burst window (s)")
    factor: float = Field(5.0, ge=1, description="arrival rate inside the window over the base rate (×)")


def base_rate_rps(spec: WorkloadSpec, jobs: list[Job]) -> float:
    """The spec's arrival rate: its ``rps``, else the rate the built jobs realise."""
    return spec.rps if spec.rps is not None else len(jobs) / spec.duration_s


def burst_workload(spec: WorkloadSpec, burst: BurstSpec | None = None) -> list[Job]:
    """The jobs of ``spec`` with a ``burst.factor``× arrival rate inside the burst window, by arrival."""
    b = burst or BurstSpec()
    base = build_workload(spec)
    if b.factor <= 1.0:
        return base
    extra_rps = (b.factor - 1.0) * base_rate_rps(spec, base)
    extra_spec = spec.model_copy(update={"rps": extra_rps, "duration_s": b.length_s, "seed": spec.seed + 1})
    extra = [
        dataclasses.replace(j, job_id=f"b{j.job_id[1:]}", arrival_s=j.arrival_s + b.start_s)
        for j in build_workload(extra_spec)
    ]
    return sorted(base + extra, key=lambda j: j.arrival_s)


__all__ = ["BurstSpec", "base_rate_rps", "burst_workload"]
