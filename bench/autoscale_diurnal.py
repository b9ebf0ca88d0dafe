"""Goodput-driven vs queue-length autoscaling on one diurnal day of the Azure conversation trace.

Both scalers run the same decision function (slo_core.scaling.decide) with the same bounds,
stabilization windows, step limits and replica start-up time (from the profile); only the metric
differs. Each scaler's one knob is swept (the queue scaler's waiting requests per replica, the goodput
scaler's planned utilization of a replica's goodput capacity), since users tune them; every run is
reported, and the comparison is the cheapest run of each kind that meets every tier's target
(``--static`` adds a fixed fleet at max replicas). The scalers read the replicas' sidecar counters
through the operator's signal window (``slo_core.scaling.ScalingLoop``); admitted work is the
replicas' outstanding tokens, bounded as the deployed sidecar bounds them (``--analyzer qrf``: the
shipped QRF predictor; ``none`` leaves every request at its max_tokens). Writes JSON and a markdown
table under bench/results/autoscale/.

    nice -n 10 .venv/bin/python bench/autoscale_diurnal.py --peak-rps 30 --day-s 1200   # ~8 min here
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from slo_core.metrics.summary import job_outcomes
from slo_core.perf.profiles import load_profile
from slo_core.scaling import ScalingParams
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.autoscale import Autoscaler, capacity_tokens_per_s, startup_time_s
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads.diurnal import diurnal_jobs

TIERS = {
    "interactive": (
        0.4,
        SLOTargets(
            RequestKind.LATENCY, ttft_s=2.0, tbt_s=0.1, priority_class="interactive", priority_weight=3.0
        ),
    ),
    "standard": (0.4, SLOTargets(RequestKind.LATENCY, ttft_s=5.0, tbt_s=0.15, priority_class="standard")),
    "batch": (0.2, SLOTargets(RequestKind.DEADLINE, deadline_s=300.0, priority_class="batch")),
}
TARGETS = {"interactive": 0.95, "standard": 0.90, "batch": 0.90}


def run_one(label: str, jobs: list, args: argparse.Namespace, params: ScalingParams | None) -> dict:
    profile = load_profile(args.profile)
    n = args.max_replicas
    scaler = None
    if params is not None:
        scaler = Autoscaler(
            params=params,
            startup_s=startup_time_s(profile, args.profile),
            capacity_tokens_per_s=capacity_tokens_per_s(profile, tbt_s=0.1),
            tier_targets=TARGETS,
            period_s=args.period_s,
            gpus_per_replica=profile.tensor_parallel,
        )
    fleet = FleetSim(  # room for max replicas and as many draining (a scale-up never revives one)
        [ReplicaSpec(profile)] * (2 * n if scaler else n),
        args.engine_policy,
        args.router,
        seed=args.seed,
        config=SimConfig(drain="all", max_drain_s=600.0),
        autoscaler=scaler,
        analyzer=SimAnalyzer(patterns=False) if args.analyzer == "qrf" else None,
    )
    t0 = time.perf_counter()
    result = fleet.run(jobs)
    wall = time.perf_counter() - t0
    end_s = max(result.end_s, result.duration_s)
    gpu_h = scaler.gpu_hours(end_s) if scaler else n * profile.tensor_parallel * end_s / 3600.0
    per_tier: dict[str, dict[str, float]] = {}
    for o in job_outcomes(result):
        row = per_tier.setdefault(o.tier, {"n": 0, "met": 0})
        row["n"] += 1
        row["met"] += o.gains["request"] > 0
    attain = {t: row["met"] / row["n"] for t, row in sorted(per_tier.items())}
    meets = all(attain.get(t, 0.0) >= target for t, target in TARGETS.items())
    peak = max((e.ready + e.starting + e.draining for e in scaler.timeline), default=n) if scaler else n
    return {
        "label": label,
        "gpu_hours": round(gpu_h, 3),
        "attainment": {t: round(a, 4) for t, a in attain.items()},
        "meets_all_targets": meets,
        "peak_replicas": peak,
        "rejected": result.rejected_by_router,
        "sim_wall_s": round(wall, 1),
        "timeline": [(round(e.t_s), e.ready, e.starting, e.draining) for e in scaler.timeline]
        if scaler
        else [],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure-conv-2023")
    ap.add_argument("--profile", default="h100-llama3-8b-tp1")
    ap.add_argument("--peak-rps", type=float, default=12.0)
    ap.add_argument("--day-s", type=float, default=7200.0, help="one simulated day (compressed), seconds")
    ap.add_argument("--max-replicas", type=int, default=8)
    ap.add_argument("--min-replicas", type=int, default=1)
    ap.add_argument("--period-s", type=float, default=15.0)
    ap.add_argument("--engine-policy", default="sarathi")
    ap.add_argument("--router", default="min-load")
    ap.add_argument("--queue-targets", default="2,4,8")
    ap.add_argument("--utilizations", default="0.75,0.9", help="goodput scaler's planned utilization")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--analyzer", choices=["qrf", "none"], default="qrf", help="output-length bounds")
    ap.add_argument("--static", action="store_true", help="also run a static fleet at max replicas")
    ap.add_argument("--out", default="bench/results/autoscale")
    args = ap.parse_args()
    jobs = diurnal_jobs(args.trace, peak_rps=args.peak_rps, day_s=args.day_s, tiers=TIERS, seed=args.seed)
    base = {"min_replicas": args.min_replicas, "max_replicas": args.max_replicas}
    runs = [("static max", None)] if args.static else []
    for u in args.utilizations.split(","):
        runs.append(
            (f"goodput (utilization {u})", ScalingParams(**base, metric="goodput", utilization=float(u)))
        )
    for q in args.queue_targets.split(","):
        runs.append(
            (f"queue (target {q}/replica)", ScalingParams(**base, metric="queue", target_queue=float(q)))
        )
    rows = []
    for label, params in runs:
        row = run_one(label, jobs, args, params)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "timeline"}), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    setup = {k: v for k, v in vars(args).items() if k != "out"} | {"jobs": len(jobs), "targets": TARGETS}
    (out / "diurnal.json").write_text(json.dumps({"setup": setup, "runs": rows}, indent=1))
    lines = [
        f"# Autoscaling on a diurnal day ({args.trace}, {len(jobs)} requests, peak {args.peak_rps} req/s, "
        f"day {args.day_s:.0f} s, {args.profile}, analyzer {args.analyzer})",
        "",
        "| scaler | GPU-hours | "
        + " | ".join(f"{t} (target {v})" for t, v in TARGETS.items())
        + " | all met | peak replicas |",
        "|---|---|" + "---|" * len(TARGETS) + "---|---|",
    ]
    for r in rows:
        cells = " | ".join(f"{r['attainment'].get(t, 0.0):.3f}" for t in TARGETS)
        met = "yes" if r["meets_all_targets"] else "no"
        lines.append(f"| {r['label']} | {r['gpu_hours']:.2f} | {cells} | {met} | {r['peak_replicas']} |")
    (out / "diurnal.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
