"""Side-by-side comparison of every engine policy and router on the simulator (issue 5).

    .venv/bin/python bench/compare/run.py                      # every scenario, one worker per core
    .venv/bin/python bench/compare/run.py --scenarios conv,code --workers 2

Writes ``<out>/records.json`` (one record per run or capacity search, every paper's metric), then the
tables and plots (bench/compare/report.py). Runs are deterministic (seeded workloads and policies), so
the worker count changes only the wall time (tests/unit/test_compare_parallel.py); records are saved after
every run and runs already recorded are skipped, so an interrupted comparison resumes where it stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
import traceback
from multiprocessing import Pool
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios import BURST_START_S, PROFILE, SCENARIOS, CapacitySearch, Run, capacity_searches, runs

from slo_core.bench.parallel import die_with_parent
from slo_core.metrics import job_outcomes, summarize
from slo_core.metrics.capacity import serving_capacity
from slo_core.perf import load_profile
from slo_core.predict import OutputBoundEstimator, load_estimator
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.workloads import WorkloadSpec, build_workload
from slo_core.workloads.burst import BurstSpec, burst_workload

GOODPUTS = ("token", "request", "tempo", "tdg")


@functools.lru_cache(maxsize=1)
def _estimator() -> OutputBoundEstimator:
    return load_estimator()


def _compact(m: dict[str, Any], over_time: bool) -> dict[str, Any]:
    """The metrics the tables use: every paper's goodput ratio, attainment overall/by kind/by class."""
    keep = [f"goodput_{g}_ratio" for g in GOODPUTS] + [f"goodput_{g}_per_s" for g in GOODPUTS]
    keep += ["attainment", "jobs", "completed", "rejected", "ttft_p95_s", "tbt_p95_s", "e2e_p95_s"]
    keep += ["throughput_tokens_per_s", "preemptions_engine", "rejected_by_router", "sim_end_s", "wall_s"]
    out = {k: m.get(k) for k in keep}
    for group in ("by_kind", "by_priority"):
        out[group] = {
            g: {k: v.get(k) for k in ("attainment", "goodput_token_ratio", "goodput_tdg_ratio", "jobs")}
            for g, v in m[group].items()
        }
    if over_time:
        out["goodput_over_time"] = m["goodput_over_time"]
    return out


ANALYZER = {"mode": "qrf"}  # set by --analyzer before the workers start (they inherit it)


def _simulate(spec: WorkloadSpec, policy: str, router: str, replicas: int, burst: bool) -> dict[str, Any]:
    jobs = burst_workload(spec, BurstSpec(start_s=BURST_START_S)) if burst else build_workload(spec)
    profile = load_profile(PROFILE)
    # a fresh analyzer per run (as slofleet bench does): QRF bounds refined as tokens stream, pattern
    # history learned within the run; "none": requests carry no bound (policies fall back to max_tokens)
    analyzer = SimAnalyzer(_estimator()) if ANALYZER["mode"] == "qrf" else None
    specs = [ReplicaSpec(profile) for _ in range(replicas)]
    sim = FleetSim(specs, policy, router, seed=spec.seed, analyzer=analyzer)
    result = sim.run(jobs)
    metrics = summarize(result, bucket_s=10.0 if burst else 60.0, jobs=job_outcomes(result))
    return _compact(metrics, over_time=burst)


def _head(task: Run | CapacitySearch) -> dict[str, Any]:
    w = task.workload
    head: dict[str, Any] = {
        "scenario": task.scenario,
        "policy": task.policy,
        "trace": w.trace,
        "mix": list(w.mix),
        "duration_s": w.duration_s,
        "seed": w.seed,
        "high_share": w.high_share,
        "high_weight": w.high_weight,
        "analyzer": ANALYZER["mode"],
    }
    if isinstance(task, Run):
        head.update(router=task.router, replicas=task.replicas, rps=w.rps, burst=task.burst)
    else:
        head.update(router="round-robin", replicas=1, lo_rps=task.lo_rps, hi_rps=task.hi_rps)
    return head


