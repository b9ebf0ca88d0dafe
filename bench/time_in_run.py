"""CPU seconds spent inside named functions during one simulation: the hour, or one sweep run.

    PYTHONPATH=core:lab .venv/bin/python bench/time_in_run.py --hour gmax \\
        slo_core.policies.feedback:Feedback.__call__
    PYTHONPATH=core:lab .venv/bin/python bench/time_in_run.py --task gmax --family tot --replicas 4 \\
        --rps 26 --duration 30 --objective request slo_core.policies.gmax_snapshot:SnapshotTable.columns

Each TARGET (``module:Qualified.name``) is wrapped by a process-time accumulator for the run; the
report gives its calls, CPU seconds and µs a call, beside the run's CPU seconds and a digest of its
results (the hour's summary without ``wall_s``; the sweep record), so two checkouts compare the same
work. A wrapper costs a few tenths of a µs a call, the same on both sides of an A/B; a function that
calls another target counts that one's time too. Whole runs on this host move by 10–40 % from hour to
hour: this measures a change where it acts.
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from typing import Any

import gmax_sweep  # bench/ is the script's own folder, first on sys.path
import sim_speed
from run_phases import record_digest

from slo_core.bench.runner import run_one_timed
from slo_core.metrics import summarize
from slo_core.perf import load_profile
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig


def _wrap(target: str, acc: list[float]) -> Callable[[], None]:
    """Wrap ``target`` to add its CPU seconds and calls to ``acc``; returns what restores it."""
    module_name, _, qualname = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    had_own = name in vars(owner)
    inner: Callable[..., Any] = getattr(owner, name)
    clock = time.process_time

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            acc[0] += clock() - t0
            acc[1] += 1

    setattr(owner, name, timed)

    def restore() -> None:
        if had_own:
            setattr(owner, name, inner)
        else:
            delattr(owner, name)

    return restore


def timed_run(targets: list[str], run: Callable[[], tuple[float, str]]) -> dict[str, Any]:
    """``run()`` (returning its CPU seconds and results digest) with ``targets`` timed, then restored."""
    totals: dict[str, list[float]] = {t: [0.0, 0.0] for t in targets}
    restores = [_wrap(t, totals[t]) for t in targets]
    try:
        cpu, digest = run()
    finally:
        for restore in reversed(restores):
            restore()
    return {"cpu_s": cpu, "digest": digest, "targets": {t: (s, int(n)) for t, (s, n) in totals.items()}}


def hour_run(policy: str) -> tuple[float, str]:
    """bench/sim_speed.py's hour with ``policy``: (CPU s, digest of the summary without wall_s)."""
    jobs = sim_speed.hour_jobs()
    replicas = [ReplicaSpec(load_profile("h100-llama3-8b-tp1"))] * 4
    sim = FleetSim(replicas, policy, "round-robin", config=SimConfig())
    c0 = time.process_time()
    summary = summarize(sim.run(jobs))
    return time.process_time() - c0, record_digest(summary)


def task_run(task: Any) -> tuple[float, str]:
    """One gmax_sweep task: (CPU s, digest of its record without wall_s)."""
    record, cpu = run_one_timed(task.config(), (task.policy, task.router, task.rps))
    return cpu, record_digest(record)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="+", help="module:Qualified.name of each function to time")
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--hour", metavar="POLICY", help="bench/sim_speed.py's hour with this policy")
    which.add_argument("--task", metavar="POLICY", help="one gmax_sweep task with this policy")
    gmax_sweep.add_task_arguments(ap, duration_s=60.0, rps_required=False)
    args = ap.parse_args()
    if args.task and args.rps is None:
        ap.error("--task needs --rps")
    if args.hour:
        what, run = f"the hour, {args.hour}", lambda: hour_run(args.hour)
    else:
        task = gmax_sweep.task_of(args, args.task)
        what = f"{args.task} {args.family} x{args.replicas} {args.rps:g} req/s {args.duration:g} s"
        run = lambda: task_run(task)  # noqa: E731
    out = timed_run(args.targets, run)
    print(f"{what}: {out['cpu_s']:.2f} CPU s, results {out['digest']}")
    for target, (seconds, calls) in out["targets"].items():
        per = seconds / calls * 1e6 if calls else 0.0
        print(f"  {target}: {calls} calls, {seconds:.3f} CPU s, {per:.1f} µs a call")


if __name__ == "__main__":
    main()
