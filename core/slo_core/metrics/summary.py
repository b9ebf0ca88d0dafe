"""Metrics of a simulation run, overall and per request kind, priority class and tier.

A *job* is what a user sent: a single request or a whole compound program (judged as one, from the
union of its calls' tokens). Per group of jobs:

* ``goodput_<fn>`` for every goodput function of slo_core.gain (sum of gains), ``goodput_<fn>_ratio``
  (over the gain of instant service of the same jobs) and ``goodput_<fn>_per_s`` (over the span of
  arrivals);
* ``attainment``: the fraction of jobs that met their SLO (request goodput > 0);
* ``ttft_p50_s`` … ``e2e_p99_s``: TTFT and E2E per job, TBT over every gap between consecutive
  tokens of single requests; percentiles over jobs that got tokens (E2E: that completed);
* ``queue_p50_s`` …: queueing delay from arrival (or stage release) to first scheduling, per
  request or call that was scheduled;
* ``throughput_tokens_per_s`` (output tokens delivered) and ``throughput_jobs_per_s`` (completed);
* counts: ``jobs``, ``completed``, ``rejected`` (router, engine admission or context), ``preemptions``.

Goodput over time: token goodput credited when earned (a latency token at its delivery, a
deadline or compound job at completion), in buckets of ``bucket_s``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slo_core.gain import GOODPUT_FUNCTIONS, Delivery, GainParams, ideal_gain
from slo_core.sim.fleet import SimResult
from slo_core.sim.outcomes import program_delivery, program_output_tokens
from slo_core.sim.request import FINISHED, REJECTED, ProgramState, SimRequest
from slo_core.slo import RequestKind, SLOTargets

PERCENTILES = (50, 95, 99)
_NO_GAPS = np.zeros(0)
_EPS_S = 1e-9


@dataclass
class JobOutcome:
    """One job's delivery and the per-request facts the metrics need."""

    delivery: Delivery
    kind: str
    priority_class: str
    tier: str
    output_tokens: int
    rejected: bool
    preemptions: int
    queue_delays_s: list[float]
    tbt_gaps_s: np.ndarray
    gains: dict[str, float] = field(default_factory=dict)
    ideals: dict[str, float] = field(default_factory=dict)


def _single(r: SimRequest, slo: SLOTargets | None = None) -> tuple[Delivery, list[float], np.ndarray]:
    """``r``'s delivery judged against ``slo`` (the job's own, default ``r.slo``)."""
    times = np.asarray(r.token_times, dtype=float)  # once: every goodput function reads it
    queue = [r.first_scheduled_s - r.arrival_s] if r.first_scheduled_s is not None else []
    d = Delivery(slo or r.slo, r.arrival_s, r.prompt_tokens, times, r.state == FINISHED)  # type: ignore[arg-type]
    return d, queue, np.diff(times)


def instant_gain(name: str, slo: SLOTargets, input_tokens: int, output_tokens: int, p: GainParams) -> float:
    """:func:`slo_core.gain.ideal_gain` in closed form: every token delivered at arrival meets every
    deadline and decays by nothing (a test pins the equality for every function and kind)."""
    n = output_tokens
    if n <= 0:
        return 0.0
    w = slo.priority_weight
    latency = slo.kind is RequestKind.LATENCY
    if name == "token":
        return w * (n if latency else input_tokens + n)
    if name == "request":
        return w
    if name == "tempo":
        return w * (p.input_weight * input_tokens + p.output_weight * n)
    if name == "tdg":
        return w * (p.first_token_weight + p.decode_token_weight * (n - 1))
    d = Delivery(slo, 0.0, input_tokens, (), True)
    return ideal_gain(d, name, p, output_tokens=n)


def job_outcomes(result: SimResult, params: GainParams | None = None) -> list[JobOutcome]:
    """Every job of ``result`` with its gains under every goodput function.

    A job is judged against the SLO it asked for, as its client judges it: a request the router demoted
    to best effort runs on the best-effort tier's targets but still counts as missed when it misses
    its own tier's.
    """
    gp = params or GainParams()
    out: list[JobOutcome] = []
    asked = {j.job_id: j for j in result.jobs}
    for r in result.requests:
        if r.program is not None:
            continue
        job = asked.get(r.request_id)
        slo = job.slo if job is not None else r.slo
        d, queue, gaps = _single(r, slo)
        out.append(
            JobOutcome(
                d,
                slo.kind.value,
                slo.priority_class,
                job.tier if job is not None else r.tier,
                r.target_tokens,
                r.state == REJECTED,
                r.preemptions,
                queue,
                gaps,
            )
        )
    for p in result.programs:
        program_job = asked.get(p.program_id)
        out.append(_program_outcome(p, program_job.tier if program_job is not None else p.tier))
    for o in out:
        for name, fn in GOODPUT_FUNCTIONS.items():
            o.gains[name] = fn(o.delivery, gp)
            o.ideals[name] = instant_gain(name, o.delivery.slo, o.delivery.input_tokens, o.output_tokens, gp)
    return out


def _program_outcome(p: ProgramState, tier: str) -> JobOutcome:
    queue = [c.first_scheduled_s - c.arrival_s for c in p.calls if c.first_scheduled_s is not None]
    d = program_delivery(p)
    d = Delivery(d.slo, d.arrival_s, d.input_tokens, np.asarray(d.token_times_s, dtype=float), d.completed)  # type: ignore[arg-type]
    return JobOutcome(
        d,
        p.slo.kind.value,
        p.slo.priority_class,
        tier,
        program_output_tokens(p),
        any(c.state == REJECTED for c in p.calls),
        sum(c.preemptions for c in p.calls),
        queue,
        _NO_GAPS,
    )


