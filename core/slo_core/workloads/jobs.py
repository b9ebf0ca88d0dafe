"""What a workload is made of: jobs (a single request or a compound program), and their JSONL form.

A compound job carries ``stages``: stage ``s`` is a tuple of parallel calls ``(input_tokens,
output_tokens)``; stage ``s+1`` is released when every call of stage ``s`` finished. The JSONL form
(one job per line) lets the live demo and the fleet replay exactly the workload a benchmark used.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from slo_core.slo import RequestKind, SLOTargets, SLOTier

Stages = tuple[tuple[tuple[int, int], ...], ...]


@dataclass(frozen=True, slots=True)
class Job:
    """One arrival of a workload (times in seconds from the start of the run)."""

    job_id: str
    arrival_s: float
    slo: SLOTargets
    prompt_tokens: int = 0
    output_tokens: int = 0
    max_tokens: int = 4096
    stages: Stages | None = None
    tier: str = ""
    tenant: str = "default"
    prompt_id: str | None = None
    output_bound: int | None = None

    @property
    def is_compound(self) -> bool:
        return self.stages is not None

    @property
    def total_input_tokens(self) -> int:
        if self.stages is None:
            return self.prompt_tokens
        return sum(i for stage in self.stages for i, _ in stage)

    @property
    def total_output_tokens(self) -> int:
        if self.stages is None:
            return self.output_tokens
        return sum(o for stage in self.stages for _, o in stage)

    def last_useful_s(self) -> float:
        """The latest time at which delivering a token can still earn SLO gain (absolute seconds)."""
        if self.slo.kind is RequestKind.LATENCY:
            return self.arrival_s + self.slo.token_deadline_s(max(0, self.output_tokens - 1))
        return self.arrival_s + self.slo.effective_deadline_s


def bound_to_tier(job: Job, tiers: Mapping[str, SLOTier]) -> Job:
    """``job`` with the targets its tier gives what it states (:meth:`SLOTier.bind`, the router's rule:
    a stated target stricter than the tier's is raised to it); unchanged when its tier is not listed.

    A compound job of 4 stages in a 6-stage whole-program tier, stating 4 stages' worth of deadline,
    is due at the tier's deadline: the router would not let it ask for more than its tier."""
    tier = tiers.get(job.tier)
    if tier is None:
        return job
    slo = tier.bind(job.slo)
    return job if slo == job.slo else replace(job, slo=slo)


def job_to_dict(job: Job) -> dict[str, Any]:
    out: dict[str, Any] = {
        "request_id": job.job_id,
        "arrival_s": round(job.arrival_s, 6),
        "kind": job.slo.kind.value,
        "ttft_s": job.slo.ttft_s,
        "tbt_s": job.slo.tbt_s,
        "deadline_s": job.slo.deadline_s,
        "priority_class": job.slo.priority_class,
        "priority_weight": job.slo.priority_weight,
        "tier": job.tier,
        "tenant": job.tenant,
        "max_tokens": job.max_tokens,
    }
    if job.stages is None:
        out["prompt_tokens"] = job.prompt_tokens
        out["output_tokens"] = job.output_tokens
    else:
        out["stages"] = [[list(call) for call in stage] for stage in job.stages]
    if job.prompt_id is not None:
        out["prompt_id"] = job.prompt_id
    if job.output_bound is not None:
        out["output_bound"] = job.output_bound
    return out


def job_from_dict(d: dict[str, Any]) -> Job:
    slo = SLOTargets(
        kind=RequestKind(d["kind"]),
        ttft_s=d.get("ttft_s"),
        tbt_s=d.get("tbt_s"),
        deadline_s=d.get("deadline_s"),
        priority_class=str(d.get("priority_class", "default")),
        priority_weight=float(d.get("priority_weight", 1.0)),
    )
    raw_stages = d.get("stages")
    stages: Stages | None = None
    if raw_stages is not None:
        stages = tuple(tuple((int(c[0]), int(c[1])) for c in stage) for stage in raw_stages)
    bound = d.get("output_bound")
    return Job(
        job_id=str(d["request_id"]),
        arrival_s=float(d["arrival_s"]),
        slo=slo,
        prompt_tokens=int(d.get("prompt_tokens", 0)),
        output_tokens=int(d.get("output_tokens", 0)),
        max_tokens=int(d.get("max_tokens", 4096)),
        stages=stages,
        tier=str(d.get("tier", "")),
        tenant=str(d.get("tenant", "default")),
        prompt_id=d.get("prompt_id"),
        output_bound=int(bound) if bound is not None else None,
    )


def write_jobs_jsonl(jobs: Iterable[Job], path: str | Path) -> int:
    """Write one JSON object per job; returns how many were written."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for job in jobs:
            fh.write(json.dumps(job_to_dict(job), separators=(",", ":")) + "\n")
            n += 1
    return n


def read_jobs_jsonl(path: str | Path) -> Iterator[Job]:
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield job_from_dict(json.loads(line))
            except (KeyError, ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a workload job ({exc})") from None
