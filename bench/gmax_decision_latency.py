"""Wall time of one GMAX decision (JITServe Algorithm 1) over thousands of queued requests.

Target (issue 4): ≤ 20 ms over 5,000 queued requests, aim ≤ 5 ms (JITServe §4.2: "thousands of
concurrent requests within 20 milliseconds"). The snapshot mixes latency, deadline, compound
(3-call stages) and best-effort requests, 256 of them running (max_num_seqs = 256), with a
Llama-3-8B/H100-shaped latency profile. Timed cases per queue size:

- cold: a fresh policy's first decision (its snapshot table is empty);
- frame: a decision at a frame boundary (running requests compete; cost-aware preemption runs);
- event: a decision between frame boundaries (only waiting requests compete for free slots);
- churn: a frame decision after 5 % of the requests got new snapshots (progress, arrivals).

The min over repeats approximates an unloaded machine; median and p95 show the shared machine.

    .venv/bin/python bench/gmax_decision_latency.py [--sizes 1000 5000 10000] [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import time
from pathlib import Path

from slo_core.perf.model import PerfProfile
from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.gmax import GMAX
from slo_core.slo import RequestKind, SLOTargets

PROFILE = PerfProfile(
    name="bench-8b-h100",
    gpu="H100",
    model="llama-3-8b",
    tensor_parallel=1,
    t_c_ms=2.0,
    floor_ms=6.0,
    a_ms_per_token=0.02,
    b_ms_per_token_ctx=2e-7,
    d_ms_per_kv_token=2e-5,
    kv_cache_tokens=400_000,
    max_model_len=8192,
)
SLOS = (
    SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.05),
    SLOTargets(RequestKind.DEADLINE, deadline_s=30.0),
    SLOTargets(RequestKind.COMPOUND, deadline_s=120.0),
    SLOTargets(RequestKind.BEST_EFFORT),
)
RUNNING = 256


def snapshot(n_waiting: int, rng: random.Random) -> tuple[list[RequestView], list[RequestView]]:
    waiting: list[RequestView] = []
    running: list[RequestView] = []
    for i in range(n_waiting + RUNNING):
        slo = SLOS[i % len(SLOS)]
        is_running = i < RUNNING
        prompt = int(rng.lognormvariate(6.0, 1.0)) + 1
        gen = rng.randint(1, 300) if is_running else 0
        arrival = -rng.uniform(0.0, 20.0)
        extra: dict[str, object] = {}
        if slo.kind is RequestKind.COMPOUND:
            program = i // 9
            extra = {
                "program_id": f"p{program}",
                "stage": (i // 3) % 3,
                "program_arrival_s": arrival,
                "program_deadline_at_s": arrival + 120.0,
                "deadline_at_s": arrival + 40.0,
            }
        view = RequestView(
            request_id=f"r{i}",
            slo=slo,
            arrival_s=arrival,
            prompt_tokens=prompt,
            max_tokens=4096,
            generated_tokens=gen,
            computed_tokens=prompt + gen if is_running else 0,
            output_bound=gen + int(rng.lognormvariate(5.5, 0.8)) + 1,
            tenant=f"t{i % 7}",
            waiting_since_s=None if is_running else arrival,
            **extra,  # type: ignore[arg-type]
        )
        (running if is_running else waiting).append(view)
    return waiting, running


def engine(step: int) -> EngineView:
    return EngineView(
        now_s=0.0,
        step=step,
        max_num_seqs=RUNNING,
        max_num_batched_tokens=8192,
        kv_blocks_total=25_000,
        kv_blocks_free=2_000,
        profile=PROFILE,
    )


def _ms(fn: object, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def measure(n_waiting: int, repeats: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    waiting, running = snapshot(n_waiting, rng)
    cold = []
    for _ in range(max(3, repeats // 5)):
        policy = GMAX()
        t0 = time.perf_counter()
        policy.decide(waiting, running, engine(0), random.Random(seed))
        cold.append((time.perf_counter() - t0) * 1e3)
    policy = GMAX()
    frame_steps = policy.frame_steps
    step = [0]

    def frame() -> None:
        step[0] += frame_steps
        policy.decide(waiting, running, engine(step[0]), rng)

    def event() -> None:
        policy.decide(waiting, running, engine(step[0] + 1), rng)

    frame()
    frame_ms = _ms(frame, repeats)
    event_ms = _ms(event, repeats)

    churn_ms = []
    for _ in range(repeats):
        # the view replacement is the caller's work; time only the decision after it
        for lst in (waiting, running):
            for j in rng.sample(range(len(lst)), max(1, len(lst) // 20)):
                r = lst[j]
                lst[j] = (
                    dataclasses.replace(r, generated_tokens=r.generated_tokens + 1)
                    if r.generated_tokens
                    else dataclasses.replace(r, request_id=r.request_id + "n")
                )
        churn_ms += _ms(frame, 1)

    def stats(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        return {
            "min_ms": round(xs[0], 3),
            "median_ms": round(statistics.median(xs), 3),
            "p95_ms": round(xs[int(0.95 * (len(xs) - 1))], 3),
        }

    return {
        "queued": n_waiting,
        "running": RUNNING,
        "cold": stats(cold),  # type: ignore[dict-item]
        "frame": stats(frame_ms),  # type: ignore[dict-item]
        "event": stats(event_ms),  # type: ignore[dict-item]
        "churn_5pct": stats(churn_ms),  # type: ignore[dict-item]
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000], help="queued requests")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    rows = [measure(n, args.repeats, args.seed) for n in args.sizes]
    print(f"# {os.cpu_count()} CPUs, 1-min load average {load_before:.2f} → {os.getloadavg()[0]:.2f}")
    print(
        f"{'queued':>7} {'running':>7} | min / median / p95 ms: "
        f"{'cold':>23} {'frame':>23} {'event':>23} {'churn 5%':>23}"
    )
    for r in rows:
        cells = " ".join(
            f"{r[k]['min_ms']:>7.2f}/{r[k]['median_ms']:>7.2f}/{r[k]['p95_ms']:<7.2f}"  # type: ignore[index]
            for k in ("cold", "frame", "event", "churn_5pct")
        )
        print(f"{r['queued']:>7} {r['running']:>7} | {'':22}{cells}")
    at5k = next((r for r in rows if r["queued"] == 5000), None)
    if at5k is not None:
        for stat in ("min_ms", "median_ms"):
            v = at5k["frame"][stat]  # type: ignore[index]
            print(
                f"5,000 queued, frame decision ({stat[:-3]}): {v:.2f} ms = {v / 20.0:.2f}× the 20 ms target, "
                f"{v / 5.0:.2f}× the 5 ms aim"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