def execute(task: Run | CapacitySearch) -> dict[str, Any]:
    """Run one task in a worker; a failure is recorded with its error, never raised."""
    head = _head(task)
    started = time.perf_counter()
    try:
        if isinstance(task, Run):
            head.update(_simulate(task.workload, task.policy, task.router, task.replicas, task.burst))
        else:
            probes: list[dict[str, Any]] = []

            def attainment_at(rate: float) -> float:
                if rate in task.known:
                    probes.append({"rps": rate, "attainment": task.known[rate], "reused": True})
                    return task.known[rate]
                m = _simulate(
                    task.workload.model_copy(update={"rps": rate}), task.policy, "round-robin", 1, False
                )
                probes.append({"rps": rate, **{k: m[k] for k in ("attainment", "goodput_token_ratio")}})
                return float(m["attainment"] or 0.0)

            cap = serving_capacity(attainment_at, task.lo_rps, task.hi_rps, iterations=task.iterations)
            head.update(
                capacity_rps=cap.capacity_rps, censored=cap.censored, target=cap.target, probes=probes
            )
    except Exception as exc:  # a broken policy is a finding, not a crash of the comparison
        head["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    head["task_wall_s"] = round(time.perf_counter() - started, 2)
    return head


def _cost(task: Run | CapacitySearch) -> float:
    """Rough relative cost, to start the longest tasks first."""
    if isinstance(task, CapacitySearch):
        return 4000.0
    rate = (task.workload.rps or 1.0) * task.workload.duration_s
    return rate * (2.0 if task.policy not in ("fcfs", "sarathi") else 0.1)


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (
        r["scenario"],
        r["policy"],
        r["router"],
        r["replicas"],
        r.get("rps"),
        r["duration_s"],
        r.get("analyzer", "none"),
    )


def _save(records: list[dict[str, Any]], path: Path) -> None:
    records.sort(key=lambda r: (r["scenario"], r["replicas"], r.get("rps") or 0, r["router"], r["policy"]))
    path.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")


def _run_pool(tasks: list[Any], workers: int, records: list[dict[str, Any]], path: Path) -> None:
    """Run ``tasks``, saving the records after each one (an interrupted comparison resumes).

    A progress bar on stderr shows the tasks done and tqdm's estimate of the time left.
    """
    if not tasks:
        return
    from tqdm import tqdm

    tasks.sort(key=_cost, reverse=True)
    bar = tqdm(total=len(tasks), unit="run", file=sys.stderr, dynamic_ncols=True)
    bar.set_description_str(f"{tasks[0].scenario}", refresh=False)
    try:
        # Pool's exit terminates its workers; die_with_parent also ends them if this process is killed
        with Pool(max(1, min(workers, len(tasks))), initializer=die_with_parent) as pool:
            for rec in pool.imap_unordered(execute, tasks):
                records.append(rec)
                _save(records, path)
                status = rec.get("error", "")[:80] or f"{rec['task_wall_s']:.0f}s"
                bar.write(
                    f"{rec['scenario']} {rec['policy']}/{rec['router']} x{rec['replicas']} "
                    f"{rec.get('rps')}: {status}",
                    file=sys.stderr,
                )
                bar.set_description_str(rec["scenario"], refresh=False)
                bar.update(1)
    finally:
        bar.close()


def _with_known(task: CapacitySearch, records: list[dict[str, Any]]) -> CapacitySearch:
    """Attach the attainments the sweeps already measured on exactly this workload and policy."""
    sweep = task.scenario.removeprefix("capacity-")
    w = task.workload
    known = {
        float(r["rps"]): float(r["attainment"])
        for r in records
        if r["scenario"] == sweep
        and r["policy"] == task.policy
        and r["replicas"] == 1
        and r["router"] == "round-robin"
        and r["duration_s"] == w.duration_s
        and r["trace"] == w.trace
        and r["mix"] == list(w.mix)
        and r.get("analyzer", "none") == ANALYZER["mode"]
        and "error" not in r
    }
    return dataclasses.replace(task, known=known)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    ap.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help=f"parallel simulations (default: every core, {os.cpu_count() or 1} here)",
    )
    ap.add_argument("--out", default="bench/results/compare", help="output folder")
    ap.add_argument(
        "--analyzer",
        choices=("qrf", "none"),
        default="qrf",
        help="qrf: requests carry the sidecar analyzer's bounds and learned sub-deadlines (default)",
    )
    ap.add_argument("--fresh", action="store_true", help="rerun runs already in records.json")
    ap.add_argument("--report-only", action="store_true", help="rewrite tables and plots from records.json")
    args = ap.parse_args(argv)
    names = tuple(n.strip() for n in args.scenarios.split(",") if n.strip())
    bad = [n for n in names if n not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenarios {bad}; choose from {', '.join(SCENARIOS)}")
    ANALYZER["mode"] = args.analyzer
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "records.json"
    old: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    if args.report_only:
        from report import write_report

        write_report(old, out)
        return 0
    # runs already recorded without error are kept (results are deterministic); --fresh reruns them
    done = {} if args.fresh else {_key(r): r for r in old if "error" not in r and "capacity_rps" not in r}
    todo = [t for t in runs(names) if _key(_head(t)) not in done]
    keep = [r for r in old if _key(r) not in {_key(_head(t)) for t in todo}]
    keep = [
        r
        for r in keep
        if not ("capacity_rps" in r and "capacity" in names and r.get("analyzer", "none") == args.analyzer)
    ]
    records = list(keep)
    started = time.perf_counter()
    _run_pool(list(todo), args.workers, records, path)
    caps = [_with_known(t, records) for t in capacity_searches(names)]
    _run_pool(list(caps), args.workers, records, path)
    total = time.perf_counter() - started
    _save(records, path)
    print(
        f"{len(todo) + len(caps)} tasks in {total:.0f} s with {args.workers} workers -> {path}",
        file=sys.stderr,
    )
    from report import write_report

    write_report(records, out)
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
