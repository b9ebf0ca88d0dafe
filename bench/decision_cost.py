"""What GMAX's decisions cost a pod's goodput over a deep queue when their CPU time is charged to the
engine's steps, and whether the engines' deep-queue rule then pays.

In a pod the vLLM plugin decides on the engine's step loop (vLLM's synchronous scheduler), between two
GPU steps, so a decision's CPU time delays the next step: 0.6 ms over 20 queued requests, 2.7 ms
over 1,000 and 10.1 ms over 5,000 on this host (``bench/results/plugin_decision_cost_shapes.md``),
against GPU steps of ~20–40 ms. The simulator takes decisions for free unless given a ``DecisionCost``
(``slo_core.sim.engine_types``). This bench runs ``gmax-every-event`` (GMAX deciding at every arrival
and finish whatever the queue's depth, as it shipped before) and GMAX (the engines' deep-queue rule on by
default: events every 10 steps while 512 or more wait, a latency arrival at once;
``bench/event_decisions.py``) on the same sweep tasks with decisions free and charged, and tabulates
each run's goodput and what it was charged, against the first policy listed.

    PYTHONPATH=core:lab .venv/bin/python bench/decision_cost.py --seeds 0,1,2 --objectives token,request \\
        --out bench/results/sim_speed/decision_cost_fitted/tot_r4_overload_300s.md

The default cost is the least-squares line through ``plugin_decision_cost_shapes.md``'s nine rows
(GMAX in the plugin on this host's CPU, 20 to 5,000 queued: a base of 0.67 ms and 1.89 µs a request
read, every row within 18 %). The first tables (``decision_cost_tot_r4_overload_300s.md``) charged
2.70 ms + 1.86 µs, the line through two deep rows alone, which put shallow decisions at four times
their cost. A GPU host's CPU is likely faster, so ``--base-ms`` and ``--per-request-us`` set another.
A probe, not a policy: nothing here replaces a committed record.
"""

from __future__ import annotations

import argparse
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

import event_decisions  # noqa: F401  (registers its probes in the registry, here and in workers)
import gmax_sweep  # bench/ is the script's own folder, first on sys.path

from slo_core.bench.parallel import process_pool
from slo_core.bench.runner import run_one_timed
from slo_core.sim.engine_types import DecisionCost


def one(task: gmax_sweep.Task, cost: DecisionCost | None) -> dict[str, Any]:
    """One sweep task, decisions charged ``cost`` (None: free): its goodput and CPU seconds."""
    record, cpu_s = run_one_timed(task.config(), (task.policy, task.router, task.rps), decision_cost=cost)
    if "error" in record:
        raise SystemExit(f"{task.policy} seed {task.seed}: {record['error']}")
    objective = task.objectives[0]
    return {
        "seed": task.seed,
        "objective": objective,
        "policy": task.policy,
        "charged": cost is not None,
        "goodput": record[f"goodput_{objective}_ratio"],
        "cpu_s": cpu_s,
    }


def table(rows: list[dict[str, Any]], args: argparse.Namespace, cost: DecisionCost) -> str:
    """Goodput free and charged per seed, objective and policy, and each one's change; ``− base``
    against the first of ``args.policies`` charged alike."""
    base = args.policies.split(",")[0]
    by = {(r["seed"], r["objective"], r["policy"], r["charged"]): r for r in rows}
    lines = [
        f"# GMAX's decisions charged to the engine's steps: {args.family} x{args.replicas}, "
        f"{args.rps:g} req/s, {args.duration:g} s",
        "",
        f"Decision cost: {cost.base_s * 1e3:.2f} ms + {cost.per_request_s * 1e6:.2f} µs a request read "
        "(waiting and running). Goodput: the objective's ratio (goodput over the instant-service gain of "
        f"the same jobs). `− base`: against `{base}` with the same charge, in points.",
        "",
        "| seed | objective | policy | goodput, free | goodput, charged | charged − free (points) "
        "| − base, charged (points) | CPU s free / charged |",
        "|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for (seed, objective, policy, charged), r in sorted(by.items()):
        if charged:
            continue
        c = by.get((seed, objective, policy, True))
        g = by.get((seed, objective, base, True))
        if c is None:
            continue
        vs = "" if g is None or policy == base else f"{(c['goodput'] - g['goodput']) * 100:+.2f}"
        lines.append(
            f"| {seed} | {objective} | {policy} | {r['goodput']:.4f} | {c['goodput']:.4f} "
            f"| {(c['goodput'] - r['goodput']) * 100:+.2f} | {vs} | {r['cpu_s']:.0f} / {c['cpu_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="tot")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--rps", type=float, default=26.0)
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--objectives", default="token,request")
    ap.add_argument(
        "--policies", default="gmax-every-event,gmax", help="comma-separated; the first is the base"
    )
    ap.add_argument("--router", default="round-robin")
    ap.add_argument("--base-ms", type=float, default=0.67)
    ap.add_argument("--per-request-us", type=float, default=1.89)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cost = DecisionCost(base_s=args.base_ms / 1e3, per_request_s=args.per_request_us / 1e6)
    tasks = [
        gmax_sweep.Task(
            args.family, args.replicas, seed, args.rps, policy, (objective,), args.duration, args.router
        )
        for seed in (int(s) for s in args.seeds.split(","))
        for objective in args.objectives.split(",")
        for policy in args.policies.split(",")
    ]
    jobs = [(t, c) for c in (cost, None) for t in tasks]  # the charged runs first
    rows = []
    with process_pool(args.workers) as pool:
        futures = [pool.submit(one, t, c) for t, c in jobs]
        for fut in as_completed(futures):
            rows.append(fut.result())
            print(
                {k: rows[-1][k] for k in ("seed", "objective", "policy", "charged", "goodput", "cpu_s")},
                flush=True,
            )
    text = table(rows, args, cost)
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
