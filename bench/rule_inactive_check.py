"""Where the deep-queue rule never acts, GMAX's records are GMAX-at-every-event's: a check of a sweep.

    PYTHONPATH=core:lab .venv/bin/python bench/rule_inactive_check.py \\
        --sweep bench/results/standard_sweep/issue20_deep_default_300s \\
        --cells conv:2:10.25,conv:4:20.5,sharegpt:2:13,sharegpt:4:26 --seeds 1,2 \\
        --out bench/results/standard_sweep/issue20_deep_default_300s/rule_inactive_check.md

Runs ``gmax-every-event`` (GMAX with ``deep_queue_from`` 0, ``bench/event_decisions.py``) at each
``family:replicas:req/s`` cell, seed and objective, and compares every field of its record with the
``gmax`` record the sweep folder holds for the same run (the policy's name and the run's timings
aside). Equal records mean no queue there reached ``deep_queue_from`` in GMAX's run, so the rule
changed nothing; a difference names the fields that moved.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

import event_decisions  # noqa: F401  (registers gmax-every-event, here and in workers)
import gmax_sweep  # bench/ is the script's own folder, first on sys.path

from slo_core.bench.parallel import process_pool
from slo_core.bench.runner import run_one_timed

_IGNORED = ("policy", "wall_s")  # a record carries its wall time; its CPU time goes to timing.jsonl


def _one(task: gmax_sweep.Task) -> dict[str, Any]:
    """``task``'s record, as the sweep would have stored it."""
    record, _ = run_one_timed(task.config(), (task.policy, task.router, task.rps))
    return gmax_sweep.as_stored(record, task)


def moved(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The fields whose values differ between two records (the ignored ones aside)."""
    keys = (set(a) | set(b)) - set(_IGNORED)
    return sorted(k for k in keys if a.get(k) != b.get(k))


def swept(folder: Path, task: gmax_sweep.Task, policy: str) -> dict[str, Any]:
    """``policy``'s record for ``task``'s run in a sweep folder."""
    (objective,) = task.objectives
    path = folder / f"records-{task.family}-r{task.replicas}-s{task.seed}-{objective}.json"
    for r in json.loads(path.read_text(encoding="utf-8")):
        if r["policy"] == policy and float(r["rps"]) == task.rps and "error" not in r:
            return dict(r)
    raise LookupError(f"{path}: no {policy} record at {task.rps:g} req/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", type=Path, required=True)
    ap.add_argument("--cells", required=True, help="family:replicas:req/s, comma-separated")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--objectives", default="request,token")
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    tasks = [
        gmax_sweep.Task(
            fam, int(rep), int(seed), float(rps), "gmax-every-event", (obj,), args.duration, "round-robin"
        )
        for fam, rep, rps in (c.split(":") for c in args.cells.split(","))
        for seed in args.seeds.split(",")
        for obj in args.objectives.split(",")
    ]
    rows = []
    with process_pool(args.workers) as pool:
        futures = {pool.submit(_one, t): t for t in tasks}
        for fut in as_completed(futures):
            t = futures[fut]
            diff = moved(fut.result(), swept(args.sweep, t, "gmax"))
            rows.append((t.family, t.replicas, t.rps, t.seed, t.objectives[0], diff))
            print(rows[-1][:5], "equal" if not diff else f"moved: {', '.join(diff[:6])}", flush=True)
    lines = [
        f"# GMAX at every event against the sweep's GMAX (`{args.sweep.name}`)",
        "",
        "Every field of the two records compared (the policy's name and timings aside).",
        "",
        "| family | replicas | req/s | seed | objective | records |",
        "|---|---:|---:|---:|---|---|",
    ]
    for fam, rep, rps, seed, obj, diff in sorted(rows):
        lines.append(
            f"| {fam} | {rep} | {rps:g} | {seed} | {obj} | "
            f"{'equal' if not diff else 'differ: ' + ', '.join(diff[:8])} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
