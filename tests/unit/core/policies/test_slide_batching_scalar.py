"""SlideBatching's plain-float plan equals its numpy reference bit for bit (order, URGENT set, batch,
chunks, budget), across sequences of decisions that reuse snapshots (its per-request term cache)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slo_core.perf import load_profile
from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.float_sum import numpy_sum
from slo_core.policies.slide_batching import SlideBatching, canonical_queue, queue_metrics, term_metrics
from slo_core.slo import RequestKind, SLOTargets

PROFILE = load_profile("h100-llama3-8b-tp1")
SLOS = (
    SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.05),
    SLOTargets(RequestKind.LATENCY, ttft_s=0.5, tbt_s=0.02, priority_weight=2.0),
    SLOTargets(RequestKind.DEADLINE, deadline_s=8.0),
    SLOTargets(RequestKind.DEADLINE, deadline_s=30.0, priority_weight=0.5),
    SLOTargets(RequestKind.BEST_EFFORT),
)


@given(st.lists(st.floats(1e-7, 50.0), min_size=0, max_size=600))
@settings(max_examples=300, deadline=None)
def test_numpy_sum_is_numpys_pairwise_sum(xs: list[float]) -> None:
    assert numpy_sum(xs) == float(np.asarray(xs, dtype=float).sum())


def _view(rng: random.Random, i: int) -> RequestView:
    slo = rng.choice(SLOS)
    prompt = rng.randint(1, 6000)
    gen = rng.choice([0, 0, rng.randint(1, 400)])
    computed = rng.choice([0, prompt // 3, prompt + max(0, gen - 1), prompt + gen])
    arrival = rng.uniform(0.0, 20.0)
    deadline_at = None
    if slo.kind is RequestKind.DEADLINE and rng.random() < 0.5:
        deadline_at = arrival + rng.uniform(0.5, 40.0)
    return RequestView(
        request_id=f"r{i}",
        slo=slo,
        arrival_s=arrival,
        prompt_tokens=prompt,
        max_tokens=gen + rng.randint(1, 2000),
        generated_tokens=gen,
        computed_tokens=computed,
        deadline_at_s=deadline_at,
        output_bound=rng.choice([None, rng.randint(1, 2000)]),
    )


@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 600),  # both sides of the numpy sorts (from 256 queued)
    judgment=st.sampled_from(["aggressive", "conservative"]),
    gamma=st.sampled_from([0.25, 1.0, 4.0]),
    seqs=st.sampled_from([2, 16, 256]),
)
@settings(max_examples=120, deadline=None)
def test_plan_equals_numpy_reference(seed: int, n: int, judgment: str, gamma: float, seqs: int) -> None:
    rng = random.Random(seed)
    queue = [_view(rng, i) for i in range(n)]
    fast = SlideBatching(load_judgment=judgment, gamma=gamma)
    ref = SlideBatching(load_judgment=judgment, gamma=gamma)
    for step in range(4):  # later decisions reuse some snapshots and replace others
        if step:
            for i in rng.sample(range(len(queue)), k=min(len(queue), 3)):
                queue[i] = _view(rng, int(queue[i].request_id[1:]))
            queue = queue[: max(1, len(queue) - rng.randint(0, 2))]
            fast.observe_batch(0.02, rng.uniform(0.01, 0.04))  # β moves: cached terms are pre-β
            ref.correction = fast.correction
        cut = rng.randint(0, len(queue))
        running, waiting = queue[:cut], queue[cut:]
        view = EngineView(
            now_s=20.0 + step * 0.03,
            step=step,
            max_num_seqs=max(seqs, len(running)),
            max_num_batched_tokens=rng.choice([512, 8192]),
            kv_blocks_total=30_000,
            kv_blocks_free=rng.randint(0, 30_000),
            block_size=16,
            profile=PROFILE,
        )
        assert fast.plan(waiting, running, view) == ref.plan_reference(waiting, running, view)


@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 60),
    judgment=st.sampled_from(["aggressive", "conservative"]),
    gamma=st.sampled_from([0.25, 1.0, 4.0]),
)
@settings(max_examples=100, deadline=None)
def test_a_decision_does_not_depend_on_the_order_requests_are_listed_in(
    seed: int, n: int, judgment: str, gamma: float
) -> None:
    """The engine may list running and waiting requests in any order (twins with equal remain and
    density included: their tie is broken by arrival and id, not position)."""
    rng = random.Random(seed)
    queue = [_view(rng, i) for i in range(n)]
    queue += [replace(r, request_id=f"{r.request_id}-twin") for r in rng.sample(queue, k=n // 3)]
    rng.shuffle(queue)
    cut = rng.randint(0, len(queue))
    running, waiting = queue[:cut], queue[cut:]
    view = EngineView(
        now_s=20.0,
        step=0,
        max_num_seqs=max(16, len(running)),
        max_num_batched_tokens=rng.choice([512, 8192]),
        kv_blocks_total=30_000,
        kv_blocks_free=rng.randint(0, 30_000),
        block_size=16,
        profile=PROFILE,
    )
    policy = SlideBatching(load_judgment=judgment, gamma=gamma)
    decision = policy.decide(waiting, running, view, random.Random(0))
    shuffled = [rng.sample(running, k=len(running)), rng.sample(waiting, k=len(waiting))]
    assert (
        SlideBatching(load_judgment=judgment, gamma=gamma).decide(
            shuffled[1], shuffled[0], view, random.Random(0)
        )
        == decision
    )
    assert SlideBatching.order_free_decisions  # what the engine relies on when it leaves decisions out
    assert not decision.preempt and decision.token_budget is None and not decision.prefill_first


def _bits(values: object) -> bytes:
    return np.asarray(values, dtype=np.float64).tobytes()


@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 700),
    beta=st.sampled_from([1.0, 0.37, 1.9, 1e-9]),
    now=st.floats(0.0, 1e5),
)
@settings(max_examples=150, deadline=None)
def test_term_metrics_give_the_same_bits_as_lists_and_as_arrays(
    seed: int, n: int, beta: float, now: float
) -> None:
    """A deep queue computes its terms' exec, remain and density in numpy, a short one in lists: the
    same floats either way (execs under the 1e-6 floor and far-off dues included)."""
    rng = random.Random(seed)
    terms = [
        (
            None,
            rng.choice([0.0, 1e-7, rng.uniform(1e-5, 0.5), rng.uniform(0.5, 40.0)]),
            now + rng.uniform(-50.0, 500.0),
            rng.choice([0.5, 1.0, 2.0, 3.7]),
        )
        for _ in range(n)
    ]
    short = term_metrics(terms, beta, now, in_numpy=False)  # type: ignore[arg-type]
    deep = term_metrics(terms, beta, now, in_numpy=True)  # type: ignore[arg-type]
    for a, b in zip(short[:3], deep[:3], strict=True):
        assert _bits(a) == _bits(b)
    assert short[3:] == deep[3:]


@given(seed=st.integers(0, 10_000), n=st.integers(0, 400), arrivals=st.integers(1, 50))
@settings(max_examples=200, deadline=None)
def test_the_canonical_queue_is_ordered_by_arrival_then_id(seed: int, n: int, arrivals: int) -> None:
    """Whatever order the engine lists them in, with many requests arriving at the same instant (a
    compound stage's calls): arrival first, then id, each request once, with its waiting flag."""
    rng = random.Random(seed)
    times = [rng.uniform(0.0, 100.0) for _ in range(arrivals)]
    queue = [replace(_view(rng, i), arrival_s=rng.choice(times)) for i in range(n)]
    rng.shuffle(queue)
    cut = rng.randint(0, len(queue))
    running, waiting = queue[:cut], queue[cut:]
    ordered, is_waiting = canonical_queue(waiting, running)
    assert ordered == sorted(queue, key=lambda r: (r.arrival_s, r.request_id))
    assert is_waiting == [any(r is w for w in waiting) for r in ordered]


def _engine(rng: random.Random, step: int, running: int, seqs: int) -> EngineView:
    return EngineView(
        now_s=20.0 + step * 0.03,
        step=step,
        max_num_seqs=max(seqs, running),
        max_num_batched_tokens=rng.choice([512, 8192]),
        kv_blocks_total=30_000,
        kv_blocks_free=rng.choice([0, 3, rng.randint(0, 30_000)]),
        block_size=16,
        profile=PROFILE,
    )


@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 400),
    gamma=st.sampled_from([0.0, 0.25, 1.0, 4.0]),
    seqs=st.sampled_from([2, 16, 64, 256]),
    eta=st.sampled_from([0.025, 0.5, 5.0]),
    nan=st.booleans(),
    fresh=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_the_deep_decision_equals_the_planned_one(
    seed: int, n: int, gamma: float, seqs: int, eta: float, nan: bool, fresh: bool
) -> None:
    """decide() over a deep queue (_decide_deep: kept terms, no order of the whole queue) gives the
    Decision the plan gives, across decisions where requests join, leave, change and move between
    the queues, β moves, twins tie on every term, a due time is NaN, and the engine is full, or
    short of KV or tokens. ``fresh``: every request is yet to start, as a waiting one in an engine
    (none decodes, so where a walk may stop hangs on the prefill chunk that fits)."""
    rng = random.Random(seed)

    def make(i: int) -> RequestView:
        r = _view(rng, i)
        return replace(r, computed_tokens=0, generated_tokens=0) if fresh else r

    queue = [make(i) for i in range(n)]
    queue += [replace(r, request_id=f"{r.request_id}-twin") for r in rng.sample(queue, k=n // 4)]
    if nan:
        queue[0] = replace(queue[0], slo=SLOS[2], deadline_at_s=math.nan)
    deep = SlideBatching(gamma=gamma, eta_s=eta)
    deep.deep_from = 1  # type: ignore[misc]
    ref = SlideBatching(gamma=gamma, eta_s=eta)
    ref.deep_from = 1 << 30  # type: ignore[misc]
    new = n + 1
    for step in range(6):
        if step:
            for i in rng.sample(range(len(queue)), k=min(len(queue), 8)):
                r = queue[i]
                queue[i] = rng.choice(  # a new snapshot: of another state, or of the same terms
                    [
                        replace(make(0), request_id=r.request_id),
                        replace(r, program_attained_tokens=r.program_attained_tokens + 7),
                        replace(r, deadline_at_s=(r.deadline_at_s or 30.0) + 1.0),
                        replace(r, computed_tokens=r.computed_tokens + 1),
                        replace(r, generated_tokens=r.generated_tokens + 1),
                    ]
                )
            queue = queue[: max(1, len(queue) - rng.randint(0, 3))]
            queue += [make(new + j) for j in range(rng.randint(0, 3))]
            new += 3
            deep.observe_batch(0.02, rng.uniform(0.01, 0.04))
            ref.correction = deep.correction
        rng.shuffle(queue)
        cut = rng.randint(0, len(queue) // 2)
        running, waiting = queue[:cut], queue[cut:]
        view = _engine(rng, step, len(running), seqs)
        assert _outcome(deep, waiting, running, view) == _outcome(ref, waiting, running, view)


def _outcome(
    policy: SlideBatching, waiting: list[RequestView], running: list[RequestView], view: EngineView
) -> object:
    """The Decision, or the error's type (a NaN due time can make the plan fail: the deep path must
    fail alike, not decide otherwise)."""
    try:
        return policy.decide(waiting, running, view, random.Random(0))
    except ValueError as exc:
        return type(exc)


@given(
    seed=st.integers(0, 10_000),
    gamma=st.sampled_from([0.25, 1.0, 4.0]),
    ulps=st.integers(-2, 2),
)
@settings(max_examples=60, deadline=None)
def test_a_remain_at_the_urgent_bar_is_left_to_the_plan(seed: int, gamma: float, ulps: int) -> None:
    """The deep path sums exec in its own order, not the plan's pairwise canonical one, so its URGENT
    bar may differ from the plan's in the last bits: a request whose remain lies within that
    rounding of the bar is left to the plan (None), and decide() gives the plan's Decision."""
    rng = random.Random(seed)
    waiting = [_view(rng, i) for i in range(300)]
    running = [_view(rng, i) for i in range(300, 340)]
    view = EngineView(
        now_s=0.0,  # remain = due - 0: exact, so a due on the bar is a remain on it
        step=0,
        max_num_seqs=512,
        max_num_batched_tokens=8192,
        kv_blocks_total=30_000,
        kv_blocks_free=20_000,
        block_size=16,
        profile=PROFILE,
    )
    policy = SlideBatching(gamma=gamma)
    policy.deep_from = 1  # type: ignore[misc]

    def plan_bar(queue: list[RequestView]) -> float:
        canonical, _ = canonical_queue(queue, running)
        m = queue_metrics(canonical, 0.0, PROFILE, policy.params, policy.correction.factor)
        return gamma * (m.t_budget_s / (m.t_budget_s - m.t_c_s) * float(m.exec_s.sum()))

    pick = rng.randrange(len(waiting))
    far = replace(waiting[pick], slo=SLOS[2], deadline_at_s=1e9)  # a deadline request: due = deadline
    bar = plan_bar([*waiting[:pick], far, *waiting[pick + 1 :]])
    due = bar
    for _ in range(abs(ulps)):
        due = math.nextafter(due, math.copysign(math.inf, ulps))
    waiting[pick] = replace(far, deadline_at_s=due)
    assume(plan_bar(waiting) == bar)  # its remain did not become the queue's least (the budget)
    assert policy._decide_deep(waiting, running, view) is None
    ref = SlideBatching(gamma=gamma)
    ref.deep_from = 1 << 30  # type: ignore[misc]
    assert policy.decide(waiting, running, view, random.Random(0)) == ref.decide(
        waiting, running, view, random.Random(0)
    )
