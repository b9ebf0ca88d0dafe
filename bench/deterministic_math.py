"""What host-independent exp/log costs GMAX and what it buys (slo_core.detmath, which the policies use).

numpy runs its own AVX-512 float64 ``exp``/``log`` kernels where the CPU has them and the C library's
elsewhere; they differ in the last bit on some inputs, and GMAX, whose feasibility probabilities
(``gmax_priority.normal_cdf``, ``fit_probability``) and bound scales (``gmax_bound``) use them, then
decides differently at some point of a long run and every later decision follows. slo_core.detmath
builds exp/log/log1p from operations IEEE-754 rounds the same everywhere. Measured here, side by side:

1. accuracy against the C library, scalar/array bit equality, and how often numpy's own differ;
2. the cost per call beside numpy's, at 10, 300 and 5,000 elements;
3. a sweep run of GMAX (ToT x1, 4.33 req/s, request objective, 300 s, seed 0) with numpy's exp/log
   put back (what the code did before: the same values per element) and with detmath's, each with
   numpy's AVX-512 kernels on and off (``NPY_DISABLE_CPU_FEATURES=X86_V4``), a fresh process each:
   whether the records agree across kernels, and the CPU seconds;
4. GMAX on sim_speed's hour (4 replicas, 19,366 requests) with each, beside FCFS, fresh processes.

    PYTHONPATH=core:lab .venv/bin/python bench/deterministic_math.py \
        --out bench/results/sim_speed/deterministic_math.md
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from slo_core import detmath


def _ulps(got: float, want: float) -> float:
    if (math.isnan(got) and math.isnan(want)) or got == want:
        return 0.0
    return abs(got - want) / math.ulp(want)


def accuracy(n: int = 100_000) -> list[str]:
    rng = np.random.default_rng(0)
    cases = {
        "exp": (
            np.concatenate([rng.uniform(-745.0, 709.78, n), rng.normal(0.0, 1.0, n)]),
            detmath.exp,
            detmath.exp_f,
            math.exp,
        ),
        "log": (
            np.concatenate([np.exp(rng.uniform(-740.0, 709.0, n)), rng.uniform(0.5, 2.0, n)]),
            detmath.log,
            detmath.log_f,
            math.log,
        ),
    }
    rows = [
        "| function | inputs | max ulp vs the C library | scalar twin ≠ array | numpy ≠ the C library |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, (xs, arr, scalar, ref) in cases.items():
        got = arr(xs)
        worst = max(_ulps(float(g), ref(float(x))) for g, x in zip(got, xs, strict=True))
        twin = sum(1 for g, x in zip(got, xs, strict=True) if scalar(float(x)) != g)
        npy = getattr(np, name)(xs)
        differ = sum(1 for g, x in zip(npy, xs, strict=True) if float(g) != ref(float(x)))
        rows.append(f"| {name} | {len(xs):,} | {worst:.0f} | {twin} | {differ} |")
    return rows


def per_call() -> list[str]:
    import timeit

    rng = np.random.default_rng(1)
    rows = [
        "| elements | numpy exp µs | detmath exp µs | numpy log µs | detmath log µs |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in (10, 300, 5000):
        a = rng.uniform(-30.0, 5.0, n)
        b = rng.uniform(1.0, 1e5, n)
        times = []
        for fn, x in ((np.exp, a), (detmath.exp, a), (np.log, b), (detmath.log, b)):
            reps = 2000
            times.append(min(timeit.repeat(lambda fn=fn, x=x: fn(x), number=reps, repeat=5)) / reps * 1e6)
        rows.append(f"| {n:,} | " + " | ".join(f"{t:.1f}" for t in times) + " |")
    return rows


def _use_numpys() -> None:
    """Put numpy's exp/log back where the policies and the analyzer's features call detmath's (what
    the code did before it used detmath: per element the same values, so the same records)."""
    detmath.exp = np.exp  # type: ignore[assignment]
    detmath.log = np.log  # type: ignore[assignment]
    detmath.log1p = np.log1p  # type: ignore[assignment]
    detmath.log1p_f = lambda x: float(np.log1p(x))  # type: ignore[assignment]


def _child(task: str, which: str) -> dict[str, Any]:
    if which == "numpy":
        _use_numpys()
    if task == "sweep-run":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gmax_sweep import Task

        from slo_core.bench.runner import run_one_timed

        t = Task("tot", 1, 0, 4.33, "gmax", ("request",), 300.0, "round-robin")
        record, cpu = run_one_timed(t.config(), (t.policy, t.router, t.rps))
        kept = {
            k: v for k, v in record.items() if "wall" not in k and k not in {"sweep_fingerprint", "cpu_s"}
        }
        digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return {
            "cpu_s": cpu,
            "digest": digest,
            "preemptions": record["preemptions"],
            "request": record["goodput_request_ratio"],
        }
    from sim_speed import hour_jobs

    from slo_core.perf import load_profile
    from slo_core.sim.fleet import FleetSim, ReplicaSpec

    policy = "fcfs" if task == "hour-fcfs" else "gmax"
    jobs = hour_jobs()
    sim = FleetSim([ReplicaSpec(load_profile("h100-llama3-8b-tp1"))] * 4, policy, "round-robin")
    c0 = time.process_time()
    result = sim.run(jobs)
    cpu = time.process_time() - c0
    return {"cpu_s": cpu, "decisions": sum(s["decisions"] for s in result.replica_stats)}


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _spawn(task: str, which: str, kernels_off: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
    if kernels_off:
        env["NPY_DISABLE_CPU_FEATURES"] = "X86_V4"
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", task, which],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", nargs=2, metavar=("TASK", "WHICH"), help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per hour run (median)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(*args.child)))
        return
    from sim_speed import print_table

    load0 = _load()
    lines = ["# Host-independent exp/log (slo_core.detmath) for GMAX: accuracy, cost, what it buys", ""]
    lines += ["## Accuracy (random inputs; the C library as reference)", "", *accuracy(), ""]
    lines += ["## Cost per call (best of 5 × 2,000 calls)", "", *per_call(), ""]
    lines += [
        "## One sweep run (GMAX, ToT x1, 4.33 req/s, request objective, 300 s, seed 0), fresh processes",
        "",
        "| exp/log | numpy kernels | record digest | preemptions | request goodput | CPU s |",
        "|---|---|---|---:|---:|---:|",
    ]
    for which in ("numpy", "detmath"):
        for off in (False, True):
            r = _spawn("sweep-run", which, off)
            kernels = "C library's (X86_V4 off)" if off else "default"
            row = (which, kernels, r["digest"], r["preemptions"], f"{r['request']:.4f}", f"{r['cpu_s']:.1f}")
            lines.append("| " + " | ".join(map(str, row)) + " |")
    lines += [
        "",
        f"## sim_speed's hour, 4 replicas (median CPU s of {args.repeats} fresh processes)",
        "",
        "| run | CPU s | / fcfs | decisions |",
        "|---|---:|---:|---:|",
    ]
    runs = (
        ("fcfs", "hour-fcfs", "detmath"),
        ("gmax, numpy's exp/log", "hour-gmax", "numpy"),
        ("gmax, detmath's (as shipped)", "hour-gmax", "detmath"),
    )
    measured = {}
    for label, task, which in runs:
        rs = [_spawn(task, which, False) for _ in range(args.repeats)]
        measured[label] = (sorted(r["cpu_s"] for r in rs)[len(rs) // 2], rs[0]["decisions"])
    ref = measured["fcfs"][0]
    for label, (cpu, decisions) in measured.items():
        lines.append(f"| {label} | {cpu:.2f} | {cpu / ref:.2f} | {decisions:,.0f} |")
    lines += [
        "",
        f"load average at start {load0}, at end {_load()} on {os.cpu_count()} cores",
    ]
    print_table(lines, args.out)


if __name__ == "__main__":
    main()
