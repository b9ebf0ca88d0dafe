"""Invariants of GMAX checked with hypothesis: valid decisions, bounds, sub-deadlines, window optimality."""

from __future__ import annotations

import random
from dataclasses import fields, replace
from typing import Any

import numpy as np
from builders import request
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.gmax import GMAX
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_priority import Lengths, SpeedModel, estimate, lengths
from slo_core.policies.gmax_select import best_window, cutoff_mask
from slo_core.policies.gmax_snapshot import KIND_CODES, Columns, SnapshotTable
from slo_core.slo import RequestKind, SLOTargets

SLOS = [
    SLOTargets(RequestKind.LATENCY, ttft_s=2.0, tbt_s=0.1),
    SLOTargets(RequestKind.LATENCY, ttft_s=0.5, tbt_s=0.02, priority_weight=2.0),
    SLOTargets(RequestKind.DEADLINE, deadline_s=20.0),
    SLOTargets(RequestKind.COMPOUND, deadline_s=60.0),
    SLOTargets(RequestKind.BEST_EFFORT),
]
SPEED = SpeedModel(step_s=0.03, prefill_s_per_token=0.0002, prefill_s_per_token_ctx=1e-8, budget_tokens=2048)


@st.composite
def requests(draw: st.DrawFn, prefix: str, running: bool) -> list[RequestView]:
    n = draw(st.integers(0, 12))
    out = []
    for i in range(n):
        slo = draw(st.sampled_from(SLOS))
        prompt = draw(st.integers(1, 4000))
        gen = draw(st.integers(0, 3000))
        max_tokens = draw(st.integers(1, 4096))
        compound = slo.kind is RequestKind.COMPOUND
        kw: dict[str, Any] = {
            "bound": draw(st.none() | st.integers(1, 5000)),
            "true_output_tokens": draw(st.none() | st.integers(1, 5000)),
            "deadline_at_s": draw(st.none() | st.floats(-100, 200)),
            "program_deadline_at_s": draw(st.none() | st.floats(-100, 200)) if compound else None,
            "program_id": f"p{draw(st.integers(0, 2))}" if compound else None,
            "stage": draw(st.integers(0, 3)) if compound else None,
            "program_attained_tokens": draw(st.integers(0, 1000)) if compound else 0,
            "tenant": draw(st.sampled_from(["a", "b"])),
            "waiting_since_s": None if running else draw(st.none() | st.floats(-100, 10)),
        }
        arrival_s = draw(st.floats(-100, 10))  # drawn before the computed tokens, as ever
        computed = prompt + gen if running else draw(st.integers(0, prompt))
        out.append(
            request(
                f"{prefix}{i}",
                slo,
                arrival_s=arrival_s,
                prompt=prompt,
                max_tokens=max_tokens,
                gen=gen,
                computed_tokens=computed,
                **kw,
            )
        )
    return out


engines = st.builds(
    EngineView,
    now_s=st.floats(0, 20),
    step=st.integers(0, 500),
    max_num_seqs=st.integers(1, 16),
    max_num_batched_tokens=st.integers(16, 8192),
    kv_blocks_total=st.just(10_000),
    kv_blocks_free=st.integers(0, 10_000),
)
params = st.fixed_dictionaries(
    {
        "goodput": st.sampled_from(["token", "request", "tempo", "tdg"]),
        "length_source": st.sampled_from(["analyzer", "oracle", "mean"]),
        "ordering": st.sampled_from(["gmax", "sjf"]),
        "fairness": st.sampled_from([0.0, 0.3]),
        "max_wait_s": st.none() | st.just(5.0),
    }
)


