"""Output-length bounds: quantile formulas, learning from prompts, refinement invariants, shipped model."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.predict import BoundQuery, OutputBoundEstimator, load_estimator
from slo_core.predict.forest import conditional_quantile, weighted_quantile
from slo_core.predict.training import LengthRow, shipped_rows, split, train_estimator


def synthetic_rows(n: int, seed: int) -> list[LengthRow]:
    """'brief' prompts answer in ~20 tokens, 'essay' prompts in ~400."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        long = i % 2 == 0
        topic = rng.choice(["cats", "rivers", "markets", "stars"])
        prompt = f"write an essay about {topic}" if long else f"brief answer: what are {topic}?"
        out = int(rng.gauss(400, 60)) if long else int(rng.gauss(20, 4))
        rows.append(LengthRow(f"s{seed}-{i}", prompt, len(prompt.split()), max(1, out), "latency"))
    return rows


@pytest.fixture(scope="module")
def est() -> OutputBoundEstimator:
    return train_estimator(synthetic_rows(300, 0), n_trees=10, min_samples_leaf=5)


def test_weighted_quantile_small_cases() -> None:
    v = np.array([1.0, 2.0, 3.0, 4.0])
    w = np.ones(4)
    assert weighted_quantile(v, w, 0.5) == 2.0
    assert weighted_quantile(v, w, 0.75) == 3.0
    assert weighted_quantile(v, w, 0.95) == 4.0
    assert weighted_quantile(v, np.array([0.1, 0.1, 0.1, 0.7]), 0.3) == 3.0
    # conditioning on "longer than 2" keeps {3, 4}
    assert conditional_quantile(v, w, 0.5, 2.0) == 3.0
    assert np.isnan(conditional_quantile(v, w, 0.5, 4.0))


def test_bounds_follow_the_prompt_and_cover_held_out_lengths(est: OutputBoundEstimator) -> None:
    short = est.bound("brief answer: what are cats?", 5, "latency", 4096)
    long = est.bound("write an essay about cats", 5, "latency", 4096)
    assert short < 60 < 350 < long
    held = synthetic_rows(200, 1)
    bounds = est.bounds([BoundQuery(r.prompt, r.prompt_tokens, r.kind, 4096) for r in held])
    coverage = np.mean([r.output_tokens <= b for r, b in zip(held, bounds, strict=True)])
    assert coverage >= 0.9


def test_bound_is_capped_by_max_tokens(est: OutputBoundEstimator) -> None:
    assert est.bound("write an essay about stars", 5, "latency", 100) == 100


def test_refinement_loosens_once_generation_passes_the_bound(est: OutputBoundEstimator) -> None:
    prompt = "brief answer: what are rivers?"
    b0 = est.bound(prompt, 5, "latency", 4096)
    assert est.refine(b0, prompt, 5, 10, None, "latency", 4096) == b0  # before the first checkpoint
    passed = est.refine(b0, prompt, 5, 120, None, "latency", 4096)
    assert passed > 120 >= b0
    # with generated text, the estimate is re-featurized and still honours the invariants
    text = est.refine(b0, prompt, 5, 120, " and so on" * 30, "latency", 4096)
    assert text > 120


def test_batch_equals_single_calls(est: OutputBoundEstimator) -> None:
    qs = [
        BoundQuery("write an essay about markets", 6, "latency", 4096),
        BoundQuery(None, 40, "deadline", 300),
        BoundQuery("brief answer: what are stars?", 5, "latency", 4096, 60, None, 25),
    ]
    single = [
        est.bound(qs[0].prompt_text, 6, "latency", 4096),
        est.bound(None, 40, "deadline", 300),
        est.refine(25, qs[2].prompt_text, 5, 60, None, "latency", 4096),
    ]
    assert est.bounds(qs) == single


@settings(max_examples=60, deadline=None)
@given(
    prompt_tokens=st.integers(1, 5000),
    max_tokens=st.integers(1, 5000),
    start=st.integers(1, 6000),
    gens=st.lists(st.integers(0, 5000), min_size=1, max_size=5),
    text=st.one_of(st.none(), st.text(max_size=40)),
)
def test_refined_bounds_never_below_generated_and_only_loosen(
    est: OutputBoundEstimator,
    prompt_tokens: int,
    max_tokens: int,
    start: int,
    gens: list[int],
    text: str | None,
) -> None:
    previous = start
    for g in sorted(min(g, max_tokens) for g in gens):
        b = est.refine(previous, text, prompt_tokens, g, text, "latency", max_tokens)
        assert b >= g
        assert b <= max_tokens
        assert b > g or g == max_tokens
        assert b >= min(previous, max_tokens)
        previous = b


