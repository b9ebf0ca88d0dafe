"""Wall time of a one-hour Azure-conv replay (all 19,366 requests) on 4 simulated H100 replicas with FCFS.

The issue's bar: at most 60 s on the 2-core development machine. Prints the workload build time,
the simulation time and the ratio to the bar; ``--profile`` adds the top of a cProfile listing.

    .venv/bin/python bench/sim_speed.py [--policy fcfs] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from slo_core.metrics import summarize
from slo_core.perf import load_profile
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.workloads import WorkloadSpec, build_workload, load_trace

BAR_S = 60.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="fcfs")
    ap.add_argument("--router", default="round-robin")
    ap.add_argument("--gpu-profile", default="h100-llama3-8b-tp1")
    ap.add_argument("--mix", default="1:0:0", help="latency:deadline:compound (default: the trace as is)")
    ap.add_argument("--profile", action="store_true", help="print the top of a cProfile listing")
    args = ap.parse_args()
    trace = load_trace("azure-conv-2023")
    t0 = time.perf_counter()
    mix = tuple(float(x) for x in args.mix.split(":"))
    # the whole trace at its own rate: duration = span + one mean gap gives exactly its 19,366 requests
    spec = WorkloadSpec(duration_s=trace.span_s + 1.0 / trace.rate_rps, mix=mix)  # type: ignore[arg-type]
    jobs = build_workload(spec)
    t1 = time.perf_counter()
    sim = FleetSim([ReplicaSpec(load_profile(args.gpu_profile))] * 4, args.policy, args.router)
    prof = cProfile.Profile() if args.profile else None
    if prof is not None:
        prof.enable()
    result = sim.run(jobs)
    if prof is not None:
        prof.disable()
    t2 = time.perf_counter()
    m = summarize(result)
    t3 = time.perf_counter()
    steps = sum(s["steps"] for s in result.replica_stats)
    print(f"requests {len(jobs)}  engine steps {steps:.0f}  simulated {result.end_s:.0f} s")
    print(f"build {t1 - t0:.2f} s  simulate {t2 - t1:.2f} s  metrics {t3 - t2:.2f} s")
    print(f"token goodput ratio {m['goodput_token_ratio']:.3f}  attainment {m['attainment']:.3f}")
    print(f"simulate / bar ({BAR_S:.0f} s) = {(t2 - t1) / BAR_S:.2f}")
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
        print(out.getvalue())


if __name__ == "__main__":
    main()
