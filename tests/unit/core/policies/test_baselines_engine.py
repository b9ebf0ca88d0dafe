"""Each baseline engine policy's defining order, pinned on small hand-built snapshots."""

from __future__ import annotations

import functools
import math
import random
from typing import Any

import builders
import pytest
from builders import DL, LAT, deadline, request
from pydantic import ValidationError

from slo_core.policies.apply import apply_decision
from slo_core.policies.base import EnginePolicy, RequestView
from slo_core.policies.baselines import (
    EDF,
    FCFS,
    LTR,
    AutellixPLAS,
    NoisyOraclePredictor,
    Sarathi,
    SJFOracle,
    StrictPriority,
)
from slo_core.policies.registry import make_engine_policy
from slo_core.slo import SLOTargets

HIGH = deadline(priority_class="high", weight=2.0)
RNG = random.Random(0)
engine = functools.partial(builders.engine, now_s=10.0, step=1, seqs=8, kv_total=1000)


def req(rid: str, arrival_s: float = 0.0, slo: SLOTargets = DL, **kw: Any) -> RequestView:
    """A queued request, due (non-latency) at arrival + its SLO's deadline."""
    return request(rid, slo, arrival_s=arrival_s, due=True, **kw)


def decoding(rid: str, arrival_s: float = 0.0, **kw: Any) -> RequestView:
    """A running request past its prefill (prompt 100 computed, 5 tokens out)."""
    return req(rid, arrival_s, gen=5, prefilled=True, **kw)


def prefilling(rid: str, arrival_s: float = 0.0, **kw: Any) -> RequestView:
    return req(rid, arrival_s, computed_tokens=40, **kw)


def ids(*views: RequestView) -> tuple[str, ...]:
    return tuple(v.request_id for v in views)


# ---- registry ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("fcfs", FCFS),
        ("sarathi", Sarathi),
        ("edf", EDF),
        ("sjf-oracle", SJFOracle),
        ("ltr", LTR),
        ("autellix", AutellixPLAS),
        ("strict-priority", StrictPriority),
    ],
)
def test_registry_builds_each_baseline(name: str, cls: type) -> None:
    policy = make_engine_policy(name)
    assert type(policy) is cls
    assert isinstance(policy, EnginePolicy)
    assert policy.name == name
    with pytest.raises(ValidationError):
        make_engine_policy(name, {"no_such_param": 1})


# ---- FCFS and Sarathi ----------------------------------------------------------------------------


def test_fcfs_keeps_the_queue_order_and_admits_prefills_first() -> None:
    waiting = [req("c", 3.0), req("a", 1.0), req("b", 2.0)]  # queue order is vLLM's (requeues at front)
    d = FCFS().decide(waiting, [decoding("r")], engine(), RNG)
    assert d.admit == ("c", "a", "b")
    assert d.prefill_first is True
    assert d.preempt == () and d.token_budget is None
    assert FCFS(prefill_first=False).decide(waiting, [], engine(), RNG).prefill_first is False


def test_sarathi_is_decode_first_under_a_fixed_budget() -> None:
    running = [prefilling("p", 0.0), decoding("d1", 1.0), decoding("d2", 2.0)]
    d = Sarathi().decide([req("w1", 5.0), req("w0", 4.0)], running, engine(), RNG)
    assert d.running_order == ("d1", "d2", "p")
    assert d.admit == ("w1", "w0")
    assert d.token_budget == 512
    assert d.prefill_first is False
    assert Sarathi(token_budget=256).decide([], running, engine(), RNG).token_budget == 256
    applied = apply_decision(d, [], running)
    assert ids(*applied.running) == ("d1", "d2", "p")


# ---- EDF, SJF, strict priority -------------------------------------------------------------------


def test_edf_orders_by_the_next_due_token() -> None:
    waiting = [
        req("lat", 0.0, LAT),  # first token due at 0 + 2.0
        req("dl", 0.0, DL, deadline_at_s=1.5),  # due 1.5
        req("lat-late", 0.5, LAT, gen=10),  # token 10 due at 0.5 + 2.0 + 10·0.1 = 3.5
        req("lat-tie", 1.0, LAT, gen=0, computed_tokens=0, tenant="x"),  # due 3.0
        req("lat-tie2", 1.0, LAT),  # due 3.0, later in the queue
    ]
    d = EDF().decide(waiting, [], engine(), RNG)
    assert d.admit == ("dl", "lat", "lat-tie", "lat-tie2", "lat-late")


def test_sjf_oracle_orders_by_true_remaining_output() -> None:
    waiting = [
        req("long", 0.0, true_output_tokens=900),
        req("short", 1.0, true_output_tokens=20),
        req("requeued", 2.0, true_output_tokens=300, gen=290),  # 10 left
        req("unknown", 3.0, max_tokens=50),  # no truth: its cap
    ]
    assert SJFOracle().decide(waiting, [], engine(), RNG).admit == ("requeued", "short", "unknown", "long")


