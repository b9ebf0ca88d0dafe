"""The benchmark runner behind ``slofleet bench``: policies × routers × loads on one seeded workload.

Every run of a sweep sees the identical jobs for a given load (same spec and seed); only the policy
and router differ. A run that raises is recorded with its error and the sweep goes on. Runs are
independent, so they can be spread over processes (``workers``) and an interrupted sweep resumed
from the records it saved (``done``); either way the records are those of a serial run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from slo_core.bench.parallel import process_pool
from slo_core.metrics import job_outcomes, latency_samples, summarize
from slo_core.objective import Objective
from slo_core.perf.model import PerfProfile
from slo_core.predict import OutputBoundEstimator, load_estimator
from slo_core.predict.calibration import OnlineCalibrator
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.engine_types import DecisionCost, EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
from slo_core.workloads import WorkloadSpec, build_workload
from slo_core.workloads.jobs import Job


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
    objective: Objective = Field(
        default_factory=Objective,
        description="what SLO-aware policies maximize (spec.goodput, spec.fairness); headline column",
    )
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
Key = tuple[str, str, float | None]  # (policy, router, requested rps); None: the trace's own rate


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
        "objective": cfg.objective.goodput,
        "fairness": cfg.objective.fairness,
    }


def fingerprint(cfg: BenchConfig) -> str:
    """What every run of a sweep shares (workload, fleet, engine, analyzer): records with the same
    fingerprint came from the same setup, whatever loads, policies and routers the sweep listed."""
    shared = cfg.model_dump(mode="json", exclude={"rps", "policies", "routers", "bucket_s"})
    blob = json.dumps(shared, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def run_keys(cfg: BenchConfig) -> list[Key]:
    """Every run of the sweep, in the serial order (load, then policy, then router)."""
    return [(p, r, rps) for rps in cfg.rps for p in cfg.policies for r in cfg.routers]


def record_key(record: dict[str, Any]) -> Key:
    """The run a record belongs to (records carry the requested rate as ``rps_requested``)."""
    return (record["policy"], record["router"], record.get("rps_requested"))


@functools.lru_cache(maxsize=4)
def _jobs(spec: WorkloadSpec) -> list[Job]:
    return build_workload(spec)


@functools.lru_cache(maxsize=1)
def _estimator() -> OutputBoundEstimator:
    return load_estimator()


def _analyzer(cfg: BenchConfig) -> SimAnalyzer | None:
    if cfg.analyzer == "none":
        return None
    estimator = _estimator()
    if cfg.analyzer == "qrf-calibrated":
        return SimAnalyzer(estimator, calibrator=OnlineCalibrator(estimator.params.quantile))
    return SimAnalyzer(estimator)


RunOutput = tuple[dict[str, Any], dict[str, list[float]] | None]


def run_one(
    cfg: BenchConfig,
    key: Key,
    progress: Callable[[float], None] | None = None,
    decision_cost: DecisionCost | None = None,
) -> RunOutput:
    """One (policy, router, load) of the sweep: its record and latency samples (None if it failed).

    A pure function of ``cfg`` and ``key`` apart from ``wall_s``: any process gives the same record.
    ``decision_cost``: the CPU time each policy decision adds to its step (FleetSim's; the record then
    carries it as ``decision_cost``); None: decisions take no time, as in every sweep.
    """
    policy, router, rps = key
    spec = cfg.workload.model_copy(update={"rps": rps})
    jobs = _jobs(spec)
    realized = rps if rps is not None else len(jobs) / spec.duration_s
    head = _record_head(cfg, policy, router, realized, len(jobs))
    head |= {"rps_requested": rps, "sweep_fingerprint": fingerprint(cfg)}
    if decision_cost is not None:
        head["decision_cost"] = {"base_s": decision_cost.base_s, "per_request_s": decision_cost.per_request_s}
    specs = [ReplicaSpec(cfg.profiles[i % len(cfg.profiles)], cfg.engine) for i in range(cfg.replicas)]
    try:
        # a fresh analyzer per run: pattern history is learned within the run only
        analyzer = _analyzer(cfg)
        sim = FleetSim(
            specs,
            policy,
            router,
            seed=spec.seed,
            config=cfg.sim,
            analyzer=analyzer,
            objective=cfg.objective,
            decision_cost=decision_cost,
        )
        result = sim.run(jobs, progress=progress)
        outcomes = job_outcomes(result)
        metrics = summarize(result, bucket_s=cfg.bucket_s, jobs=outcomes)
        return {**head, **metrics}, latency_samples(outcomes)
    except Exception as exc:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return {**head, "error": detail}, None


def run_one_timed(
    cfg: BenchConfig, key: Key, decision_cost: DecisionCost | None = None
) -> tuple[dict[str, Any], float]:
    """:func:`run_one`'s record (without samples) and the CPU seconds the run took in its process."""
    c0 = time.process_time()
    record, _ = run_one(cfg, key, decision_cost=decision_cost)
    return record, time.process_time() - c0


def _label(key: Key) -> str:
    policy, router, rps = key
    return f"{policy}/{router}@{'trace' if rps is None else f'{rps:g}'}rps"


def run_bench(
    cfg: BenchConfig,
    progress: Progress | None = None,
    *,
    workers: int = 1,
    done: Sequence[dict[str, Any]] = (),
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> BenchResult:
    """Run every (load, policy, router); ``progress(label, fraction of this run)`` as runs go.

    ``workers`` > 1 spreads the runs over that many processes (each run is independent and seeded, so
    the records are those of a serial run, in the same order). ``done``: records of an earlier,
    interrupted sweep of the same config; their runs are not repeated (resume). ``on_record`` sees
    each new record as soon as its run ends (to save progress).
    """
    keys = run_keys(cfg)
    kept = {record_key(r): r for r in done if "error" not in r}
    todo = [k for k in keys if k not in kept]
    new: dict[Key, RunOutput] = {}

    def finished(key: Key, out: RunOutput) -> None:
        new[key] = out
        if on_record is not None:
            on_record(out[0])
        if progress is not None:
            progress(_label(key), 1.0)

    if workers <= 1 or len(todo) <= 1:
        for key in todo:
            tick = None if progress is None else functools.partial(progress, _label(key))
            finished(key, run_one(cfg, key, tick))
    else:
        with process_pool(min(workers, len(todo))) as pool:
            futures = {pool.submit(run_one, cfg, key): key for key in todo}
            for fut in as_completed(futures):
                finished(futures[fut], fut.result())
    out = BenchResult()
    for key in keys:
        if key in kept:
            out.records.append(kept[key])
            continue
        record, samples = new[key]
        out.records.append(record)
        if samples is not None:
            out.samples[(record["policy"], record["router"], record["rps"])] = samples
    return out


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