def test_shipped_artefact_covers_the_held_back_split() -> None:
    est = load_estimator()
    held = split(shipped_rows())[1][::8]  # ~300 rows, deterministic
    bounds = est.bounds([BoundQuery(r.prompt, r.prompt_tokens, r.kind, 4096) for r in held])
    coverage = np.mean([min(r.output_tokens, 4096) <= b for r, b in zip(held, bounds, strict=True)])
    assert coverage >= 0.9
    ratio = np.median([b / min(r.output_tokens, 4096) for r, b in zip(held, bounds, strict=True)])
    assert ratio < 4.0  # tighter than a blanket cap (max_tokens / median length ≈ 30)


def test_schedules_equal_step_by_step_refinement(est: OutputBoundEstimator) -> None:
    queries = [
        BoundQuery("write an essay about rivers", 5, "latency", 700),
        BoundQuery("brief answer: what are markets?", 6, "latency", 4096),
        BoundQuery(None, 30, "deadline", 333),
    ]
    for q, schedule in zip(queries, est.schedules(queries), strict=True):
        b0 = est.bound(q.prompt_text, q.prompt_tokens, q.kind, q.max_tokens)
        assert schedule.at(0) == b0
        for g in (1, 49, 50, 120, 399, 400, 401, 650, q.max_tokens - 1, q.max_tokens):
            expected = est.refine(b0, q.prompt_text, q.prompt_tokens, g, None, q.kind, q.max_tokens)
            assert schedule.at(g) == expected, (q, g)


def test_text_free_schedules_are_shared_between_equal_requests(est: OutputBoundEstimator) -> None:
    qs = [BoundQuery(None, 40, "latency", 500), BoundQuery(None, 41, "latency", 500)] * 3
    first = est.schedules(qs)
    assert first[0] is first[2] is first[4] and first[1] is first[3]
    again = est.schedules(qs[:2])
    assert again[0] is first[0] and again[1] is first[1]


def test_compound_calls_are_bounded_at_their_own_quantile(est: OutputBoundEstimator) -> None:
    held = [r for r in synthetic_rows(400, 2) if r.prompt.startswith("write an essay")]

    def coverage(kind: str) -> float:
        bounds = est.bounds([BoundQuery(r.prompt, r.prompt_tokens, kind, 4096) for r in held])
        return float(np.mean([r.output_tokens <= b for r, b in zip(held, bounds, strict=True)]))

    prompt = "write an essay about rivers"
    original = est.params
    try:
        est.params = original.model_copy(update={"compound_quantile": None})
        assert est.bound(prompt, 5, "compound", 4096) == est.bound(prompt, 5, "deadline", 4096)
        est.params = original.model_copy(update={"quantile": 0.95, "compound_quantile": 0.5})
        call = est.bound(prompt, 5, "compound", 4096)
        alone = est.bound(prompt, 5, "deadline", 4096)
        assert 350 < call < alone, "a compound call's bound is the lower quantile"
        assert 0.3 <= coverage("compound") <= 0.7 and coverage("deadline") >= 0.9
        # the simulator's precomputed schedules follow the same rule
        (sched,) = est.schedules([BoundQuery(None, 5, "compound", 4096)])
        (plain,) = est.schedules([BoundQuery(None, 5, "deadline", 4096)])
        assert sched.at(0) < plain.at(0)
    finally:
        est.params = original
    assert original.compound_quantile is None and original.quantile == 0.95  # the shipped defaults


@settings(max_examples=300, deadline=None)
@given(
    every=st.integers(1, 64),
    cap=st.integers(1, 600),
    bounds=st.lists(st.integers(0, 700), min_size=1, max_size=8),
    g=st.integers(-3, 800),
)
def test_held_bound_is_the_bound_at_every_count_until_it_says(
    every: int, cap: int, bounds: list[int], g: int
) -> None:
    """The simulator asks ``held`` once and reuses the bound for counts up to ``until``."""
    from slo_core.predict.estimator import BoundSchedule

    sched = BoundSchedule(every_tokens=every, max_tokens=cap, bounds_tokens=tuple(bounds))
    bound, until = sched.held(g)
    assert bound == sched.at(g)
    assert until > max(g, 0)
    for h in range(max(g, 0), min(until, max(g, 0) + 2000)):
        assert sched.at(h) == bound, (h, until)