def test_strict_priority_admits_higher_weight_first_then_earlier() -> None:
    waiting = [
        req("low-early", 0.0),
        req("high-late", 5.0, HIGH),
        req("high-early", 1.0, HIGH),
        req("low-late", 2.0),
    ]
    running = [prefilling("p-low", 0.0), decoding("d", 0.0), prefilling("p-high", 3.0, slo=HIGH)]
    d = StrictPriority().decide(waiting, running, engine(), RNG)
    assert d.admit == ("high-early", "high-late", "low-early", "low-late")
    assert d.running_order == ("d", "p-high", "p-low")
    assert d.token_budget == 512
    assert StrictPriority(token_budget=None).decide(waiting, [], engine(), RNG).token_budget is None


# ---- LTR -----------------------------------------------------------------------------------------


def test_ltr_with_perfect_correlation_is_sjf_and_prefers_a_real_bound() -> None:
    waiting = [req(f"r{n}", float(i), true_output_tokens=n) for i, n in enumerate((500, 30, 2000, 120))]
    d = LTR(kendall_tau=1.0).decide(waiting, [], engine(), RNG)
    assert d.admit == ("r30", "r120", "r500", "r2000")
    bounded = [*waiting, req("bounded", 9.0, true_output_tokens=5000, bound=10)]
    assert LTR(kendall_tau=1.0).decide(bounded, [], engine(), RNG).admit[0] == "bounded"
    ignoring = LTR(kendall_tau=1.0, use_output_bound=False).decide(bounded, [], engine(), RNG)
    assert ignoring.admit[-1] == "bounded"


def test_ltr_prediction_depends_only_on_seed_and_request() -> None:
    a = LTR(kendall_tau=0.3, seed=7)
    b = LTR(kendall_tau=0.3, seed=7)
    waiting = [req(f"r{i}", float(i), true_output_tokens=10 * (i + 1)) for i in range(30)]
    order = a.decide(waiting, [], engine(), RNG).admit
    assert b.decide(list(reversed(waiting)), [], engine(), RNG).admit == order
    assert LTR(kendall_tau=0.3, seed=8).decide(waiting, [], engine(), RNG).admit != order


def _kendall_tau(x: list[float], y: list[float]) -> float:
    n = len(x)
    s = 0
    for i in range(n):
        for j in range(i + 1, n):
            s += int(math.copysign(1, (x[i] - x[j]) * (y[i] - y[j])))
    return 2.0 * s / (n * (n - 1))


@pytest.mark.parametrize("tau", [0.3, 0.7])
def test_noisy_oracle_hits_the_requested_rank_correlation(tau: float) -> None:
    gen = random.Random(1)
    truth = [max(1, round(math.exp(gen.gauss(5.2, 1.1)))) + gen.random() * 1e-3 for _ in range(500)]
    oracle = NoisyOraclePredictor(tau, 5.2, 1.1, seed=3)
    predicted = [oracle.predict(f"q{i}", int(t)) for i, t in enumerate(truth)]
    assert _kendall_tau(truth, predicted) == pytest.approx(tau, abs=0.06)


# ---- Autellix PLAS -------------------------------------------------------------------------------


def test_plas_orders_by_program_attained_service_then_program_arrival() -> None:
    policy = AutellixPLAS(base_quantum_tokens=1000, quantum_growth=2.0)
    waiting = [
        req("heavy", 0.0, program_id="P1", program_arrival_s=0.0, program_attained_tokens=5000),  # queue 3
        req("light-late", 2.0, program_id="P2", program_arrival_s=2.0, program_attained_tokens=100),
        req("light-early", 3.0, program_id="P3", program_arrival_s=1.0, program_attained_tokens=900),
        req("mid", 0.5, program_attained_tokens=1500),  # queue 1
    ]
    assert [policy.queue(w, 10.0) for w in waiting] == [3, 0, 0, 1]
    d = policy.decide(waiting, [], engine(now_s=10.0), RNG)
    assert d.admit == ("light-early", "light-late", "mid", "heavy")
    assert d.preempt == ()


def test_plas_promotes_a_starving_call() -> None:
    policy = AutellixPLAS(base_quantum_tokens=1000, starvation_s=5.0)
    starving = req("old", 0.0, program_attained_tokens=50_000, waiting_since_s=1.0)
    fresh = req("new", 9.0, program_attained_tokens=10, waiting_since_s=9.0)
    assert policy.queue(starving, 10.0) == 0
    assert policy.decide([fresh, starving], [], engine(now_s=10.0), RNG).admit == ("old", "new")


