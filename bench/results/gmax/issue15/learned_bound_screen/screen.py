"""Screen (not shipped): GMAX reading the analyzer's bound per request kind from what finishes.

GMAX reads a request's output bound as the ``bound_quantile`` (95th) percentile of a log-normal of
spread ``length_sigma``, i.e. at z = 1.645 above the median. The forest bounds Tree-of-Thoughts calls
far above their true length (and deep-research calls below it), so this reading is wrong by kind.
Here each GMAX instance learns, per request kind, z_k = median(log(first bound / true length)) /
sigma over its last 200 naturally finished requests (from 20 on), floored at the static z (it only
ever reads a bound as more conservative than the 95th percentile) and capped at 6. Prototype: only
the columnar estimate path (gmax_priority.estimate) reads z_k; the scalar path and the pace budget
keep the static reading.

    PYTHONPATH=core:lab .venv/bin/python bench/results/gmax/issue15/learned_bound_screen/screen.py \\
        tot 1 6.5 0,1,2

Same Task config, workload and analyzer as ``bench/gmax_sweep.py run`` (300 s, token goodput).
"""

from __future__ import annotations

import collections
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # bench/

import gmax_sweep

from slo_core.bench import runner
from slo_core.metrics.summary import job_outcomes, summarize
from slo_core.objective import Objective
from slo_core.policies import gmax as gmax_module
from slo_core.policies import gmax_priority
from slo_core.policies.gmax_snapshot import KIND_CODES
from slo_core.policies.registry import make_engine_policy
from slo_core.sim.fleet import FleetSim, ReplicaSpec

WINDOW, MIN_SAMPLES, Z_CAP = 200, 20, 6.0
_static_estimate = gmax_module.estimate
_static_z = gmax_priority.z_of_quantile
_current: dict[str, Any] = {}


def _estimate(c: Any, now: float, speed: Any, p: Any, frame_s: float) -> Any:
    """gmax_priority.estimate with the deciding instance's per-kind z in place of the static one."""
    policy = _current.get("policy")
    if policy is None or p.length_source != "analyzer":
        return _static_estimate(c, now, speed, p, frame_s)
    per_kind = np.array([policy.z.get(k, _static_z(p.bound_quantile)) for k in range(4)])
    rows = per_kind[c.kind]
    gmax_priority.z_of_quantile = lambda _q: rows  # type: ignore[assignment,return-value]
    try:
        return _static_estimate(c, now, speed, p, frame_s)
    finally:
        gmax_priority.z_of_quantile = _static_z


def _learning(policy: Any) -> Any:
    """``policy`` (a GMAX) remembering each request's first bound and learning z per kind."""
    policy.first, policy.z = {}, {}
    policy.logs = collections.defaultdict(lambda: collections.deque(maxlen=WINDOW))
    sigma, floor = policy.params.length_sigma, _static_z(policy.params.bound_quantile)
    decide, observe = policy.decide, policy.observe

    def learning_decide(waiting: Any, running: Any, engine: Any, rng: Any) -> Any:
        for r in waiting:
            if r.request_id not in policy.first and r.output_bound is not None and r.generated_tokens == 0:
                policy.first[r.request_id] = r.output_bound
        _current["policy"] = policy
        return decide(waiting, running, engine, rng)

    def learning_observe(finished: Any, now_s: float) -> None:
        for f in finished:
            r = f.request
            bound = policy.first.pop(r.request_id, None)
            if bound is not None and 0 < r.generated_tokens < r.max_tokens:
                kind = KIND_CODES[r.slo.kind]
                logs = policy.logs[kind]
                logs.append(math.log(bound / r.generated_tokens))
                if len(logs) >= MIN_SAMPLES:
                    policy.z[kind] = min(Z_CAP, max(floor, statistics.median(logs) / sigma))
        observe(finished, now_s)

    policy.decide, policy.observe = learning_decide, learning_observe
    return policy


def main() -> None:
    family, replicas, rps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    seeds = [int(s) for s in sys.argv[4].split(",")]
    gmax_module.estimate = _estimate  # type: ignore[assignment]
    objective = Objective(goodput="token")
    ratios = []
    for seed in seeds:
        cfg = gmax_sweep.Task(family, replicas, seed, rps, "gmax", ("token",), 300.0, "round-robin").config()
        spec = cfg.workload.model_copy(update={"rps": rps})
        jobs = runner._jobs(spec)
        specs = [ReplicaSpec(cfg.profiles[i % len(cfg.profiles)], cfg.engine) for i in range(cfg.replicas)]
        policies: list[Any] = []

        def make(made: list[Any] = policies) -> Any:
            policy = _learning(make_engine_policy("gmax", {}, objective=objective))
            made.append(policy)
            return policy

        c0 = time.process_time()
        sim = FleetSim(
            specs,
            make,
            "round-robin",
            seed=spec.seed,
            config=cfg.sim,
            analyzer=runner._analyzer(cfg),
            objective=cfg.objective,
        )
        res = sim.run(jobs)
        m = summarize(res, bucket_s=cfg.bucket_s, jobs=job_outcomes(res))
        ratios.append(m["goodput_token_ratio"])
        learned = [{k: round(v, 2) for k, v in sorted(p.z.items())} for p in policies]
        print(
            f"seed {seed} token {m['goodput_token_ratio']:.4f} attain {m['attainment']:.3f} "
            f"z by kind (0 latency, 1 deadline, 2 compound) {learned} cpu {time.process_time() - c0:.1f}",
            flush=True,
        )
    print("MEAN", round(sum(ratios) / len(ratios), 4), family, replicas, rps)


if __name__ == "__main__":
    main()
