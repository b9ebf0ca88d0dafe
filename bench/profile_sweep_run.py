"""One run of the gmax_sweep grid under cProfile: where a sweep point's CPU goes.

    PYTHONPATH=core:lab .venv/bin/python bench/profile_sweep_run.py edf --family tot --replicas 4 \\
        --rps 26 --duration 150 --out bench/results/sim_speed/profile_edf_tot_r4_overload_150s.txt

Prints (and with ``--out`` writes) the 30 functions with the most own time, then the run's CPU
seconds and goodput ratios. Profiling inflates the times (roughly 1.5x here): compare shares, not
seconds, with unprofiled runs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import gmax_sweep  # bench/ is the script's own folder, first on sys.path

from slo_core.bench.runner import run_one_timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policy")
    gmax_sweep.add_task_arguments(ap, duration_s=300.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    task = gmax_sweep.task_of(args, args.policy)
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    record, cpu = run_one_timed(task.config(), (args.policy, args.router, args.rps))
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    ratios = {k: round(v, 5) for k, v in record.items() if k.endswith("_ratio")}
    text.write(f"\n{args.policy} {args.family} x{args.replicas} {args.rps:g} req/s {args.duration:g} s: ")
    text.write(f"{cpu:.1f} CPU s under the profiler; {ratios}\n")
    print(text.getvalue())
    if args.out is not None:
        args.out.write_text(text.getvalue(), encoding="utf-8")


if __name__ == "__main__":
    main()
