"""Tempo's plain-float densities (short queues) and its densities read through a SnapshotTable (long
ones) equal the numpy reference read from the snapshots bit for bit (density, remaining time, gain,
throttle flag, priority order and the preemptions), over random queues of every request kind,
compound stages and engine states, and over decisions that keep the table while the queue changes."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.perf import load_profile
from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.gmax_priority import Groups, stage_sum
from slo_core.policies.gmax_snapshot import SnapshotTable
from slo_core.policies.tempo import (
    SCALAR_MAX,
    Densities,
    Ranked,
    Tempo,
    TempoParams,
    _collective_max,
    column_inputs,
    service_densities,
    service_densities_scalar,
    snapshot_inputs,
)
from slo_core.slo import RequestKind, SLOTargets

PROFILE = load_profile("h100-llama3-8b-tp1")
SLOS = (
    SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.05),
    SLOTargets(RequestKind.LATENCY, ttft_s=0.5, tbt_s=0.02, priority_weight=2.0),
    SLOTargets(RequestKind.DEADLINE, deadline_s=8.0),
    SLOTargets(RequestKind.DEADLINE, deadline_s=30.0, priority_weight=0.5),
    SLOTargets(RequestKind.COMPOUND, deadline_s=20.0),
    SLOTargets(RequestKind.BEST_EFFORT),
)


def _view(rng: random.Random, i: int) -> RequestView:
    slo = rng.choice(SLOS)
    prompt = rng.randint(1, 6000)
    gen = rng.choice([0, 0, rng.randint(1, 400)])
    computed = rng.choice([0, prompt // 3, prompt + max(0, gen - 1), prompt + gen])
    arrival = rng.uniform(0.0, 20.0)
    deadline_at = None
    if slo.kind in (RequestKind.DEADLINE, RequestKind.COMPOUND) and rng.random() < 0.5:
        deadline_at = arrival + rng.uniform(0.5, 40.0)
    program = rng.choice([None, "p0", "p1"]) if slo.kind is RequestKind.COMPOUND else None
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
        program_id=program,
        stage=rng.choice([0, 1]) if program else None,
    )


def _engine(rng: random.Random, step: int, n_running: int) -> EngineView:
    return EngineView(
        now_s=20.0 + rng.uniform(0.0, 30.0),
        step=step,
        max_num_seqs=max(rng.choice([2, 8, 256]), n_running),
        max_num_batched_tokens=8192,
        kv_blocks_total=30_000,
        kv_blocks_free=rng.choice([0, 50, rng.randint(0, 30_000)]),
        block_size=16,
        profile=PROFILE,
    )


@given(
    seed=st.integers(0, 100_000),
    n=st.integers(1, SCALAR_MAX),
    weights=st.sampled_from([(1.0, 2.0), (1.0, 1.0), (0.0, 1.7)]),
)
@settings(max_examples=300, deadline=None)
def test_scalar_densities_equal_numpy(seed: int, n: int, weights: tuple[float, float]) -> None:
    rng = random.Random(seed)
    reqs = [_view(rng, i) for i in range(n)]
    n_running = rng.randint(0, n)
    running = reqs[:n_running]
    engine = _engine(rng, 20, n_running)
    p = TempoParams(input_weight=weights[0], output_weight=weights[1])
    ref = service_densities(reqs, running, engine, p)
    fast = service_densities_scalar(reqs, running, engine, p)
    assert fast.density == ref.density.tolist()
    assert fast.remaining_s == ref.remaining_s.tolist()
    assert fast.gain == ref.gain.tolist()
    assert fast.throttled == ref.throttled.tolist()
    assert fast.best_effort == ref.best_effort.tolist()
    assert fast.iteration_s == ref.iteration_s
    tempo = Tempo(p)
    assert tempo.priority_order_scalar(reqs, fast, engine.max_num_seqs) == tempo.priority_order(
        ref, engine.max_num_seqs
    )


def _reference(policy: Tempo, reqs: list[RequestView], n_running: int, engine: EngineView) -> Ranked:
    """The numpy densities read from the snapshots (running first), and their priority order."""
    d = service_densities(reqs, reqs[:n_running], engine, policy.params)
    return Ranked(
        d,
        policy.priority_order(d, engine.max_num_seqs),
        [r.request_id for r in reqs],
        lambda i: reqs[i].prompt_tokens + reqs[i].generated_tokens,
        lambda i: reqs[i].kv_tokens,
    )


def _moved(rng: random.Random, reqs: list[RequestView], next_id: int) -> list[RequestView]:
    """The queue a few steps later: some requests left, some progressed (new snapshots), some joined."""
    out = []
    for old in reqs:
        roll = rng.random()
        if roll < 0.15:
            continue
        r = old
        if roll < 0.5:
            gen = old.generated_tokens + rng.randint(0, 3)
            r = dataclasses.replace(
                old,
                generated_tokens=gen,
                computed_tokens=min(old.prompt_tokens + gen, old.computed_tokens + rng.randint(0, 900)),
                output_bound=rng.choice([r.output_bound, None, gen + rng.randint(1, 900)]),
                deadline_at_s=r.deadline_at_s
                if r.deadline_at_s is None
                else r.deadline_at_s + rng.uniform(-1, 1),
            )
        out.append(r)
    out += [_view(rng, next_id + i) for i in range(rng.randint(0, 12))]
    rng.shuffle(out)
    return out


@given(seed=st.integers(0, 100_000), n=st.integers(1, 4 * SCALAR_MAX))
@settings(max_examples=150, deadline=None)
def test_decisions_equal_the_snapshot_reference(seed: int, n: int) -> None:
    """Whole decisions (densities, order, ids, preemptions) of the policy's path, plain floats or the
    SnapshotTable it keeps across decisions, agree with the reference over a few quanta of a changing
    queue."""
    rng = random.Random(seed)
    fast, ref = Tempo(), Tempo()
    reqs = [_view(rng, i) for i in range(n)]
    for step in (0, 20, 40, 60):
        n_running = rng.randint(0, len(reqs))
        engine = _engine(rng, step, n_running)
        got = fast.densities(reqs[n_running:], reqs[:n_running], engine)
        want = _reference(ref, reqs, n_running, engine)
        scalar = len(reqs) <= SCALAR_MAX
        assert got.densities.__class__.__name__ == ("ScalarDensities" if scalar else "Densities")
        d, nd = got.densities, want.densities
        assert isinstance(nd, Densities)
        for name in ("density", "remaining_s", "gain", "throttled", "best_effort"):
            assert list(getattr(d, name)) == getattr(nd, name).tolist(), name
        assert d.iteration_s == nd.iteration_s
        assert got.order == want.order
        assert got.ids == want.ids
        for i in range(len(reqs)):
            assert got.need(i) == want.need(i)
            assert got.kv(i) == want.kv(i)
        assert fast._preemptions(got, n_running, engine) == ref._preemptions(want, n_running, engine)
        reqs = _moved(rng, reqs, 1000 * (step + 1))


@given(seed=st.integers(0, 100_000), n=st.integers(0, 120))
@settings(max_examples=150, deadline=None)
def test_table_columns_give_the_snapshot_inputs(seed: int, n: int) -> None:
    """What the densities read, through a SnapshotTable (the waiting requests' columns first, then
    reordered running first) equals what they read from the snapshots, field by field; stages group
    the same calls."""
    rng = random.Random(seed)
    reqs = [_view(rng, i) for i in range(n)]
    n_running = rng.randint(0, n)
    table = SnapshotTable()
    for _ in range(2):  # a fresh table, then one holding the last call's rows
        c = table.columns(reqs[n_running:], reqs[:n_running])
        n_waiting = n - n_running
        got = column_inputs(
            c, np.concatenate((np.arange(n_waiting, n), np.arange(n_waiting))).astype(np.int64)
        )
        want = snapshot_inputs(reqs)
        for f in dataclasses.fields(want):
            a, b = getattr(got, f.name), getattr(want, f.name)
            if f.name == "stage_group":  # codes differ, the partition may not
                assert [x < 0 for x in a.tolist()] == [x < 0 for x in b.tolist()]
                assert _partition(a) == _partition(b)
            else:
                assert a.dtype == b.dtype, f.name
                assert a.tolist() == b.tolist(), f.name
        reqs = reqs[n_running:] + reqs[:n_running]  # the same snapshots, the other queue
        n_running = n - n_running


def _partition(codes: np.ndarray) -> set[frozenset[int]]:
    groups: dict[int, set[int]] = {}
    for i, g in enumerate(codes.tolist()):
        if g >= 0:
            groups.setdefault(g, set()).add(i)
    return {frozenset(v) for v in groups.values()}


@given(
    groups=st.lists(st.integers(-1, 6), max_size=40),
    values=st.lists(st.floats(0.0, 1e4, allow_nan=False), min_size=40, max_size=40),
)
def test_stage_max_is_the_plain_float_maximum(groups: list[int], values: list[float]) -> None:
    remaining = values[: len(groups)]
    codes = np.array(groups, dtype=np.int64)
    arr = stage_sum(Groups(codes, codes >= 0), np.array(remaining, dtype=float), reduce_max=True)
    views = [
        RequestView(
            request_id=f"r{i}",
            slo=SLOS[4] if g >= 0 else SLOS[2],
            arrival_s=0.0,
            prompt_tokens=1,
            max_tokens=1,
            program_id=f"p{g}" if g >= 0 else None,
            stage=0 if g >= 0 else None,
        )
        for i, g in enumerate(groups)
    ]
    plain = list(remaining)
    _collective_max(views, plain)
    assert arr.tolist() == plain


def test_frac_samples_are_numpy_linspace() -> None:
    from slo_core.policies.tempo import _FRAC_LIST

    assert np.linspace(0.0, 1.0, 16).tolist() == _FRAC_LIST
