"""Compare the records two gmax_sweep folders hold for the same runs (a policy change's effect).

    .venv/bin/python bench/sweep_compare.py OLD NEW [--out FILE]

For every record in NEW (policy, family, replicas, load, objective, seed) with a match in OLD, prints
the objective's goodput ratio before and after, paired by seed, and per point the mean of each and the
mean paired difference with its standard error: a change that only perturbs a policy leaves
differences of both signs, within a few standard errors of zero.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

_FILE = re.compile(r"records-(?P<family>\w+)-r(?P<replicas>\d+)-s(?P<seed>\d+)-(?P<objective>\w+)\.json")


def records(folder: Path) -> dict[tuple[Any, ...], float]:
    """(policy, family, replicas, req/s, objective, seed) -> the objective's goodput ratio."""
    out: dict[tuple[Any, ...], float] = {}
    for path in sorted(folder.glob("records-*.json")):
        m = _FILE.fullmatch(path.name)
        if m is None:
            continue
        objective = m["objective"]
        for r in json.loads(path.read_text(encoding="utf-8")):
            if "error" in r:
                continue
            key = (r["policy"], m["family"], int(m["replicas"]), float(r["rps"]), objective, int(m["seed"]))
            out[key] = float(r[f"goodput_{objective}_ratio"])
    return out


def compare(old: dict[tuple[Any, ...], float], new: dict[tuple[Any, ...], float]) -> list[str]:
    points: dict[tuple[Any, ...], list[tuple[int, float, float]]] = defaultdict(list)
    for key, value in new.items():
        if key in old:
            points[key[:5]].append((key[5], old[key], value))
    lines = [
        "| policy | family | replicas | req/s | objective | seeds | old mean | new mean | new - old | ± s.e. "
        "| per seed (old → new) |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for (policy, family, replicas, rps, objective), rows in sorted(points.items()):
        rows.sort()
        diffs = [n - o for _, o, n in rows]
        k = len(rows)
        mean_d = sum(diffs) / k
        se = math.sqrt(sum((d - mean_d) ** 2 for d in diffs) / (k - 1) / k) if k > 1 else float("nan")
        seeds = " / ".join(f"{o:.4f} → {n:.4f}" for _, o, n in rows)
        lines.append(
            f"| {policy} | {family} | {replicas} | {rps:g} | {objective} | {k} | "
            f"{sum(o for _, o, _ in rows) / k:.4f} | {sum(n for _, _, n in rows) / k:.4f} | {mean_d:+.4f} | "
            f"{se:.4f} | {seeds} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()
    lines = compare(records(args.old), records(args.new))
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