@settings(max_examples=150, deadline=None)
@given(requests("w", False), requests("r", True), engines, params)
def test_decisions_are_well_formed_and_deterministic(
    waiting: list[RequestView], running: list[RequestView], eng: EngineView, kw: dict[str, Any]
) -> None:
    d = GMAX(**kw).decide(waiting, running, eng, random.Random(1))
    w_ids = [r.request_id for r in waiting]
    r_ids = [r.request_id for r in running]
    assert len(set(d.admit)) == len(d.admit) and set(d.admit) <= set(w_ids)
    assert set(d.reject) <= set(w_ids) and not set(d.reject) & set(d.admit)
    assert set(d.admit) | set(d.reject) == set(w_ids)  # every waiting request is ordered or dropped
    assert set(d.preempt) <= set(r_ids)
    assert d.running_order is not None
    assert sorted(d.running_order) == sorted(set(r_ids) - set(d.preempt))
    again = GMAX(**kw).decide(waiting, running, eng, random.Random(1))
    assert again == d


@settings(max_examples=150, deadline=None)
@given(requests("w", False), requests("r", True), st.floats(0, 20), params)
def test_estimates_respect_generated_tokens_and_deadlines(
    waiting: list[RequestView], running: list[RequestView], now_s: float, kw: dict[str, Any]
) -> None:
    reqs = [*waiting, *running]
    kw.pop("max_wait_s")
    kw.pop("ordering")
    kw.pop("fairness")
    e = estimate(SnapshotTable().columns(waiting, running), now_s, SPEED, GMAXParams(**kw), 1.5)
    gen = np.array([r.generated_tokens for r in reqs], dtype=float)
    cap = np.array([max(r.max_tokens, r.generated_tokens + 1) for r in reqs], dtype=float)
    assert np.all(e.bound_tokens >= gen + 1)  # a bound never falls below tokens already generated
    assert np.all(e.bound_tokens <= cap)
    assert np.all(np.isfinite(e.priority)) and np.all(e.priority >= 0)
    for i, r in enumerate(reqs):
        if r.kind is RequestKind.COMPOUND:  # no sub-deadline beyond the request's own deadline
            assert e.deadline_at_s[i] <= e.program_deadline_at_s[i]


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x, dtype=np.float64).tobytes()


@settings(max_examples=150, deadline=None)
@given(
    requests("w", False),
    requests("r", True),
    st.floats(0, 20),
    params,
    st.none() | st.floats(0.25, 4.0),
)
def test_lengths_alone_are_the_estimates_lengths_bit_for_bit(
    waiting: list[RequestView],
    running: list[RequestView],
    now_s: float,
    kw: dict[str, Any],
    scale: float | None,
) -> None:
    """What an SJF decision reads (:func:`lengths`) is each of those arrays of :func:`estimate`,
    bit for bit, under every goodput, length source and bound scale."""
    for name in ("max_wait_s", "ordering", "fairness"):
        kw.pop(name)
    p = GMAXParams(**kw)
    c = SnapshotTable().columns(waiting, running)
    bound_scale = None if scale is None else np.full(len(c), scale)
    full = estimate(c, now_s, SPEED, p, 1.5, bound_scale=bound_scale)
    alone = lengths(c, p, bound_scale)
    for f in fields(Lengths):
        assert _bits(getattr(alone, f.name)) == _bits(getattr(full, f.name)), f.name


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 100), st.integers(1, 5000)), min_size=1, max_size=30),
    st.integers(1, 10),
    st.floats(0.05, 1.0),
)
def test_window_is_the_best_contiguous_group_of_the_cutoff_candidates(
    rows: list[tuple[float, int]], batch: int, p: float
) -> None:
    prio = np.array([r[0] for r in rows])
    length = np.array([r[1] for r in rows], dtype=float)
    mask = cutoff_mask(prio, batch, p)
    assert mask.sum() >= min(batch, len(rows))
    if (~mask).any():
        assert prio[mask].min() >= prio[~mask].max()  # the filter keeps a top set
    cands = np.flatnonzero(mask)
    chosen = best_window(prio, length, cands, batch)
    assert len(chosen) == min(batch, len(cands)) and set(chosen.tolist()) <= set(cands.tolist())
    by_len = cands[np.argsort(length[cands], kind="stable")]
    best = max(prio[by_len[i : i + batch]].sum() for i in range(max(1, len(by_len) - batch + 1)))
    assert prio[chosen].sum() >= best - 1e-9


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 30), st.floats(0, 5), st.integers(0, 200), st.integers(1, 400))
def test_a_latency_request_never_gains_by_starting_later(
    now_s: float, later_s: float, gen: int, extra: int
) -> None:
    r = request("l", SLOS[0], prompt=50, max_tokens=10_000, gen=gen, prefilled=True, bound=gen + extra)
    cols = SnapshotTable().columns([], [r])
    early = estimate(cols, now_s, SPEED, GMAXParams(), 1.5).goodput[0]
    late = estimate(cols, now_s + later_s, SPEED, GMAXParams(), 1.5).goodput[0]
    assert late <= early