def _pct(values: Iterable[float] | np.ndarray, prefix: str, into: dict[str, Any]) -> None:
    arr = values if isinstance(values, np.ndarray) else np.fromiter(values, dtype=float)
    for q in PERCENTILES:
        into[f"{prefix}_p{q}_s"] = float(np.percentile(arr, q)) if len(arr) else None
    into[f"{prefix}_mean_s"] = float(arr.mean()) if len(arr) else None


def group_metrics(jobs: list[JobOutcome], span_s: float) -> dict[str, Any]:
    """The metric set of one group of jobs (see the module docstring)."""
    m: dict[str, Any] = {"jobs": len(jobs)}
    span = max(span_s, _EPS_S)
    for name in GOODPUT_FUNCTIONS:
        gain = sum(o.gains[name] for o in jobs)
        ideal = sum(o.ideals[name] for o in jobs)
        m[f"goodput_{name}"] = gain
        m[f"goodput_{name}_ratio"] = gain / ideal if ideal > 0 else None
        m[f"goodput_{name}_per_s"] = gain / span
    completed = [o for o in jobs if o.delivery.completed]
    m["attainment"] = sum(1 for o in jobs if o.gains["request"] > 0) / len(jobs) if jobs else None
    m["completed"] = len(completed)
    m["rejected"] = sum(1 for o in jobs if o.rejected)
    m["preemptions"] = sum(o.preemptions for o in jobs)
    _pct(
        (o.delivery.token_times_s[0] - o.delivery.arrival_s for o in jobs if o.delivery.output_tokens),
        "ttft",
        m,
    )
    _pct(np.concatenate([o.tbt_gaps_s for o in jobs]) if jobs else _NO_GAPS, "tbt", m)
    _pct(
        (o.delivery.token_times_s[-1] - o.delivery.arrival_s for o in completed if o.delivery.output_tokens),
        "e2e",
        m,
    )
    _pct((q for o in jobs for q in o.queue_delays_s), "queue", m)
    m["throughput_tokens_per_s"] = sum(o.delivery.output_tokens for o in jobs) / span
    m["throughput_jobs_per_s"] = len(completed) / span
    return m


def goodput_over_time(jobs: list[JobOutcome], bucket_s: float, end_s: float) -> list[float]:
    """Token goodput earned in each ``bucket_s`` window from 0 to ``end_s``."""
    n = max(1, math.ceil(end_s / bucket_s))
    buckets = np.zeros(n)
    for o in jobs:
        d = o.delivery
        if not d.output_tokens:
            continue
        w = d.slo.priority_weight
        if d.slo.kind is RequestKind.LATENCY:
            assert d.slo.ttft_s is not None and d.slo.tbt_s is not None
            t = np.asarray(d.token_times_s)
            due = d.arrival_s + d.slo.ttft_s + np.arange(len(t)) * d.slo.tbt_s
            on_time = t[t <= due + _EPS_S]
            idx = np.minimum((on_time / bucket_s).astype(int), n - 1)
            np.add.at(buckets, idx, w)
        elif o.gains["token"] > 0:
            buckets[min(int(d.token_times_s[-1] / bucket_s), n - 1)] += o.gains["token"]
    return [float(x) for x in buckets]


def summarize(
    result: SimResult,
    *,
    bucket_s: float = 60.0,
    params: GainParams | None = None,
    jobs: list[JobOutcome] | None = None,
) -> dict[str, Any]:
    """Overall metrics, ``by_kind`` / ``by_priority`` / ``by_tier`` groups and goodput over time.

    ``jobs``: the run's :func:`job_outcomes` when the caller already has them.
    """
    if jobs is None:
        jobs = job_outcomes(result, params)
    span = result.duration_s if result.duration_s > 0 else result.end_s
    out = group_metrics(jobs, span)
    out["preemptions_engine"] = int(sum(s["preemptions"] for s in result.replica_stats))
    out["rejected_by_router"] = result.rejected_by_router
    out["sim_end_s"] = result.end_s
    out["wall_s"] = result.wall_s
    for key, attr in (("by_kind", "kind"), ("by_priority", "priority_class"), ("by_tier", "tier")):
        groups: dict[str, list[JobOutcome]] = {}
        for o in jobs:
            groups.setdefault(getattr(o, attr), []).append(o)
        out[key] = {g: group_metrics(members, span) for g, members in sorted(groups.items())}
    over_time = goodput_over_time(jobs, bucket_s, result.end_s)
    out["goodput_over_time"] = {"bucket_s": bucket_s, "token": over_time}
    return out


def latency_samples(jobs: list[JobOutcome]) -> dict[str, list[float]]:
    """Raw TTFT, TBT and E2E samples (seconds) of a run's jobs, for CDF plots."""
    ttft = [o.delivery.token_times_s[0] - o.delivery.arrival_s for o in jobs if o.delivery.output_tokens]
    e2e = [
        o.delivery.token_times_s[-1] - o.delivery.arrival_s
        for o in jobs
        if o.delivery.completed and o.delivery.output_tokens
    ]
    tbt = np.concatenate([o.tbt_gaps_s for o in jobs]).tolist() if jobs else []
    return {"ttft": ttft, "tbt": tbt, "e2e": e2e}


__all__ = ["JobOutcome", "goodput_over_time", "group_metrics", "job_outcomes", "latency_samples", "summarize"]
