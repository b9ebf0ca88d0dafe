"""In-process A/B of GMAX's running snapshots: live (``SimEngine(live_running=True)``) against one
RequestView per running request per decision.

    PYTHONPATH=core:lab .venv/bin/python bench/ab_live_running.py --duration 90 \\
        --out bench/results/sim_speed/ab_live_running.md

One gmax_sweep task (GMAX, ToT x4 at the overload point by default) run with live snapshots. At every
decision GMAX's table builds its columns from the live running requests, and a second table (its
twin, fed the same waiting snapshots) builds them from a fresh snapshot of each running request, the
way the engine passed them before; the two are timed on the process clock in alternating order and
their columns compared (they must be equal). What the A/B times is all that ``live_running``
replaces: the snapshots of the running requests and the table's reading of them.

``--whole-runs N`` also times N whole runs of the task each way, alternating (the host's noise moves
one run's CPU seconds by up to ~1.4x between invocations: read the minimum and the median).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

import gmax_sweep  # bench/ is the script's own folder, first on sys.path
import numpy as np

from slo_core.bench.runner import run_one_timed
from slo_core.policies.base import RequestView
from slo_core.policies.gmax_snapshot import Columns, SnapshotTable
from slo_core.sim import engine as engine_module
from slo_core.sim.views import LiveViews, request_views


def same_columns(a: Columns, b: Columns) -> bool:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
                return False
        elif x != y:
            return False
    return True


def decision_ab(task: gmax_sweep.Task, policy: str, rps: float) -> dict[str, Any]:
    """Time live against snapshot-built columns at every decision of one run (see the docstring)."""
    original = SnapshotTable.columns
    twins: dict[int, SnapshotTable] = {}
    spent = {"live": 0.0, "snapshots": 0.0}
    calls = [0]
    rows = [0]
    clock = time.process_time

    def columns(
        self: SnapshotTable, waiting: Sequence[RequestView], running: Sequence[RequestView]
    ) -> Columns:
        twin = twins.setdefault(id(self), SnapshotTable())
        if not isinstance(running, LiveViews):  # a small snapshot (GMAX passes a list), a later read
            # the twin sees it too: tenant and program codes are numbered in the order first seen
            original(twin, waiting, running)
            return original(self, waiting, running)
        requests = running._live()
        calls[0] += 1
        rows[0] += len(requests)

        def live() -> Columns:
            t = clock()
            out = original(self, waiting, running)
            spent["live"] += clock() - t
            return out

        def built() -> Columns:
            t = clock()
            out = original(twin, waiting, request_views(requests))
            spent["snapshots"] += clock() - t
            return out

        if calls[0] % 2:
            a, b = live(), built()
        else:
            b, a = built(), live()
        if not same_columns(a, b):
            sys.exit(f"the columns differ at decision {calls[0]}")
        return a

    SnapshotTable.columns = columns  # type: ignore[method-assign]
    try:
        _, cpu = run_one_timed(task.config(), (policy, "round-robin", rps))
    finally:
        SnapshotTable.columns = original  # type: ignore[method-assign]
    return {"cpu": cpu, "calls": calls[0], "rows": rows[0], **spent}


def whole_run(task: gmax_sweep.Task, policy: str, rps: float, *, live: bool) -> tuple[float, dict[str, Any]]:
    original = engine_module.SimEngine.__init__

    def init(self: engine_module.SimEngine, *a: Any, **k: Any) -> None:
        original(self, *a, **{**k, "live_running": live and k.get("live_running", False)})

    engine_module.SimEngine.__init__ = init  # type: ignore[method-assign]
    try:
        record, cpu = run_one_timed(task.config(), (policy, "round-robin", rps))
    finally:
        engine_module.SimEngine.__init__ = original  # type: ignore[method-assign]
    return cpu, {k: v for k, v in record.items() if "cpu" not in k and "wall" not in k}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="gmax")
    ap.add_argument("--family", default="tot", choices=sorted(gmax_sweep.FAMILIES))
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--rps", type=float, default=26.0, help="total requests/s")
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--objective", default="token")
    ap.add_argument("--whole-runs", type=int, default=0, help="also time this many whole runs each way")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    task = gmax_sweep.Task(
        args.family, args.replicas, 0, args.rps, args.policy, (args.objective,), args.duration, "round-robin"
    )
    ab = decision_ab(task, args.policy, args.rps)
    n = max(1, ab["calls"])
    per_row = max(1, ab["rows"])
    text = (
        f"{args.policy} ({args.objective}), {args.family} x{args.replicas}, {args.rps:g} req/s, "
        f"{args.duration:g} s window, seed 0: {ab['calls']} decisions through the table, "
        f"{ab['rows'] / n:.0f} running requests a decision on average, {ab['cpu']:.1f} CPU s for the "
        "whole run (both ways included)\n\n"
        "| running requests passed as | CPU s in all | us a decision | ns a running request |\n"
        "|---|---:|---:|---:|\n"
        + "".join(
            f"| {name} | {ab[name]:.2f} | {ab[name] / n * 1e6:.0f} | {ab[name] / per_row * 1e9:.0f} |\n"
            for name in ("snapshots", "live")
        )
        + "\nThe same columns both ways at every decision (checked).\n"
    )
    if args.whole_runs:
        cpu: dict[bool, list[float]] = {True: [], False: []}
        records: dict[bool, dict[str, Any]] = {}
        for _ in range(args.whole_runs):
            for live in (False, True):
                seconds, record = whole_run(task, args.policy, args.rps, live=live)
                cpu[live].append(seconds)
                if records.setdefault(live, record) != record:
                    sys.exit("a run's record changed between repetitions")
        if records[True] != records[False]:
            sys.exit("live snapshots changed the run's record")
        text += (
            f"\nWhole runs, alternating, {args.whole_runs} each way (records identical):\n\n"
            "| running requests passed as | CPU s of each run | min | median |\n|---|---|---:|---:|\n"
            + "".join(
                f"| {name} | {', '.join(f'{s:.1f}' for s in cpu[live])} | {min(cpu[live]):.1f} | "
                f"{median(cpu[live]):.1f} |\n"
                for name, live in (("snapshots", False), ("live", True))
            )
        )
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
