"""What GMAX's decisions in sim_speed's hour are: how many find requests waiting, how many running requests
each sees, and what each kind costs (wall microseconds of ``GMAX.decide``, timed one by one).

Issue 20's ratio bar (every SLO-aware policy within 2x FCFS on the hour) turns on this cost once the
engines coast: what is left of GMAX's run beyond FCFS's is its decisions. Same workload as
``bench/sim_speed.py`` (one hour of Azure conv, 4 H100 replicas, round-robin):

    PYTHONPATH=core:lab .venv/bin/python bench/gmax_decision_mix.py \
        --out bench/results/sim_speed/gmax_decision_mix.md
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

from sim_speed import hour_jobs  # bench/ is on the path of a script run from it

from slo_core.perf import load_profile
from slo_core.policies.gmax import GMAX
from slo_core.sim.fleet import FleetSim, ReplicaSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="gmax", help="gmax or one of its variants")
    ap.add_argument("--duration", type=float, default=None, help="seconds of the trace (default: all)")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = ap.parse_args()
    jobs = hour_jobs(args.duration)

    # kind -> [decisions, seconds, running requests seen, waiting requests seen]
    stats: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0, 0])
    decide = GMAX.decide

    def timed(self, waiting, running, engine, rng):  # type: ignore[no-untyped-def]
        last = self._last_frame_step  # what GMAX's own frame test will find, read without moving it
        frame = last is None or engine.step - last >= self.frame_steps
        t0 = time.perf_counter()
        d = decide(self, waiting, running, engine, rng)
        dt = time.perf_counter() - t0
        kind = (
            "requests waiting" if waiting else "nothing waiting",
            "frame" if frame else "event",
        )
        s = stats[kind]
        s[0] += 1
        s[1] += dt
        s[2] += len(running)
        s[3] += len(waiting)
        return d

    GMAX.decide = timed  # type: ignore[method-assign]
    sim = FleetSim(
        [ReplicaSpec(load_profile("h100-llama3-8b-tp1"))] * args.replicas, args.policy, "round-robin"
    )
    w0 = time.perf_counter()
    sim.run(jobs)
    wall = time.perf_counter() - w0
    GMAX.decide = decide  # type: ignore[method-assign]

    total_n = sum(s[0] for s in stats.values())
    total_s = sum(s[1] for s in stats.values())
    lines = [
        f"{args.policy}, {len(jobs)} requests, {args.replicas} replicas, simulate {wall:.2f} s wall "
        f"(timing each decision adds to it), decisions {total_n:,} taking {total_s:.2f} s",
        "",
        "| decision | count | share | seconds | µs each | running seen (mean) | waiting seen (mean) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, (n, t, r, w) in sorted(stats.items(), key=lambda kv: -kv[1][0]):
        lines.append(
            f"| {kind[0]}, {kind[1]} | {int(n):,} | {n / total_n:.0%} | {t:.2f} | {t / n * 1e6:.0f} | "
            f"{r / n:.1f} | {w / n:.1f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
