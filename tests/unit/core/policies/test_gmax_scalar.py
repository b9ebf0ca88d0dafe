"""GMAX's plain-float path for small snapshots decides exactly as its numpy path (same ids, same order).

Random snapshots of latency, deadline and best-effort requests (waiting and running, part-prefilled,
preempted, past their deadline, with and without bounds) go through a sequence of decisions on two
GMAX instances, one forced onto the numpy path; every Decision and the tuner's state must match.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.perf import load_profile
from slo_core.policies import gmax_scalar
from slo_core.policies.base import Decision, EngineView, FinishedView, RequestView
from slo_core.policies.gmax import GMAX
from slo_core.slo import RequestKind, SLOTargets

PROFILE = load_profile("h100-llama3-8b-tp1")
SLOS = (
    SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.05),
    SLOTargets(RequestKind.LATENCY, ttft_s=0.5, tbt_s=0.02, priority_weight=2.0),
    SLOTargets(RequestKind.LATENCY, ttft_s=2.0, tbt_s=0.2),
    SLOTargets(RequestKind.DEADLINE, deadline_s=8.0),
    SLOTargets(RequestKind.DEADLINE, deadline_s=30.0, priority_weight=0.5),
    SLOTargets(RequestKind.BEST_EFFORT),
)


@st.composite
def snapshot(draw: st.DrawFn) -> tuple[list[RequestView], list[RequestView]]:
    n = draw(st.integers(1, 24))
    waiting: list[RequestView] = []
    running: list[RequestView] = []
    for i in range(n):
        slo = draw(st.sampled_from(SLOS))
        prompt = draw(st.integers(1, 3000))
        gen = draw(st.integers(0, 600))
        is_running = draw(st.booleans())
        computed = prompt + gen if is_running else draw(st.sampled_from([0, prompt // 2, prompt + gen]))
        arrival = draw(st.floats(0.0, 20.0))
        bound = draw(st.one_of(st.none(), st.integers(1, 2000)))
        deadline_at = None
        if slo.kind is RequestKind.DEADLINE and draw(st.booleans()):
            deadline_at = arrival + draw(st.floats(0.5, 40.0))
        view = RequestView(
            request_id=f"r{i}",
            slo=slo,
            arrival_s=arrival,
            prompt_tokens=prompt,
            max_tokens=draw(st.integers(gen + 1, 4096)),
            generated_tokens=gen,
            computed_tokens=computed,
            deadline_at_s=deadline_at,
            output_bound=bound,
            true_output_tokens=draw(st.one_of(st.none(), st.integers(1, 2000))),
            waiting_since_s=None if is_running else arrival + draw(st.floats(0.0, 5.0)),
        )
        (running if is_running else waiting).append(view)
    return waiting, running


def _engine(step: int, now_s: float, running: int, kv_free: int, seqs: int, profile: bool) -> EngineView:
    return EngineView(
        now_s=now_s,
        step=step,
        max_num_seqs=max(seqs, running),
        max_num_batched_tokens=2048,
        kv_blocks_total=20_000,
        kv_blocks_free=kv_free,
        profile=PROFILE if profile else None,
    )


def _run(policy: GMAX, snaps: list[Any], engines: list[EngineView]) -> list[Decision]:
    rng = random.Random(7)
    return [policy.decide(w, r, e, rng) for (w, r), e in zip(snaps, engines, strict=True)]


PARAMS: list[dict[str, Any]] = [
    {},
    {"goodput": "request"},
    {"feasibility": "bound"},
    {"length_source": "oracle"},
    {"length_source": "mean"},
    {"ordering": "sjf", "preemption": False},
    {"max_wait_s": 3.0, "frame_steps": 1, "preempt_min_ratio": 1.0, "preempt_horizon_frames": 50.0},
]


@pytest.mark.parametrize("params", PARAMS, ids=[str(p) for p in PARAMS])
@settings(max_examples=40, deadline=None)
@given(
    snaps=st.lists(snapshot(), min_size=1, max_size=4),
    kv_free=st.integers(0, 3000),
    seqs=st.integers(1, 16),
    profile=st.booleans(),
)
def test_small_path_decides_as_numpy_path(
    params: dict[str, Any],
    snaps: list[tuple[list[RequestView], list[RequestView]]],
    kv_free: int,
    seqs: int,
    profile: bool,
) -> None:
    _compare(params, snaps, kv_free, seqs, profile)


def _teach(policy: GMAX) -> None:
    """Deadline bounds ~8x, latency bounds ~3x the lengths the requests finished at (gmax_bound)."""
    for kind, ratio in ((SLOS[3], 8.0), (SLOS[0], 3.0)):
        views = [
            RequestView(
                f"taught-{kind.kind.value}-{i}", kind, 0.0, 10, 4096, output_bound=int(ratio * (90 + i))
            )
            for i in range(30)
        ]
        for v in views:
            policy.bounds.first_seen(v)
        policy.observe(
            [
                FinishedView(replace(v, generated_tokens=90 + i), 1.0, 1.0, 1.0, True)
                for i, v in enumerate(views)
            ],
            1.0,
        )


@settings(max_examples=60, deadline=None)
@given(
    snaps=st.lists(snapshot(), min_size=1, max_size=4),
    kv_free=st.integers(0, 3000),
    seqs=st.integers(1, 16),
    profile=st.booleans(),
)
@pytest.mark.parametrize("calibrate", [True, False], ids=["calibrated", "learned-z"])
def test_small_path_reads_a_learned_bound_as_numpy_path(
    calibrate: bool,
    snaps: list[tuple[list[RequestView], list[RequestView]]],
    kv_free: int,
    seqs: int,
    profile: bool,
) -> None:
    _compare({"calibrate_bound": calibrate}, snaps, kv_free, seqs, profile, teach=True)


def _compare(
    params: dict[str, Any],
    snaps: list[tuple[list[RequestView], list[RequestView]]],
    kv_free: int,
    seqs: int,
    profile: bool,
    *,
    teach: bool = False,
) -> None:
    # a request id names one request: its immutable fields never change between snapshots
    snaps = [
        (
            [replace(v, request_id=f"{k}-{v.request_id}") for v in w],
            [replace(v, request_id=f"{k}-{v.request_id}") for v in r],
        )
        for k, (w, r) in enumerate(snaps)
    ]
    engines = [
        _engine(10 * i, 20.0 + 0.7 * i, len(r), kv_free, seqs, profile) for i, (_, r) in enumerate(snaps)
    ]
    small = GMAX(tune_epoch_s=0.5, **params)
    big = GMAX(tune_epoch_s=0.5, **params)
    if teach:
        _teach(small)
        _teach(big)
        assert small.bounds.z_by_kind == big.bounds.z_by_kind
        assert min(small.bounds.z_by_kind[:2]) > small.bounds.static_z
    fast = _run(small, snaps, engines)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gmax_scalar, "MAX_ROWS", -1)  # every snapshot takes the numpy path
        slow = _run(big, snaps, engines)
    assert fast == slow
    assert small.tuner.current == big.tuner.current
    assert small.correction.factor == big.correction.factor
    est_small, est_big = small.last_estimates, big.last_estimates
    assert est_small is not None and est_big is not None
    assert est_small.priority.tolist() == est_big.priority.tolist()


def test_compound_and_fairness_take_the_numpy_path() -> None:
    lat = RequestView("l", SLOS[0], 0.0, 10, 100)
    cp = RequestView("c", SLOTargets(RequestKind.COMPOUND, deadline_s=10.0), 0.0, 10, 100, program_id="p")
    assert gmax_scalar.supported(GMAX().params, [lat], [])
    assert not gmax_scalar.supported(GMAX().params, [lat, cp], [])
    assert not gmax_scalar.supported(GMAX(fairness=0.5).params, [lat], [])
    assert not gmax_scalar.supported(GMAX(goodput="tempo").params, [lat], [])
