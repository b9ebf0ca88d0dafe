"""What one GMAX decision costs inside the vLLM plugin over a deep queue: the snapshots the bridge
builds from vLLM's requests, and the policy's own decision on them.

    PYTHONPATH=core:lab:vllm_plugin .venv/bin/python bench/plugin_decision_cost.py \\
        --out bench/results/plugin_decision_cost.md

``bench/gmax_decision_latency.py`` times ``GMAX.decide`` on ready snapshots. In a pod the scheduler
plugin first turns every waiting and running vLLM request into a snapshot (``PolicyBridge.decide``), on
the engine's step loop, between two GPU steps. This bench times the whole call on duck-typed requests
with the fields the bridge reads (tags of every kind, compound programs of 3 calls), 256 of them running
unless a size says how many (``--sizes QUEUED:RUNNING``), over a run of engine steps: each step every
running request gets a token, and a few requests arrive and are admitted. Two bridges decide on the same
requests at each step, in alternating order: one as shipped (a request whose snapshot would carry the
same values as at the last decision keeps its snapshot object), and one whose snapshots are all built
anew at each decision (what the bridge did before). Their decisions must be equal.

``--parent CHECKOUT`` adds a third bridge, another checkout's ``PolicyBridge`` (its module loaded
from that tree; the policy and the rest of core are this one's), deciding on the same requests in the
same rotation: a change to the bridge measured side by side with its parent in one process.

The table ends with the least-squares line through the shipped bridge's rows, base + per request
queued: the simulator's ``DecisionCost`` (``bench/decision_cost.py`` charges it), e.g.

    PYTHONPATH=core:lab:vllm_plugin .venv/bin/python bench/plugin_decision_cost.py \\
        --sizes 20:10 50:25 100:50 200:100 400:200 700:256 1000 2000 5000 \\
        --out bench/results/plugin_decision_cost_shapes.md
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from slo_core.perf import load_profile
from slo_core.policies.base import EngineView
from slo_core.policies.registry import make_engine_policy
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags
from slo_vllm_plugin.bridge import PolicyBridge

SLOS = (
    SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.05),
    SLOTargets(RequestKind.DEADLINE, deadline_s=30.0),
    SLOTargets(RequestKind.COMPOUND, deadline_s=60.0),
    SLOTargets(RequestKind.BEST_EFFORT),
)
PROFILE = load_profile("h100-llama3-8b-tp1")
RUNNING = 256  # running requests of a shape given by its queue alone


def _request(rng: random.Random, i: int, now: float) -> Any:
    slo = rng.choice(SLOS)
    program = f"p{i // 3}" if slo.kind is RequestKind.COMPOUND else None
    deadline = None if slo.kind is RequestKind.LATENCY else now + rng.uniform(5, 60)
    tags = EngineTags(slo, program_id=program, stage=0 if program else None, deadline_at_s=deadline)
    return SimpleNamespace(
        request_id=f"r{i}",
        sampling_params=SimpleNamespace(extra_args=tags.to_xargs()),
        arrival_time=now - rng.uniform(0, 30),
        num_prompt_tokens=rng.randint(50, 3000),
        max_tokens=512,
        num_output_tokens=0,
        num_computed_tokens=0,
        num_preemptions=0,
    )


def parent_bridge(checkout: Path) -> type[Any]:
    """``PolicyBridge`` of another checkout's plugin (its bridge module alone, under its own name)."""
    path = checkout / "vllm_plugin" / "slo_vllm_plugin" / "bridge.py"
    spec = importlib.util.spec_from_file_location("parent_bridge", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"no bridge module at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["parent_bridge"] = module
    spec.loader.exec_module(module)
    cls: type[Any] = module.PolicyBridge
    return cls


def measure(
    queued: int, steps: int, seed: int = 0, parent: type[Any] | None = None, running_n: int = RUNNING
) -> dict[str, float]:
    """Median ms of a decision over ``queued`` requests, ``running_n`` of them running, shipped and
    with every snapshot rebuilt (and by ``parent``, another checkout's bridge, when given)."""
    if not 0 < running_n < queued:
        raise ValueError(f"{running_n} running of {queued} queued: some must run and some wait")
    rng = random.Random(seed)
    now = [1000.0]
    shipped = PolicyBridge(make_engine_policy("gmax", {}), clock=lambda: now[0])
    rebuilt = PolicyBridge(make_engine_policy("gmax", {}), clock=lambda: now[0])
    bridges: dict[str, Any] = {"shipped": shipped, "rebuilt": rebuilt}
    if parent is not None:
        bridges["parent"] = parent(make_engine_policy("gmax", {}), clock=lambda: now[0])
    waiting = [_request(rng, i, now[0]) for i in range(queued - running_n)]
    running = [_request(rng, queued + i, now[0]) for i in range(running_n)]
    for r in running:
        r.num_computed_tokens = r.num_prompt_tokens
        r.num_output_tokens = 1
    next_id = 2 * queued
    times: dict[str, list[float]] = {name: [] for name in bridges}
    times["policy"] = []

    def engine(t: float) -> EngineView:
        return EngineView(
            now_s=t,
            step=0,
            max_num_seqs=running_n,
            max_num_batched_tokens=8192,
            kv_blocks_total=200_000,
            kv_blocks_free=4_000,
            block_size=16,
            profile=PROFILE,
        )

    policy_time = [0.0]
    for bridge in (shipped, rebuilt):  # the policy's own time, read for the shipped bridge
        decide = bridge.guard.decide

        def timed(*args: Any, _decide: Any = decide) -> Any:
            t0 = time.process_time()
            out = _decide(*args)
            policy_time[0] = time.process_time() - t0
            return out

        bridge.guard.decide = timed  # type: ignore[method-assign]
    for step in range(steps):
        now[0] += 0.03
        for r in running:  # a decode step
            r.num_computed_tokens = r.num_prompt_tokens + r.num_output_tokens
            r.num_output_tokens += 1
        for _ in range(2):  # two finish, two are admitted, two arrive
            done = running.pop(rng.randrange(len(running)))
            for b in bridges.values():
                b.call_ended(done, "stop")
                b.forget([done.request_id])
            running.append(waiting.pop(0))
            waiting.append(_request(rng, next_id, now[0]))
            next_id += 1
        names = list(bridges)
        k = step % len(names)
        decisions = {}
        for name in names[k:] + names[:k]:  # each bridge first in turn
            b = bridges[name]
            if b is rebuilt:
                b._snapshots = {}  # every snapshot built anew: the bridge before reuse
            t0 = time.process_time()
            d = b.decide(waiting, running, engine)
            took = time.process_time() - t0
            decisions[name] = (d.admit, d.preempt, d.running_order, d.token_budget)
            if step >= 2:  # the first decisions fill the policies' tables
                times[name].append(took)
                if b is shipped:
                    times["policy"].append(policy_time[0])
        if len(set(decisions.values())) > 1:
            raise SystemExit(f"step {step}: the bridges decided differently")
    return {k: statistics.median(v) * 1000.0 for k, v in times.items()}


def shape(text: str) -> tuple[int, int]:
    """``QUEUED:RUNNING`` (or ``QUEUED``, with :data:`RUNNING` running) as a pair."""
    queued, _, running_n = text.partition(":")
    return int(queued), int(running_n) if running_n else RUNNING


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``ms = base + per_request · queued`` through ``(queued, ms)`` points: (base ms,
    µs a request), the form of the simulator's ``DecisionCost``."""
    if len({q for q, _ in points}) < 2:
        raise ValueError("a line needs two queue sizes")
    slope, intercept = statistics.linear_regression([q for q, _ in points], [t for _, t in points])
    return intercept, slope * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes",
        type=shape,
        nargs="+",
        default=[(1000, RUNNING), (5000, RUNNING)],
        help=f"QUEUED or QUEUED:RUNNING ({RUNNING} running unless given)",
    )
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--parent", type=Path, default=None, help="another checkout, whose bridge decides beside")
    args = ap.parse_args()
    parent = parent_bridge(args.parent) if args.parent is not None else None
    load = os.getloadavg()
    lines = [
        "# GMAX's decision inside the vLLM plugin (bench/plugin_decision_cost.py)",
        "",
        f"{os.cpu_count()} CPUs, 1-min load average at start {load[0]:.2f}; medians over "
        f"{args.steps - 2} engine steps, process CPU time.",
        "",
        "| queued | running | bridge decision, snapshots rebuilt (before) ms "
        "| bridge decision, snapshots kept ms | of which GMAX.decide ms | before / kept |"
        + (" parent's bridge ms | parent / kept |" if parent else ""),
        "|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if parent else ""),
    ]
    if parent is not None:
        lines[2] += f" The parent: the bridge of {args.parent}."
    kept: list[tuple[int, float]] = []
    for n, running_n in args.sizes:
        m = measure(n, args.steps, parent=parent, running_n=running_n)
        kept.append((n, m["shipped"]))
        lines.append(
            f"| {n} | {running_n} | {m['rebuilt']:.2f} | {m['shipped']:.2f} | {m['policy']:.2f} "
            f"| {m['rebuilt'] / m['shipped']:.2f}x |"
            + (f" {m['parent']:.2f} | {m['parent'] / m['shipped']:.2f}x |" if parent else "")
        )
        print(lines[-1], flush=True)
    if len({q for q, _ in kept}) > 1:
        base, per_us = fit_line(kept)
        worst = max(abs(base + per_us / 1000.0 * q - t) / t for q, t in kept)
        lines += [
            "",
            f"Least squares through the shipped bridge's rows: {base:.2f} ms + {per_us:.2f} µs a request "
            f"queued (the simulator's `DecisionCost(base_s, per_request_s)`); largest error {worst:.0%} "
            "of a row.",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
