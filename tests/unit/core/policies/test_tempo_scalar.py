"""Tempo's plain-float densities and order equal its numpy reference bit for bit (density, remaining
time, gain, throttle flag, priority order and the decision), over random queues of every request kind,
compound stages and engine states."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.perf import load_profile
from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.tempo import (
    SCALAR_MAX,
    Tempo,
    TempoParams,
    service_densities,
    service_densities_scalar,
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
    assert tempo.priority_order_scalar(reqs, fast, engine.max_num_seqs) == [
        int(i) for i in tempo.priority_order(reqs, ref, engine.max_num_seqs)
    ]


@given(seed=st.integers(0, 100_000), n=st.integers(1, SCALAR_MAX))
@settings(max_examples=150, deadline=None)
def test_decisions_equal_numpy_path(seed: int, n: int) -> None:
    """Whole decisions (preemptions included) of the two paths agree over a few quanta."""
    rng = random.Random(seed)
    fast, ref = Tempo(), Tempo()
    reqs = [_view(rng, i) for i in range(n)]
    for step in (0, 20, 40):
        n_running = rng.randint(0, len(reqs))
        running = reqs[:n_running]
        engine = _engine(rng, step, n_running)
        d, order = ref.densities(reqs, running, engine)
        assert d.__class__.__name__ == "ScalarDensities"
        # the reference: the numpy densities and order through the same preemption rule
        nd = service_densities(reqs, running, engine, ref.params)
        norder = [int(i) for i in ref.priority_order(reqs, nd, engine.max_num_seqs)]
        assert order == norder
        fast_victims = fast._preemptions(reqs, n_running, order, d, engine)
        ref_victims = ref._preemptions(reqs, n_running, norder, nd, engine)
        assert fast_victims == [int(v) for v in ref_victims]
        rng.shuffle(reqs)


def test_frac_samples_are_numpy_linspace() -> None:
    from slo_core.policies.tempo import _FRAC_LIST

    assert np.linspace(0.0, 1.0, 16).tolist() == _FRAC_LIST