def test_plas_preempts_the_worst_running_call_for_a_better_queued_one() -> None:
    policy = AutellixPLAS(base_quantum_tokens=1000)
    running = [
        decoding("busy-early", 0.0, program_attained_tokens=8000),
        decoding("busy-late", 1.0, program_attained_tokens=8000),
        decoding("fresh-run", 2.0, program_attained_tokens=10),
    ]
    waiting = [req("newcomer", 5.0, program_attained_tokens=0)]
    d = policy.decide(waiting, running, engine(seqs=3), RNG)
    assert d.preempt == ("busy-late",)
    assert d.admit == ("newcomer", "busy-late")
    assert d.running_order == ("fresh-run", "busy-early")
    applied = apply_decision(d, [waiting[0]], running)
    assert ids(*applied.waiting) == ("newcomer", "busy-late")
    assert ids(*applied.running) == ("fresh-run", "busy-early")


def test_plas_does_not_preempt_an_equal_or_better_queue_or_beyond_the_cap() -> None:
    policy = AutellixPLAS(base_quantum_tokens=1000)
    running = [decoding("a", 0.0, program_attained_tokens=10), decoding("b", 1.0, program_attained_tokens=20)]
    waiting = [req("w", 5.0, program_attained_tokens=0)]
    assert policy.decide(waiting, running, engine(seqs=2), RNG).preempt == ()
    capped = AutellixPLAS(base_quantum_tokens=1000, max_preemptions=1)
    heavy = [decoding(f"h{i}", float(i), program_attained_tokens=9000) for i in range(3)]
    many = [req(f"w{i}", 5.0 + i) for i in range(3)]
    assert capped.decide(many, heavy, engine(seqs=3), RNG).preempt == ("h2",)


def test_plas_preempts_for_kv_blocks_too() -> None:
    policy = AutellixPLAS(base_quantum_tokens=1000)
    running = [decoding("hog", 0.0, program_attained_tokens=9000)]  # 105 tokens → 7 blocks of 16
    waiting = [req("w", 1.0, prompt=160)]  # needs 10 blocks
    d = policy.decide(waiting, running, engine(seqs=8, kv_free=4), RNG)
    assert d.preempt == ("hog",)
    assert policy.decide(waiting, running, engine(seqs=8, kv_free=10), RNG).preempt == ()


def test_ltr_ranks_a_requeued_request_by_its_remaining_output() -> None:
    waiting = [
        req("fresh", 0.0, true_output_tokens=100),
        req("requeued", 1.0, true_output_tokens=500, gen=480),
    ]
    assert LTR(kendall_tau=1.0).decide(waiting, [], engine(), RNG).admit == ("requeued", "fresh")


def _plas_reference(
    policy: AutellixPLAS, waiting: list[RequestView], running: list[RequestView], eng: Any
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """PLAS's decision as first written: every key through ``queue``, pools of full tuples sorted."""
    now = eng.now_s

    def key(r: RequestView) -> tuple[int, float, float]:
        program_arrival = r.program_arrival_s if r.program_arrival_s is not None else r.arrival_s
        return (policy.queue(r, now), program_arrival, r.arrival_s)

    wkeys = [key(r) for r in waiting]
    rkeys = [key(r) for r in running]
    victims = policy._victims(
        waiting, wkeys, sorted(range(len(waiting)), key=lambda i: wkeys[i]), running, rkeys, eng
    )
    pool = [(wkeys[i], 0, i, waiting[i].request_id) for i in range(len(waiting))]
    pool += [(rkeys[i], 1, i, running[i].request_id) for i in victims]
    pool.sort()
    gone = {running[i].request_id for i in victims}
    run_order = sorted((rkeys[i], i, r.request_id) for i, r in enumerate(running) if r.request_id not in gone)
    return (
        tuple(item[3] for item in pool),
        tuple(running[i].request_id for i in victims),
        tuple(item[2] for item in run_order),
    )


@pytest.mark.parametrize("seed", range(40))
def test_plas_decision_equals_its_plain_form_on_random_queues_with_ties(seed: int) -> None:
    rng = random.Random(seed)
    policy = AutellixPLAS(base_quantum_tokens=1000, starvation_s=4.0, max_preemptions=rng.choice([0, 2, 8]))

    def call(rid: str, **kw: Any) -> RequestView:
        program = rng.random() < 0.6
        return req(
            rid,
            float(rng.choice([0, 1, 2, 3])),  # arrivals and program arrivals tie often
            program_id=f"P{rng.randint(0, 5)}" if program else None,
            program_arrival_s=float(rng.choice([0, 1])) if program else None,
            program_attained_tokens=rng.choice([0, 999, 1000, 1500, 4000, 4000, 70_000, 10**9]),
            **kw,
        )

    for step in range(3):
        waiting = [call(f"w{i}", waiting_since_s=rng.uniform(0.0, 10.0)) for i in range(rng.randint(0, 30))]
        running = [call(f"r{i}", gen=5, prefilled=True) for i in range(rng.randint(0, 12))]
        eng = engine(now_s=10.0 + step, seqs=rng.choice([4, 12, 40]), kv_free=rng.randint(0, 400))
        d = policy.decide(waiting, running, eng, RNG)
        assert (d.admit, d.preempt, d.running_order) == _plas_reference(policy, waiting, running, eng)
