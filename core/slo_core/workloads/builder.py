"""Build a seeded workload (a list of Jobs) from a WorkloadSpec: arrivals, kinds, SLOs, priorities.

Arrivals replay a trace with its times scaled to the target rate (``arrival="trace"``: the first
rate × duration requests, stretched to the duration; a trace shorter than that is replayed again
after itself) or follow a Poisson process at the target
rate with lengths drawn from the trace (``arrival="poisson"``). Each arrival becomes a latency,
deadline or compound request by the ``mix`` ratio (JITServe §6.1 default 1:1:1): single requests
keep the trace's lengths, compound ones draw a DAG (slo_core.workloads.dags). SLOs are JITServe
§6.1's — TTFT 2 s and TBT 100 ms, a 20 s deadline, 20 s per stage for compound requests — times
``slo_scale``. A ``best_effort_share`` of arrivals carries no SLO. Priority classes follow PROSERVE
§5.1: ``high_share`` of requests are ``high`` (weight 2), the rest ``low`` (weight 1). Each job's
tier is ``<kind>-<class>``. The same spec and seed always give the same jobs.
"""

from __future__ import annotations

import random
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads.dags import DagSource, DeepResearchParams
from slo_core.workloads.jobs import Job
from slo_core.workloads.traces import Trace, load_trace

KINDS = (RequestKind.LATENCY, RequestKind.DEADLINE, RequestKind.COMPOUND)


def parse_mix(text: str) -> tuple[float, float, float]:
    """``"1:1:1"`` (latency:deadline:compound) as three non-negative weights, not all zero."""
    parts = text.split(":")
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or any(not v >= 0 for v in values) or sum(values) <= 0:
        raise ValueError(
            f"mix {text!r}: expected three non-negative ratios latency:deadline:compound, e.g. 1:1:1"
        )
    return values[0], values[1], values[2]


