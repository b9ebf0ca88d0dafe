"""Summarize a gmax_sweep run's cost from OUT/timing.jsonl: runs done, CPU and wall seconds, load.

    .venv/bin/python bench/sweep_timing.py bench/results/standard_sweep/issue15

Prints a markdown table of each finished run's CPU seconds by point and policy, the totals, the load
average seen, and the quiet-machine estimate (total CPU seconds / cores: every run is one process).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    events = [
        json.loads(line) for line in (args.out / "timing.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    runs = [e for e in events if e["event"] == "run"]
    starts = [e for e in events if e["event"] == "start"]
    ends = [e for e in events if e["event"] == "end"]
    loads = [e["load"][0] for e in events if "load" in e]
    by_point: dict[str, dict[str, float]] = defaultdict(dict)
    for e in runs:
        point = f"{e['file'].removeprefix('records-').rsplit('-', 1)[0]} @ {e['rps']:g} req/s"
        label = e["policy"] + ("" if len(e["objectives"]) > 1 else f" ({e['objectives'][0]})")
        by_point[point][label] = e["cpu_s"]
    cpu = sum(e["cpu_s"] for e in runs)
    # an invocation still going (or killed) has no end line: count it up to its last run
    wall = sum(e["wall_s"] for e in ends)
    if len(ends) < len(starts):  # up to the last record written
        wall += (args.out / "timing.jsonl").stat().st_mtime - starts[-1]["at"]
    # each invocation's grid (a resumed one repeats its grid; the others may cover other points)
    grids = ", ".join(str(e["runs_total"]) for e in starts)
    cores = os.cpu_count() or 1
    print(f"runs finished {len(runs)} (invocations' grids: {grids}); CPU of the finished runs {cpu:.0f} s;")
    load_range = f"{min(loads):.1f}–{max(loads):.1f}"
    print(f"wall of the invocations {wall:.0f} s; 1-min load average {load_range} on {cores} cores;")
    print(f"quiet-machine estimate of the finished runs: {cpu / cores:.0f} s (CPU / {cores} cores)")
    print()
    for point, costs in by_point.items():
        print(f"| {point} | CPU s |")
        print("|---|---:|")
        for label, c in sorted(costs.items(), key=lambda kv: -kv[1]):
            print(f"| {label} | {c:.1f} |")
        print(f"| **all {len(costs)} runs** | **{sum(costs.values()):.0f}** |")
        print()


if __name__ == "__main__":
    main()
