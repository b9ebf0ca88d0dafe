"""Pattern graphs: accumulated shares, sub-deadlines, compact bytes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.predict.patterns import PatternGraph, Stage, stage_sub_deadline_s


def test_accumulated_share_and_sub_deadline() -> None:
    g = PatternGraph((Stage("llm", 100, 50, 1.0), Stage("search", 0, 20, 1.0), Stage("llm", 300, 900, 2.0)))
    assert g.shares().tolist() == [0.25, 0.5, 1.0]
    # D_s = φ(s)·D: with a 60 s deadline the second stage must end by 30 s
    assert stage_sub_deadline_s(g.shares()[1], 60.0) == 30.0
    assert stage_sub_deadline_s(1.7, 60.0) == 60.0


def test_bytes_round_trip_and_size() -> None:
    stages = tuple(Stage(f"m{i % 3}", 37 * i + 1, 1000 * i + 5, 0.5 + i, 1 + i % 4) for i in range(20))
    g = PatternGraph(stages)
    data = g.to_bytes()
    assert len(data) == 2 + 9 * 20 < 200
    back = PatternGraph.from_bytes(data)
    for a, b in zip(g.stages, back.stages, strict=True):
        assert a.ident_code == b.ident_code and a.calls == b.calls
        assert b.output_tokens == pytest.approx(a.output_tokens, rel=1e-3)
        assert b.input_tokens == pytest.approx(a.input_tokens, rel=1e-3)
        assert b.duration_s == pytest.approx(a.duration_s, rel=1e-3)
    with pytest.raises(ValueError, match="bad pattern graph"):
        PatternGraph.from_bytes(data[:-1])


@settings(max_examples=100, deadline=None)
@given(
    durations=st.lists(st.floats(0.0, 1e4), min_size=1, max_size=30),
    deadline=st.floats(0.0, 1e5),
)
def test_sub_deadlines_never_exceed_the_deadline_and_grow_with_stages(
    durations: list[float], deadline: float
) -> None:
    g = PatternGraph(tuple(Stage("m", 10, 10, d) for d in durations))
    subs = [stage_sub_deadline_s(phi, deadline) for phi in g.shares()]
    assert all(0.0 <= s <= deadline for s in subs)
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(subs))
    assert subs[-1] == pytest.approx(deadline)
