"""Where GMAX's extra simulation time over FCFS goes in sim_speed's hour: the policy's arithmetic, or
the simulator's cost of asking for a decision at all (issue 20's ratio bar).

Each measurement in a fresh process, each on the same workload as ``bench/sim_speed.py`` (one hour of
Azure conv, 4 H100 replicas, round-robin):

1. ``fcfs``: the reference (no decisions: the engine orders its own queues).
2. ``gmax``: the real run; every ``decide`` and ``observe`` call is recorded (arguments, the RNG
   state before the call, the Decision), which the next two reuse. Recording adds to this run's time,
   so its CPU seconds are not reported; sim_speed's table has the unrecorded figure.
3. ``gmax, decisions free``: the same run with ``GMAX.decide`` answering each call with its recorded
   Decision (a list lookup) and ``observe`` doing nothing. What is left over FCFS is the simulator's
   per-decision cost: the views, the Decision applied to the queues, the finish feedback, and the
   coasting a due decision interrupts.
4. ``gmax decide, replayed``: every recorded call replayed on a fresh policy per engine, in order,
   outside the simulator (RNG state restored before each call). Its CPU time is the decisions' own
   cost with warm caches; every replayed Decision must equal the recorded one (the run stops
   otherwise), so the same harness checks that a faster decision path decides the same.

    PYTHONPATH=core:lab .venv/bin/python bench/decision_overhead.py \
        --out bench/results/sim_speed/decision_overhead.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from sim_speed import hour_jobs, print_table  # bench/ is on the path of a script run from it

from slo_core.perf import load_profile
from slo_core.policies.gmax import GMAX
from slo_core.sim.fleet import FleetSim, ReplicaSpec

Calls = list[tuple[type[GMAX], Any, list[tuple[str, tuple[Any, ...], Any]]]]


def _sim(policy: str, replicas: int) -> FleetSim:
    return FleetSim([ReplicaSpec(load_profile("h100-llama3-8b-tp1"))] * replicas, policy, "round-robin")


def _cpu_run(sim: FleetSim, jobs: list) -> float:
    c0 = time.process_time()
    sim.run(jobs)
    return time.process_time() - c0


def _record(jobs: list, replicas: int, policy: str) -> Calls:
    """Run ``policy`` and return, per engine (in the order each first decided), its calls in order."""
    calls: dict[int, list[Any]] = {}
    decide, observe = GMAX.decide, GMAX.observe

    def recording_decide(self, waiting, running, engine, rng):  # type: ignore[no-untyped-def]
        state = rng.getstate()
        out = decide(self, waiting, running, engine, rng)
        entry = calls.setdefault(id(self), [type(self), self.params, []])
        entry[2].append(("d", (tuple(waiting), tuple(running), engine, state), out))
        return out

    def recording_observe(self, finished, now_s):  # type: ignore[no-untyped-def]
        entry = calls.setdefault(id(self), [type(self), self.params, []])
        entry[2].append(("o", (tuple(finished), now_s), None))
        return observe(self, finished, now_s)

    GMAX.decide, GMAX.observe = recording_decide, recording_observe  # type: ignore[method-assign]
    try:
        _sim(policy, replicas).run(jobs)
    finally:
        GMAX.decide, GMAX.observe = decide, observe  # type: ignore[method-assign]
    return [(c[0], c[1], c[2]) for c in calls.values()]


def _free_decisions_cpu(jobs: list, replicas: int, policy: str, calls: Calls) -> float:
    """CPU seconds of the run with every decision answered from the recording."""
    queues = [iter([out for kind, _, out in seq if kind == "d"]) for _, _, seq in calls]
    by_engine: dict[int, Any] = {}
    decide, observe = GMAX.decide, GMAX.observe

    def recorded(self, waiting, running, engine, rng):  # type: ignore[no-untyped-def]
        q = by_engine.get(id(self))
        if q is None:
            q = by_engine[id(self)] = queues[len(by_engine)]
        return next(q)

    GMAX.decide = recorded  # type: ignore[method-assign]
    GMAX.observe = lambda self, finished, now_s: None  # type: ignore[method-assign]
    try:
        return _cpu_run(_sim(policy, replicas), jobs)
    finally:
        GMAX.decide, GMAX.observe = decide, observe  # type: ignore[method-assign]


def _replay_cpu(calls: Calls) -> tuple[float, int]:
    """CPU seconds of replaying every recorded decision (observe calls replayed, untimed) and their
    count; raises when a replayed Decision differs from the recorded one."""
    spent = 0.0
    n = 0
    for cls, params, seq in calls:
        policy = cls(params)
        rng = random.Random()
        for kind, args, out in seq:
            if kind == "o":
                policy.observe(*args)
                continue
            waiting, running, engine, state = args
            rng.setstate(state)
            c0 = time.process_time()
            got = policy.decide(waiting, running, engine, rng)
            spent += time.process_time() - c0
            n += 1
            if got != out:
                raise SystemExit(f"replayed decision {n} differs from the recorded one:\n{got}\n{out}")
    return spent, n


def one_measurement(what: str, policy: str, replicas: int, duration: float | None) -> dict[str, float]:
    """``what``: 'fcfs' or 'gmax' (one plain run in this process), or 'free' (record, then the
    free-decision run and the replay, in this process)."""
    jobs = hour_jobs(duration)
    if what == "fcfs":
        return {"fcfs": _cpu_run(_sim("fcfs", replicas), jobs)}
    if what == "gmax":
        return {"gmax": _cpu_run(_sim(policy, replicas), jobs)}
    calls = _record(jobs, replicas, policy)
    free = _free_decisions_cpu(jobs, replicas, policy, calls)
    replay, n = _replay_cpu(calls)
    return {"free": free, "replay": replay, "decisions": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="gmax", help="gmax or one of its variants")
    ap.add_argument("--duration", type=float, default=None, help="seconds of the trace (default: all)")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes; the table shows the median")
    ap.add_argument("--out", default=None, help="also write the table (markdown) here")
    ap.add_argument("--child", choices=("fcfs", "gmax", "free"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_measurement(args.child, args.policy, args.replicas, args.duration)))
        return
    reps: dict[str, list[float]] = {}
    for i in range(args.repeat):
        for what in ("fcfs", "gmax", "free"):
            cmd = [sys.executable, __file__, "--child", what, "--policy", args.policy]
            cmd += ["--replicas", str(args.replicas)]
            if args.duration is not None:
                cmd += ["--duration", str(args.duration)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            for k, v in got.items():
                reps.setdefault(k, []).append(v)
            print(f"repetition {i + 1}, {what}: {got}", flush=True)
    med = {k: statistics.median(v) for k, v in reps.items()}
    fcfs, n = med["fcfs"], int(med["decisions"])
    sim_cost = med["free"] - fcfs
    rows = [
        ("fcfs", med["fcfs"], "the reference"),
        (args.policy, med["gmax"], "the real run"),
        (f"{args.policy}, decisions free", med["free"], "recorded Decisions answered by lookup"),
    ]
    lines = [
        f"{args.policy} vs fcfs, {args.replicas} replicas, one hour of Azure conv "
        f"({'the whole trace' if args.duration is None else f'{args.duration:g} s'}), "
        f"median of {args.repeat} fresh processes on {os.cpu_count()} cores; {n:,} decisions",
        "",
        "| run | CPU s | / fcfs | what it is |",
        "|---|---:|---:|---|",
    ]
    for label, cpu, what in rows:
        lines.append(f"| {label} | {cpu:.2f} | {cpu / fcfs:.2f} | {what} |")
    lines += [
        "",
        "| share of the extra time over fcfs | CPU s | µs per decision |",
        "|---|---:|---:|",
        f"| asking for decisions (simulator side: free-decision run - fcfs) | {sim_cost:.2f} | "
        f"{sim_cost / n * 1e6:.0f} |",
        f"| the decisions themselves (real run - free-decision run) | {med['gmax'] - med['free']:.2f} | "
        f"{(med['gmax'] - med['free']) / n * 1e6:.0f} |",
        f"| the decisions replayed outside the simulator (warm caches; all {n:,} equal to the recorded) | "
        f"{med['replay']:.2f} | {med['replay'] / n * 1e6:.0f} |",
        "",
        f"Issue 20's ratio bar (<= 2x fcfs) leaves {2 * fcfs:.2f} CPU s for the {args.policy} run; "
        f"with decisions free the simulator alone needs {med['free']:.2f} s ({med['free'] / fcfs:.2f}x).",
    ]
    print_table(lines, args.out)


if __name__ == "__main__":
    main()
