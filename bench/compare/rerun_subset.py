"""Re-run a subset of the comparison's runs (by scenario, replicas, policy, router, analyzer) in place.

    .venv/bin/python bench/compare/rerun_subset.py --scenario multi --replicas 4 --duration 40 \
        --policies sarathi --analyzer qrf

Each matching run of ``scenarios.runs`` is simulated again with the current code and replaces its
record in ``records.json``; the tables and plots are rewritten. For results that change because the
code changed (e.g. the simulator now routing through the deployed routing pipeline), without the cost
of re-running the whole comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as compare
from scenarios import runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--replicas", type=int, default=None)
    ap.add_argument("--duration", type=float, default=None, help="workload duration (s)")
    ap.add_argument("--policies", default="", help="comma list (default: all)")
    ap.add_argument("--routers", default="", help="comma list (default: all)")
    ap.add_argument("--analyzer", choices=("qrf", "none"), default="qrf")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="bench/results/compare")
    args = ap.parse_args(argv)
    compare.ANALYZER["mode"] = args.analyzer
    policies = {p for p in args.policies.split(",") if p}
    routers = {r for r in args.routers.split(",") if r}
    todo = [
        t
        for t in runs((args.scenario,))
        if (args.replicas is None or t.replicas == args.replicas)
        and (args.duration is None or t.workload.duration_s == args.duration)
        and (not policies or t.policy in policies)
        and (not routers or t.router in routers)
    ]
    path = Path(args.out) / "records.json"
    old = json.loads(path.read_text()) if path.exists() else []
    keys = {compare._key(compare._head(t)) for t in todo}
    before = {compare._key(r): r for r in old if compare._key(r) in keys}
    records = [r for r in old if compare._key(r) not in keys]
    print(f"re-running {len(todo)} runs", file=sys.stderr)
    compare._run_pool(todo, args.workers, records, path)
    for r in records:
        prev = before.get(compare._key(r))
        if prev is not None:
            print(
                f"{r['scenario']} {r['policy']}/{r['router']} x{r['replicas']} {r.get('rps')}: "
                f"token {prev.get('goodput_token_ratio')} -> {r.get('goodput_token_ratio')}, "
                f"attain {prev.get('attainment')} -> {r.get('attainment')}, "
                f"rejected_by_router {prev.get('rejected_by_router')} -> {r.get('rejected_by_router')}"
            )
    from report import write_report

    write_report(records, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
