"""Pattern-graph matching (JITServe §4.1): next-stage share error vs stages seen, latency vs history size.

Two workloads:
- ``tot``: the shipped Tree-of-Thoughts Game-of-24 log (100 tasks, 4 BFS steps = 8 stages: propose,
  value). Per-stage tokens are derived: proposal outputs from the logged proposal lines, value-call
  outputs and all prompts apportioned from each task's logged token usage by call counts. Matched
  leave-one-out.
- ``research``: synthetic deep-research DAGs (plan → r × [web search, k parallel reads, reflect] →
  answer), r and lengths driven by a latent difficulty. 2,000 history graphs, 300 test graphs.
Stage times use a simple model: 0.1 s + 25 ms per output token of the longest call + 0.25 ms per
input token of the stage; tools take their drawn execution time.

Error: |φ̂(s+1) − φ(s+1)| for the stage starting after s seen (its model/tool known), for the best
match (the paper), the mean of the 8 best matches, an equal-split baseline φ = (s+1)/n̄ (n̄ = mean
stage count in history, at least s+1), and Appendix A's alternatives (the stage gets t_s/t_total of
the deadline, or t_s/t_≥s of the time left, after the request's true elapsed share).

    .venv/bin/python bench/predictor_eval/pattern_graphs.py --json bench/predictor_eval/pattern_graphs.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from slo_core.data import path as data_path
from slo_core.predict.pattern_store import MatchParams, PatternHistory
from slo_core.predict.patterns import PatternGraph, Stage
from slo_core.wire.tokens import approx_tokens


def _llm_time_s(out_longest: float, in_total: float) -> float:
    return 0.1 + 0.025 * out_longest + 0.00025 * in_total


def tot_graphs() -> list[PatternGraph]:
    with gzip.open(data_path("tot_game24_bfs_log.json.gz"), "rt", encoding="utf-8") as fh:
        tasks = json.load(fh)
    graphs = []
    prev_c = prev_p = 0
    for t in tasks:
        usage = t["usage_so_far"]
        completion = usage["completion_tokens"] - prev_c
        prompt = usage["prompt_tokens"] - prev_p
        prev_c, prev_p = usage["completion_tokens"], usage["prompt_tokens"]
        steps = t["steps"]
        propose_out = [sum(approx_tokens(y.rstrip("\n").split("\n")[-1]) for y in s["new_ys"]) for s in steps]
        value_calls = [3 * len(s["new_ys"]) for s in steps]
        propose_calls = [len(s["ys"]) for s in steps]
        value_out_total = max(len(steps), completion - sum(propose_out))
        calls = sum(value_calls) + sum(propose_calls)
        per_call_in = prompt / calls
        stages = []
        for po, pc, vc in zip(propose_out, propose_calls, value_calls, strict=True):
            vo = value_out_total * vc / sum(value_calls)
            stages.append(Stage("gpt-4", po, pc * per_call_in, _llm_time_s(po / pc, pc * per_call_in), pc))
            stages.append(Stage("gpt-4", vo, vc * per_call_in, _llm_time_s(vo / vc, vc * per_call_in), vc))
        graphs.append(PatternGraph(tuple(stages)))
    return graphs


def research_graph(rng: random.Random) -> PatternGraph:
    difficulty = rng.random()
    stages = [Stage("qwen-72b", math.exp(rng.gauss(4.5 + 1.2 * difficulty, 0.25)), 400, 0.0)]
    rounds = 1 + min(3, int(difficulty * 4 + rng.gauss(0, 0.4)) if difficulty > 0.1 else 0)
    for r in range(rounds):
        k = rng.randint(2, 5)
        stages.append(Stage("web-search", 0, 60 * k, k * math.exp(rng.gauss(0.3, 0.3)), k))
        outs = [math.exp(rng.gauss(5.0 + 0.5 * difficulty, 0.4)) for _ in range(k)]
        stages.append(Stage("qwen-7b", sum(outs), 1800.0 * k, _llm_time_s(max(outs), 1800.0 * k), k))
        last = r == rounds - 1
        stages.append(Stage("qwen-72b", math.exp(rng.gauss(3.8 + (0.3 if last else 0.8), 0.3)), 1500, 0.0))
    stages.append(Stage("qwen-72b", math.exp(rng.gauss(6.0 + 0.5 * difficulty, 0.3)), 3000, 0.0))
    timed = [
        st
        if st.ident == "web-search" or st.duration_s > 0
        else Stage(
            st.ident, st.output_tokens, st.input_tokens, _llm_time_s(st.output_tokens, st.input_tokens)
        )
        for st in stages
    ]
    return PatternGraph(tuple(timed))


def share_errors(history: PatternHistory, tests: list[PatternGraph]) -> dict[int, list[tuple[float, ...]]]:
    """stages seen → [(best-match, top-8, equal-split, Appendix A t_s/t_total, t_s/t_≥s) errors].

    The next stage's identity is known. The Appendix A alternatives start from the request's true
    elapsed share φ(s) and give the starting stage t_s/t_total of D, or t_s/t_≥s of the time left.
    """
    n_bar = float(np.mean(history.n_stages[: len(history)]))
    top8 = MatchParams(**{**history.params.model_dump(), "top_k": 8})
    out: dict[int, list[tuple[float, ...]]] = defaultdict(list)
    for g in tests:
        truth = g.shares()
        m = history.matcher()
        for s in range(len(g) - 1):
            m.observe(g.stages[s])
            nxt = g.stages[s + 1]
            base = (s + 2) / max(s + 2.0, n_bar)
            phi = m.next_share(nxt.ident)
            saved, history.params = history.params, top8
            phi8 = m.next_share(nxt.ident)
            history.params = saved
            row = m.best(nxt.ident)
            per_stage = remaining = None
            if row is not None:
                before = float(history.share[row, s - 1]) if s > 0 else 0.0  # matched φ before it
                t_next = float(history.share[row, s]) - before  # t_s / t_total of the matched graph
                per_stage = truth[s] + t_next
                remaining = truth[s] + (1.0 - truth[s]) * t_next / max(1e-12, 1.0 - before)
            errs = [
                abs((base if p is None else p) - truth[s + 1])
                for p in (phi, phi8, base, per_stage, remaining)
            ]
            out[s + 1].append(tuple(errs))
    return out


def summarize(errors: dict[int, list[tuple[float, ...]]]) -> list[dict[str, float]]:
    rows = []
    for s in sorted(errors):
        e = np.asarray(errors[s])
        rows.append(
            {
                "stages_seen": s,
                "n": len(e),
                "matched_mean_abs_error": round(float(e[:, 0].mean()), 4),
                "top8_mean_abs_error": round(float(e[:, 1].mean()), 4),
                "equal_split_mean_abs_error": round(float(e[:, 2].mean()), 4),
                "appendix_a_ts_over_total_error": round(float(e[:, 3].mean()), 4),
                "appendix_a_ts_over_rest_error": round(float(e[:, 4].mean()), 4),
            }
        )
    return rows


def tot_leave_one_out(graphs: list[PatternGraph]) -> list[dict[str, float]]:
    errors: dict[int, list[tuple[float, ...]]] = defaultdict(list)
    for i, g in enumerate(graphs):
        h = PatternHistory()
        for j, other in enumerate(graphs):
            if j != i:
                h.add(other)
        for s, e in share_errors(h, [g]).items():
            errors[s] += e
    return summarize(errors)


def matching_latency_us(history: PatternHistory, tests: list[PatternGraph]) -> float:
    """Median µs per stage step (observe + next_share) over the test graphs."""
    per_step = []
    for g in tests:
        t0 = time.perf_counter()
        m = history.matcher()
        for s in range(len(g) - 1):
            m.observe(g.stages[s])
            m.next_share(g.stages[s + 1].ident)
        per_step.append((time.perf_counter() - t0) / max(1, len(g) - 1))
    return round(float(np.median(per_step)) * 1e6, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    result: dict[str, object] = {}

    tot = tot_graphs()
    result["tot_bytes_per_graph"] = max(len(g.to_bytes()) for g in tot)
    result["tot_share_error"] = tot_leave_one_out(tot)

    hist_graphs = [research_graph(rng) for _ in range(2000)]
    tests = [research_graph(rng) for _ in range(300)]
    history = PatternHistory()
    for g in hist_graphs:
        history.add(g)
    result["research_bytes_per_graph_max"] = max(len(g.to_bytes()) for g in hist_graphs)
    result["research_share_error"] = summarize(share_errors(history, tests))

    small = PatternHistory()
    for g in hist_graphs[:500]:
        small.add(g)
    t0 = time.perf_counter()
    small.compact(50, random.Random(args.seed))
    compact_s = time.perf_counter() - t0
    full500 = PatternHistory()
    for g in hist_graphs[:500]:
        full500.add(g)
    result["kmedoids_500_to_50"] = {
        "seconds": round(compact_s, 2),
        "full_500": summarize(share_errors(full500, tests)),
        "medoids_50": summarize(share_errors(small, tests)),
    }

    latency = {}
    for size in (100, 1000, 10_000):
        h = PatternHistory(MatchParams(capacity=size))
        while len(h) < size:
            h.add(research_graph(rng))
        latency[str(size)] = matching_latency_us(h, tests[:100])
    result["matching_us_per_stage_step_by_history_size"] = latency

    print(
        f"bytes per stored graph: ToT {result['tot_bytes_per_graph']}, "
        f"research max {result['research_bytes_per_graph_max']}"
    )
    for name in ("tot_share_error", "research_share_error"):
        print(f"\n{name}: mean |φ̂(s+1) − φ(s+1)| by stages seen s")
        print("  seen     n  best-match  top-8  equal-split  A:t_s/t_total  A:t_s/t_>=s")
        for r in result[name]:  # type: ignore[attr-defined]
            print(
                f"  {r['stages_seen']:>4} {r['n']:>5} {r['matched_mean_abs_error']:>11.4f} "
                f"{r['top8_mean_abs_error']:>6.4f} {r['equal_split_mean_abs_error']:>12.4f} "
                f"{r['appendix_a_ts_over_total_error']:>14.4f} {r['appendix_a_ts_over_rest_error']:>12.4f}"
            )
    km = result["kmedoids_500_to_50"]
    print(
        f"\nk-medoids 500 → 50 graphs in {km['seconds']} s; mean error full vs medoids: "  # type: ignore[index]
        f"{np.mean([r['matched_mean_abs_error'] for r in km['full_500']]):.4f} vs "  # type: ignore[index]
        f"{np.mean([r['matched_mean_abs_error'] for r in km['medoids_50']]):.4f}"
    )  # type: ignore[index]
    print("matching µs per stage step by history size:", latency)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