class SLOSettings(BaseModel):
    """JITServe §6.1 SLO targets before scaling (seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_s: float = Field(2.0, gt=0, description="latency requests: time to first token (s)")
    tbt_s: float = Field(0.1, gt=0, description="latency requests: time between tokens (s)")
    deadline_s: float = Field(20.0, gt=0, description="deadline requests: end-to-end deadline (s)")
    stage_deadline_s: float = Field(20.0, gt=0, description="compound requests: deadline per stage (s)")


class WorkloadSpec(BaseModel):
    """Everything that determines a workload; the same spec always builds the same jobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace: str = Field("azure-conv-2023", description="built-in trace name or trace file path")
    arrival: Literal["trace", "poisson"] = Field("trace", description="replay the trace's times or Poisson")
    rps: float | None = Field(None, gt=0, description="target arrival rate (requests/s); None: the trace's")
    duration_s: float = Field(600.0, gt=0, description="arrivals span this long (s)")
    mix: tuple[float, float, float] = Field((1.0, 1.0, 1.0), description="latency:deadline:compound ratio")
    dags: str = Field(
        "deep-research", description="compound DAG source: deep-research, tot, mixed or a JSONL path"
    )
    slo_scale: float = Field(1.0, gt=0, description="factor on every SLO target (dimensionless)")
    slo: SLOSettings = Field(default_factory=SLOSettings, description="SLO targets before scaling")
    high_share: float = Field(0.5, ge=0, le=1, description="share of requests in the high class (fraction)")
    high_weight: float = Field(2.0, gt=0, description="priority weight of the high class")
    low_weight: float = Field(1.0, gt=0, description="priority weight of the low class")
    best_effort_share: float = Field(0.0, ge=0, le=1, description="share of arrivals without SLO (fraction)")
    max_tokens: int = Field(4096, ge=1, description="max_tokens each request states (tokens)")
    seed: int = Field(0, description="seed of every random choice")
    deep_research: DeepResearchParams = Field(default_factory=DeepResearchParams)

    @field_validator("mix")
    @classmethod
    def _mix_ok(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(x < 0 for x in v) or sum(v) <= 0:
            raise ValueError("mix ratios must be non-negative and not all zero")
        return v


def _arrivals(spec: WorkloadSpec, trace: Trace, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times, trace row index) of the run."""
    n = len(trace)
    if spec.arrival == "poisson" or trace.arrival_s is None:
        rate = spec.rps or (trace.rate_rps if trace.rate_rps > 0 else None)
        if rate is None:
            raise ValueError(f"trace {trace.name!r} has no timestamps: give a target rate (rps)")
        expected = int(rate * spec.duration_s * 1.2) + 16
        times = np.cumsum(rng.exponential(1.0 / rate, size=expected))
        while times[-1] < spec.duration_s:
            more = np.cumsum(rng.exponential(1.0 / rate, size=expected)) + times[-1]
            times = np.concatenate([times, more])
        times = times[times < spec.duration_s]
        return times, rng.integers(0, n, size=len(times))
    natural = trace.rate_rps
    if natural <= 0:
        raise ValueError(f"trace {trace.name!r} needs at least two distinct arrival times")
    # the first N = rps·duration requests (the trace repeated after itself if it is shorter), their
    # times stretched so that request N would arrive exactly at the end: the run has the target rate
    # and the trace's burst shape
    count = max(1, round((spec.rps or natural) * spec.duration_s))
    period = trace.span_s + 1.0 / natural
    idx = np.arange(count + 1)
    rows = idx % n
    raw = trace.arrival_s[rows] + (idx // n) * period
    times = raw[:count] * (spec.duration_s / raw[count]) if raw[count] > 0 else raw[:count]
    return times, rows[:count]


def build_workload(spec: WorkloadSpec) -> list[Job]:
    """The jobs of ``spec`` in arrival order (ids ``j<index>``)."""
    trace = load_trace(spec.trace)
    nrng = np.random.default_rng(spec.seed)
    rng = random.Random(spec.seed)
    times, rows = _arrivals(spec, trace, nrng)
    dag_source = DagSource(spec.dags, spec.deep_research) if spec.mix[2] > 0 else None
    s = spec.slo_scale
    slo_cfg = spec.slo
    total = sum(spec.mix)
    cum = (spec.mix[0] / total, (spec.mix[0] + spec.mix[1]) / total)
    jobs: list[Job] = []
    for idx, (t, row) in enumerate(zip(times.tolist(), rows.tolist(), strict=True)):
        u = rng.random()
        kind = KINDS[0] if u < cum[0] else KINDS[1] if u < cum[1] else KINDS[2]
        high = rng.random() < spec.high_share
        pclass, weight = ("high", spec.high_weight) if high else ("low", spec.low_weight)
        best_effort = spec.best_effort_share > 0 and rng.random() < spec.best_effort_share
        stages = None
        if best_effort:
            slo = SLOTargets(RequestKind.BEST_EFFORT, priority_class=pclass, priority_weight=weight)
        elif kind is RequestKind.LATENCY:
            slo = SLOTargets(
                kind,
                ttft_s=slo_cfg.ttft_s * s,
                tbt_s=slo_cfg.tbt_s * s,
                priority_class=pclass,
                priority_weight=weight,
            )
        elif kind is RequestKind.DEADLINE:
            slo = SLOTargets(
                kind, deadline_s=slo_cfg.deadline_s * s, priority_class=pclass, priority_weight=weight
            )
        else:
            assert dag_source is not None
            stages = dag_source.draw(rng)
            slo = SLOTargets(
                kind,
                deadline_s=slo_cfg.stage_deadline_s * len(stages) * s,
                priority_class=pclass,
                priority_weight=weight,
            )
        prompt_id = trace.prompt_ids[row] if trace.prompt_ids is not None and stages is None else None
        jobs.append(
            Job(
                job_id=f"j{idx}",
                arrival_s=float(t),
                slo=slo,
                prompt_tokens=int(trace.input_tokens[row]) if stages is None else 0,
                output_tokens=int(trace.output_tokens[row]) if stages is None else 0,
                max_tokens=spec.max_tokens,
                stages=stages,
                tier=f"{slo.kind.value}-{pclass}",
                prompt_id=prompt_id,
            )
        )
    return jobs