@settings(max_examples=100, deadline=None)
@given(
    waiting=requests("w", running=False),
    running=requests("r", running=True),
    progress=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=4),
)
def test_a_reused_table_reads_what_a_fresh_one_reads(
    waiting: list[RequestView], running: list[RequestView], progress: list[tuple[int, int]]
) -> None:
    """Progress fields are re-read only for changed snapshot objects: new objects are never missed."""
    table = SnapshotTable()
    for step, (every, tokens) in enumerate(progress):
        # some requests get a new snapshot (more tokens), the others keep their object
        running = [
            replace(
                r, generated_tokens=r.generated_tokens + tokens, computed_tokens=r.computed_tokens + tokens
            )
            if (i + step) % (every + 1) == 0
            else r
            for i, r in enumerate(running)
        ]
        reused, fresh = table.columns(waiting, running), SnapshotTable().columns(waiting, running)
        for name in (
            "generated_tokens",
            "computed_tokens",
            "output_bound",
            "waiting_since_s",
            "deadline_at_s",
        ):
            assert np.array_equal(getattr(reused, name), getattr(fresh, name), equal_nan=True), name


def _field(r: RequestView, name: str) -> float:
    """What the table holds of ``r`` for a column: the snapshot's value (None as NaN), an SLO's target."""
    slo = r.slo
    value: Any = {
        "ttft_s": slo.ttft_s,
        "tbt_s": slo.tbt_s,
        "slo_deadline_s": slo.deadline_s,
        "weight": slo.priority_weight,
    }.get(name, getattr(r, name, None))
    return float("nan") if value is None else float(value)


@settings(max_examples=60, deadline=None)
@given(waiting=requests("w", running=False), running=requests("r", running=True))
def test_every_column_holds_each_snapshots_own_value(
    waiting: list[RequestView], running: list[RequestView]
) -> None:
    """Each column, gathered with all the others in one call per dtype, is its own field of each
    request in order (a mix-up of two fields of the same dtype fails here)."""
    c = SnapshotTable().columns(waiting, running)
    rows = [*waiting, *running]
    assert c.ids == [r.request_id for r in rows]
    others = {"ids", "running", "kind", "tenant", "program", "stage", "tenant_names"}
    floats = [f.name for f in fields(Columns) if f.name not in others]  # every float column
    assert len(floats) == 16
    for name in floats:
        want = np.array([_field(r, name) for r in rows])
        assert np.array_equal(getattr(c, name), want, equal_nan=True), name
    assert c.running.tolist() == [False] * len(waiting) + [True] * len(running)
    assert c.stage.tolist() == [-1 if r.stage is None else r.stage for r in rows]
    assert c.kind.tolist() == [KIND_CODES[r.slo.kind] for r in rows]
    assert [c.tenant_names[t] for t in c.tenant] == [r.tenant for r in rows]
    # programs as codes: -1 outside one, one code per program id
    codes = dict(zip(c.program.tolist(), (r.program_id for r in rows), strict=True))
    assert [code < 0 for code in c.program.tolist()] == [r.program_id is None for r in rows]
    assert len({code for code in codes if code >= 0}) == len({r.program_id for r in rows} - {None})
    assert all(codes[code] == r.program_id for code, r in zip(c.program.tolist(), rows, strict=True))
