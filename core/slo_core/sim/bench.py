"""The benchmark runner behind ``slofleet bench``: policies × routers × loads on one seeded workload.

Every run of a sweep sees the identical jobs for a given load (same spec and seed); only the policy
and router differ. A run that raises is recorded with its error and the sweep goes on.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from slo_core.metrics import job_outcomes, latency_samples, summarize
from slo_core.perf.model import PerfProfile
from slo_core.predict import OutputBoundEstimator, load_estimator
from slo_core.predict.calibration import OnlineCalibrator
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
from slo_core.workloads import WorkloadSpec, build_workload


class BenchConfig(BaseModel):
    """One sweep: the workload (``rps`` replaced per load), the fleet and what to compare."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    workload: WorkloadSpec
    rps: tuple[float | None, ...] = Field((None,), description="arrival rates to sweep (requests/s)")
    policies: tuple[str, ...] = Field(("fcfs",), description="engine policy names")
    routers: tuple[str, ...] = Field(("round-robin",), description="router policy names")
    profiles: tuple[PerfProfile, ...] = Field(description="one per replica, cycled")
    replicas: int = Field(4, ge=1, description="number of replicas")
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sim: SimConfig = Field(default_factory=SimConfig)
    bucket_s: float = Field(60.0, gt=0, description="goodput-over-time bucket (s)")
    analyzer: Literal["qrf", "qrf-calibrated", "none"] = Field(
        "qrf",
        description="qrf: requests carry the sidecar analyzer's QRF bounds (refined as tokens stream) and "
        "pattern-graph stage sub-deadlines, as in a deployment; qrf-calibrated: the same bounds through "
        "the online conformal calibration (learned within the run); none: no bounds, equal stage split",
    )


@dataclass
class BenchResult:
    records: list[dict[str, Any]] = field(default_factory=list)
    # (policy, router, rps) -> raw latency samples, kept for plots only
    samples: dict[tuple[str, str, float], dict[str, list[float]]] = field(default_factory=dict)


Progress = Callable[[str, float], None]


def _record_head(cfg: BenchConfig, policy: str, router: str, rps: float, n_jobs: int) -> dict[str, Any]:
    w = cfg.workload
    return {
        "policy": policy,
        "router": router,
        "rps": rps,
        "replicas": cfg.replicas,
        "profiles": sorted({p.name for p in cfg.profiles}),
        "trace": w.trace,
        "arrival": w.arrival,
        "mix": list(w.mix),
        "dags": w.dags,
        "duration_s": w.duration_s,
        "seed": w.seed,
        "slo_scale": w.slo_scale,
        "jobs_offered": n_jobs,
        "analyzer": cfg.analyzer,
    }


def run_bench(cfg: BenchConfig, progress: Progress | None = None) -> BenchResult:
    """Run every (load, policy, router); ``progress(label, fraction of this run)`` as runs go."""
    out = BenchResult()
    specs = [ReplicaSpec(cfg.profiles[i % len(cfg.profiles)], cfg.engine) for i in range(cfg.replicas)]
    estimator = load_estimator() if cfg.analyzer != "none" else None
    for rps in cfg.rps:
        spec = cfg.workload.model_copy(update={"rps": rps})
        jobs = build_workload(spec)
        realized = rps if rps is not None else len(jobs) / spec.duration_s
        for policy in cfg.policies:
            for router in cfg.routers:
                label = f"{policy}/{router}@{realized:g}rps"
                head = _record_head(cfg, policy, router, realized, len(jobs))

                def tick(frac: float, label: str = label) -> None:
                    if progress is not None:
                        progress(label, frac)

                try:
                    # a fresh analyzer per run: pattern history is learned within the run only
                    analyzer = _analyzer(cfg, estimator)
                    sim = FleetSim(specs, policy, router, seed=spec.seed, config=cfg.sim, analyzer=analyzer)
                    result = sim.run(jobs, progress=tick)
                    outcomes = job_outcomes(result)
                    metrics = summarize(result, bucket_s=cfg.bucket_s, jobs=outcomes)
                    out.samples[(policy, router, realized)] = latency_samples(outcomes)
                    out.records.append({**head, **metrics})
                except Exception as exc:
                    detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                    out.records.append({**head, "error": detail})
                tick(1.0)
    return out


def _analyzer(cfg: BenchConfig, estimator: OutputBoundEstimator | None) -> SimAnalyzer | None:
    if estimator is None:
        return None
    if cfg.analyzer == "qrf-calibrated":
        return SimAnalyzer(estimator, calibrator=OnlineCalibrator(estimator.params.quantile))
    return SimAnalyzer(estimator)


def _fmt(v: Any, scale: float = 1.0, digits: int = 3) -> str:
    if v is None:
        return "–"
    return f"{v * scale:.{digits}g}"


def markdown_table(records: Sequence[dict[str, Any]], goodput: str = "token") -> str:
    """One row per record: headline goodput, attainment (overall and per kind), latencies."""
    kinds = sorted({k for r in records for k in r.get("by_kind", {})})
    head = ["policy", "router", "rps", f"{goodput} goodput", "attain", *[f"attain {k}" for k in kinds]]
    head += ["TTFT p95 s", "TBT p95 ms", "E2E p95 s", "preempt", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        row = [r["policy"], r["router"], _fmt(r["rps"])]
        if "error" in r:
            row += [f"error: {r['error'][:60]}"] + [""] * (len(head) - 4)
        else:
            row += [_fmt(r.get(f"goodput_{goodput}_ratio")), _fmt(r.get("attainment"))]
            row += [_fmt(r["by_kind"].get(k, {}).get("attainment")) for k in kinds]
            row += [_fmt(r.get("ttft_p95_s")), _fmt(r.get("tbt_p95_s"), 1000), _fmt(r.get("e2e_p95_s"))]
            row += [str(r.get("preemptions_engine", 0)), f"{r.get('wall_s', 0.0):.1f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
