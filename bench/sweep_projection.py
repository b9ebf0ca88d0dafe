"""What a full scheduler sweep costs now: one seed of every run measured, re-timed runs put in place.

    .venv/bin/python bench/sweep_projection.py --base bench/results/standard_sweep/issue20_seed0_30th \\
        --override bench/results/standard_sweep/issue20_seed0_30th/tempo_table \\
        --override bench/results/standard_sweep/issue20_deep_default_300s --seeds 0,1,2

``--base`` is a ``gmax_sweep.py run`` folder holding every run of the sweep at one seed (its
``timing.jsonl``). Each ``--override`` folder holds runs made since on other code (a policy made
cheaper, a default changed); a run found there replaces the base's run of the same point, policy and
objectives, the last folder listed winning. For every seed asked, a run is taken from an override at
that seed when one was made, else from the base's seed (a seed not measured is assumed to cost what
the base's seed does). Prints the CPU seconds by policy, how much of the total was measured at its
own seed, and the wall time on ``--cores`` cores of an otherwise quiet machine (CPU / cores: every run
is one process, and a sweep keeps every core busy until its last few runs).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

_FILE = re.compile(r"records-(?P<point>\w+-r\d+)-s(?P<seed>\d+)-\w+\.json")

# (family-rN, seed, policy, rps, objectives) -> CPU seconds
Key = tuple[str, int, str, float, tuple[str, ...]]


def runs(folder: Path) -> dict[Key, float]:
    """Every finished run in ``folder``'s timing.jsonl (a run timed twice: its last timing)."""
    out: dict[Key, float] = {}
    for line in (folder / "timing.jsonl").read_text(encoding="utf-8").splitlines():
        e = json.loads(line)
        if e.get("event") != "run" or e.get("error"):
            continue
        m = _FILE.fullmatch(e["file"])
        if m is None:
            raise ValueError(f"{folder}: unexpected record file {e['file']!r}")
        key = (m["point"], int(m["seed"]), e["policy"], float(e["rps"]), tuple(e["objectives"]))
        out[key] = float(e["cpu_s"])
    return out


def project(base: dict[Key, float], overrides: list[dict[Key, float]], seeds: list[int]) -> dict[str, Any]:
    """The sweep at ``seeds``: per run of the base, the override measured at that seed, else the base.

    Returns ``by_policy`` (policy -> CPU s over the seeds), ``total``, ``measured`` (CPU s of runs
    timed at their own seed) and ``runs``."""
    base_seeds = {k[1] for k in base}
    if len(base_seeds) != 1:
        raise ValueError(f"the base must hold one seed, holds {sorted(base_seeds)}")
    (base_seed,) = base_seeds
    by_policy: dict[str, float] = defaultdict(float)
    measured = 0.0
    n = 0
    for (point, _, policy, rps, objectives), cpu_base in base.items():
        at_base = (point, base_seed, policy, rps, objectives)
        for seed in seeds:
            cpu, own = cpu_base, seed == base_seed
            for over in overrides:  # a re-timing at the base's seed stands for a seed not re-timed
                if at_base in over:
                    cpu = over[at_base]
            for over in overrides:
                hit = over.get((point, seed, policy, rps, objectives))
                if hit is not None:
                    cpu, own = hit, True
            by_policy[policy] += cpu
            measured += cpu if own else 0.0
            n += 1
    return {"by_policy": dict(by_policy), "total": sum(by_policy.values()), "measured": measured, "runs": n}


def table(p: dict[str, Any], seeds: list[int], cores: int, bar_h: float) -> str:
    total = p["total"]
    wall_h = total / cores / 3600
    lines = [
        f"Seeds {','.join(map(str, seeds))}: {p['runs']} runs, **{total:,.0f} CPU s**, "
        f"{100 * p['measured'] / total:.0f} % of it timed at its own seed; on {cores} quiet cores "
        f"**{wall_h:.1f} h** ({wall_h / bar_h:.2f}x the {bar_h:g} h bar).",
        "",
        "| policy | CPU s | share |",
        "|---|---:|---:|",
    ]
    for policy, cpu in sorted(p["by_policy"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {policy} | {cpu:,.0f} | {100 * cpu / total:.1f} % |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--override", type=Path, action="append", default=[])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--bar-hours", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    p = project(runs(args.base), [runs(o) for o in args.override], seeds)
    text = table(p, seeds, args.cores, args.bar_hours)
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
