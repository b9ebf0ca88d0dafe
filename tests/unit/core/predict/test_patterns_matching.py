"""Incremental pattern matching, decayed-reuse eviction and k-medoids compaction."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.predict.pattern_store import (
    MatchParams,
    PatternHistory,
    distance_matrix,
    kmedoids,
    stage_similarity,
)
from slo_core.predict.patterns import PatternGraph, Stage, gaussian_kernel, stage_sub_deadline_s


def chain(idents: str, outs: list[float], durations: list[float]) -> PatternGraph:
    return PatternGraph(tuple(Stage(i, o, 100, d) for i, o, d in zip(idents, outs, durations, strict=True)))


def test_prefix_pruning_uses_the_identity_of_the_starting_stage() -> None:
    h = PatternHistory()
    h.add(chain("ats", [100, 0, 50], [1, 1, 8]))  # a LLM, then tool t: φ(2) = 0.2
    h.add(chain("aas", [100, 80, 50], [1, 3, 6]))  # a LLM, then LLM a: φ(2) = 0.4
    for nxt, share in (("t", 0.2), ("a", 0.4)):
        m = h.matcher()
        m.observe(Stage("a", 100, 100, 1.0))
        assert m.next_share(nxt) == pytest.approx(share, rel=1e-3)
    m = h.matcher()
    m.observe(Stage("b", 100, 100, 1.0))  # no stored pattern starts with b
    assert m.next_share() is None


def test_gaussian_similarity_picks_the_closest_lengths() -> None:
    h = PatternHistory()
    h.add(chain("aa", [100, 10], [1, 1]))  # φ(1) = 0.5
    h.add(chain("aa", [1000, 10], [1, 3]))  # φ(1) = 0.25
    h.add(chain("a", [120], [5]))  # too short to say anything about a second stage
    m = h.matcher()
    m.observe(Stage("a", 130, 100, 1.0))
    assert m.best() == 0
    m2 = h.matcher()
    m2.observe(Stage("a", 900, 100, 1.0))
    assert m2.best() == 1
    assert m2.next_share("a") == 1.0  # the matched graph's second stage is its last


def test_reuse_decays_per_hour_and_the_least_reused_graph_is_evicted() -> None:
    h = PatternHistory(MatchParams(capacity=2))
    g = chain("a", [10], [1])
    h.add(g, now_s=0.0)
    h.add(chain("b", [10], [1]), now_s=0.0)
    h.touch(0, now_s=0.0)
    h.touch(0, now_s=0.0)
    assert h.decayed_reuse(3600.0).tolist() == pytest.approx([3 * 0.9, 0.9])
    row = h.add(chain("c", [10], [1]), now_s=7200.0)
    assert row == 1 and len(h) == 2
    m = h.matcher()
    m.observe(Stage("c", 10, 100, 1.0))
    assert m.best() is None  # c has no second stage, but it is stored
    assert h.ident[1, 0] == chain("c", [10], [1]).stages[0].ident_code


def test_kmedoids_separates_two_families_and_compaction_sums_reuse() -> None:
    rng = random.Random(0)
    short = [chain("aa", [rng.uniform(9, 11), 5], [1, 1]) for _ in range(6)]
    long = [chain("abab", [rng.uniform(900, 1100), 0, 50, 50], [1, 2, 3, 4]) for _ in range(6)]
    graphs = short + long
    medoids, labels = kmedoids(distance_matrix(graphs, MatchParams()), 2, random.Random(1))
    assert sorted(m // 6 for m in medoids) == [0, 1]
    assert len(set(labels[:6])) == 1 and len(set(labels[6:])) == 1
    h = PatternHistory()
    for g in graphs:
        h.add(g)
    h.compact(2, random.Random(1))
    assert len(h) == 2
    assert sorted(h.decayed_reuse(0.0).tolist()) == [6.0, 6.0]


stage_st = st.builds(
    Stage,
    st.sampled_from(["a", "b", "t"]),
    st.floats(0, 5000),
    st.floats(0, 5000),
    st.floats(0.001, 100),
)


@settings(max_examples=60, deadline=None)
@given(
    history=st.lists(st.lists(stage_st, min_size=1, max_size=6), min_size=1, max_size=8),
    running=st.lists(stage_st, min_size=2, max_size=6),
    deadline=st.floats(0.1, 1e4),
)
def test_matched_sub_deadlines_never_exceed_the_deadline(
    history: list[list[Stage]], running: list[Stage], deadline: float
) -> None:
    h = PatternHistory()
    for stages in history:
        h.add(PatternGraph(tuple(stages)))
    m = h.matcher()
    for s in range(len(running) - 1):
        m.observe(running[s])
        share = m.next_share(running[s + 1].ident, now_s=float(s))
        if share is not None:
            assert 0.0 < share <= 1.0
            assert stage_sub_deadline_s(share, deadline) <= deadline


def test_tracker_learns_from_finished_programs() -> None:
    from slo_core.predict.compound import CompoundTracker

    tracker = CompoundTracker()
    # nothing stored yet: the caller keeps its own rule
    assert tracker.sub_deadline_at_s("p1", "search", 0.0, 100.0) is None
    for st_ in (Stage("plan", 100, 50, 2.0), Stage("search", 0, 40, 2.0), Stage("answer", 300, 900, 6.0)):
        tracker.stage_finished("p1", st_)
    assert len(tracker.finish("p1", now_s=10.0)) == 3
    tracker.stage_finished("p2", Stage("plan", 110, 50, 1.5))
    # the search stage of a plan→search→answer program ends at 40 % of its time
    assert tracker.sub_deadline_at_s("p2", "search", 5.0, 100.0) == pytest.approx(45.0, rel=1e-3)
    assert tracker.sub_deadline_at_s("p2", "unknown-tool", 5.0, 100.0) is None


def test_vectorized_distances_equal_the_pairwise_definition() -> None:
    rng = random.Random(3)
    graphs = [
        PatternGraph(
            tuple(
                Stage(rng.choice("ab"), rng.uniform(0, 500), rng.uniform(1, 900), rng.uniform(0.1, 5))
                for _ in range(rng.randint(1, 5))
            )
        )
        for _ in range(12)
    ]
    h = PatternHistory()
    for g in graphs:
        h.add(g)
    stored = [h.graph(i) for i in range(len(h))]  # compare on the stored (quantized) graphs
    assert h.distances() == pytest.approx(distance_matrix(stored, MatchParams()), abs=1e-9)


@pytest.mark.parametrize("shape", [(0,), (1,), (5,), (12,), (13,), (700,), (9, 4)])
def test_stage_similarity_is_the_two_kernels_bit_for_bit(shape: tuple[int, ...]) -> None:
    # one exp call over both kernels' arguments: each value the separate calls give (sizes on either
    # side of detmath's scalar/array switch, a matrix as distances() passes)
    rng = np.random.default_rng(len(shape) * 100 + shape[0])
    node, edge = rng.normal(4.0, 2.0, shape), rng.normal(6.0, 3.0, shape)
    ref_n, ref_e = (
        (rng.normal(4.0, 2.0, shape[1:]), rng.normal(6.0, 3.0, shape[1:])) if len(shape) > 1 else (4.2, 5.9)
    )
    p = MatchParams(sigma_node=0.4, sigma_edge=0.7, node_weight=0.3)
    want = p.node_weight * gaussian_kernel(node, ref_n, p.sigma_node)
    want += (1.0 - p.node_weight) * gaussian_kernel(edge, ref_e, p.sigma_edge)
    got = stage_similarity(node, ref_n, edge, ref_e, p)
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes()
