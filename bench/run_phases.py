"""Where one sweep run's CPU goes by phase: while requests still arrive, and the drain after the last
arrival (no arrivals, the deepest queues), with the garbage collector's share.

    PYTHONPATH=core:lab .venv/bin/python bench/run_phases.py gmax,tempo --family tot --replicas 4 \\
        --rps 26 --duration 120 --out bench/results/sim_speed/run_phases_tot_r4_overload_120s.md

Each policy runs one ``gmax_sweep`` task in this process, one after the other. The drain starts at
the first engine step with no arrival left; the run ends when nothing is left to do or, with the
default ``drain="slo"``, once no delivery could earn SLO gain any more. The garbage collector's time
is the process time between its start and stop callbacks. A phase's CPU seconds move with this
host's noise (~15–25 % between runs): read the shares.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import gmax_sweep  # bench/ is the script's own folder, first on sys.path

from slo_core.bench.runner import run_one_timed
from slo_core.sim import fleet as fleet_module


class _Phases:
    """Patches FleetSim for one run and collects its phases (restored by :meth:`close`)."""

    def __init__(self) -> None:
        self.at: dict[str, Any] = {}
        self.gc_s = 0.0
        self.collections = [0, 0, 0]
        self.collected = 0  # objects the collector found unreachable (cyclic garbage)
        self._gc_start = 0.0
        self._step = fleet_module.FleetSim._step
        self._run = fleet_module.FleetSim.run
        phases = self

        def step(sim: Any, engine: Any, t: float, next_job: float) -> None:
            if next_job == math.inf and "drain_cpu_s" not in phases.at:
                phases.mark(sim, t)
            phases._step(sim, engine, t, next_job)

        def run(sim: Any, jobs: Any, progress: Any = None) -> Any:
            start = time.process_time()
            result = phases._run(sim, jobs, progress)
            end = time.process_time()
            at = phases.at
            at["cpu_s"] = end - start
            at["drain_from_cpu_s"] = at.pop("drain_cpu_s", end) - start
            at["end_s"] = result.end_s
            at["last_arrival_s"] = result.duration_s
            at["decisions"] = sum(int(s["decisions"]) for s in result.replica_stats)
            at["unfinished"] = sum(1 for r in result.requests if r.finish_s is None)
            return result

        fleet_module.FleetSim._step = step  # type: ignore[method-assign]
        fleet_module.FleetSim.run = run  # type: ignore[method-assign]
        gc.callbacks.append(self._on_gc)

    def mark(self, sim: Any, t: float) -> None:
        self.at["drain_cpu_s"] = time.process_time()
        self.at["waiting_at_drain"] = sum(len(e.waiting) for e in sim.engines)
        self.at["running_at_drain"] = sum(len(e.running) for e in sim.engines)
        self.at["decisions_at_drain"] = sum(e.decisions for e in sim.engines)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.process_time()
        else:
            self.gc_s += time.process_time() - self._gc_start
            self.collections[info["generation"]] += 1
            self.collected += info["collected"]

    def close(self) -> None:
        fleet_module.FleetSim._step = self._step  # type: ignore[method-assign]
        fleet_module.FleetSim.run = self._run  # type: ignore[method-assign]
        gc.callbacks.remove(self._on_gc)


def record_digest(record: dict[str, Any]) -> str:
    """The record (or summary) without its wall time, hashed: equal digests, equal runs."""
    kept = {k: v for k, v in record.items() if k != "wall_s"}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]


def phases(task: Any, collector: str = "young") -> dict[str, Any]:
    """Run ``task`` (a gmax_sweep Task) once and return its phases. ``collector``: "young" runs the
    simulation as shipped (slo_core.sim.collector: young collections only), "default" with CPython's
    thresholds throughout."""
    p = _Phases()
    paused = fleet_module.young_collections_only
    if collector == "default":
        fleet_module.young_collections_only = contextlib.nullcontext  # type: ignore[assignment]
    try:
        record, _ = run_one_timed(task.config(), (task.policy, task.router, task.rps))
    finally:
        fleet_module.young_collections_only = paused  # type: ignore[assignment]
        p.close()
    at = p.at
    drain = at["cpu_s"] - at["drain_from_cpu_s"]
    return {
        "policy": task.policy,
        "collector": collector,
        "record": record_digest(record),
        # what the run did, whichever policy's name it ran under
        "outcome": record_digest(
            {k: v for k, v in record.items() if k not in ("policy", "sweep_fingerprint")}
        ),
        "cpu_s": at["cpu_s"],
        "drain_cpu_s": drain,
        "drain_share": drain / at["cpu_s"] if at["cpu_s"] > 0 else 0.0,
        "last_arrival_s": at["last_arrival_s"],
        "end_s": at["end_s"],
        "waiting_at_drain": at.get("waiting_at_drain", 0),
        "running_at_drain": at.get("running_at_drain", 0),
        "decisions": at["decisions"],
        "drain_decisions": at["decisions"] - at.get("decisions_at_drain", at["decisions"]),
        "unfinished": at["unfinished"],
        "gc_s": p.gc_s,
        "gc_share": p.gc_s / at["cpu_s"] if at["cpu_s"] > 0 else 0.0,
        "collections": tuple(p.collections),
        "collected": p.collected,
        "goodput_token_ratio": record.get("goodput_token_ratio"),
        "goodput_request_ratio": record.get("goodput_request_ratio"),
        "attainment": record.get("attainment"),
        "latency_attainment": gmax_sweep.latency_attainment(record),
    }


def table(rows: list[dict[str, Any]], title: str) -> str:
    lines = [
        f"# {title}",
        "",
        "| policy | collector | record | CPU s | drain CPU s | drain share | last arrival s | end s "
        "| queued at drain (waiting + running) | decisions | in the drain | unfinished | GC s | GC share "
        "| collections (gen 0/1/2) | objects collected |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['collector']} | {r['record']} "
            f"| {r['cpu_s']:.1f} | {r['drain_cpu_s']:.1f} | {r['drain_share']:.0%} "
            f"| {r['last_arrival_s']:.1f} | {r['end_s']:.1f} "
            f"| {r['waiting_at_drain']} + {r['running_at_drain']} "
            f"| {r['decisions']} | {r['drain_decisions']} | {r['unfinished']} | {r['gc_s']:.2f} "
            f"| {r['gc_share']:.1%} | {'/'.join(map(str, r['collections']))} | {r['collected']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policies", help="comma-separated engine policies")
    gmax_sweep.add_task_arguments(ap, duration_s=120.0)
    ap.add_argument(
        "--collector",
        choices=("young", "default", "both"),
        default="young",
        help="the garbage collector as shipped (young collections only during a run), CPython's "
        "default thresholds, or both (each policy run both ways, in alternating order; the records "
        "must be equal)",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for policy in args.policies.split(","):
        task = gmax_sweep.task_of(args, policy)
        modes = [args.collector] if args.collector != "both" else ["default", "young"]
        if len(rows) // len(modes) % 2:  # alternate which way goes first
            modes.reverse()
        pair = []
        for mode in modes:
            pair.append(phases(task, mode))
            print(pair[-1], flush=True)
        if len({r["record"] for r in pair}) != 1:
            raise SystemExit(f"{policy}: the records differ between collector settings")
        rows.extend(pair)
    text = table(
        rows,
        f"Run phases: {args.family} x{args.replicas}, {args.rps:g} req/s, {args.duration:g} s, "
        f"seed {args.seed}, {args.objective}, collector {args.collector}",
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
