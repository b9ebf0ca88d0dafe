"""GMAX decisions on hand-built engine snapshots: order, drops, frame-bounded cost-aware preemption."""

from __future__ import annotations

import random
from typing import Any

import builders
import pytest
from builders import BE, CP, DL, LAT, request

from slo_core.policies import gmax_scalar
from slo_core.policies.base import Decision, EngineView, FinishedView, RequestView
from slo_core.policies.gmax import GMAX, GMAXNoAnalyzer, GMAXNoGMAX, GMAXOracle
from slo_core.policies.registry import make_engine_policy, make_router_policy
from slo_core.slo import SLOTargets


def req(
    rid: str, slo: SLOTargets, *, running: bool = False, arrival_s: float = 0.0, **kw: Any
) -> RequestView:
    """Bounded at 100 output tokens (capped at 100k): queued since arrival, or running with all computed."""
    kw.setdefault("bound", 100)
    kw.setdefault("max_tokens", 100_000)
    kw.setdefault("waiting_since_s", None if running else arrival_s)
    return request(rid, slo, arrival_s=arrival_s, prefilled=running, **kw)


def engine(now_s: float = 0.0, step: int = 0, seqs: int = 64, kv_free: int = 100_000) -> EngineView:
    return builders.engine(now_s, step=step, seqs=seqs, kv_total=200_000, kv_free=kv_free)


def decide(policy: GMAX, waiting: list[RequestView], running: list[RequestView], eng: EngineView) -> Decision:
    return policy.decide(waiting, running, eng, random.Random(0))


def test_admits_by_goodput_per_generation_time() -> None:
    short_deadline = req("d", DL)  # 200 tokens of goodput over ~3 s
    stream = req("l", LAT)  # 100 on-time tokens over ~3 s
    hopeless = req("h", DL, bound=1000, arrival_s=-15.0)  # needs 30 s, has 5 s
    d = decide(GMAX(), [hopeless, stream, short_deadline], [], engine())
    assert d.admit == ("d", "l", "h")
    assert d.preempt == () and d.reject == ()


def test_drops_only_requests_that_can_no_longer_pay() -> None:
    past = req("past", DL, arrival_s=-30.0)  # deadline −10 < now
    be = req("be", BE, arrival_s=-500.0)  # its default deadline passed, but best effort is never dropped
    stage = req("stage", CP, program_id="p", stage=0, deadline_at_s=-1.0, program_deadline_at_s=50.0)
    d = decide(GMAX(), [past, be, stage], [], engine())
    assert d.reject == ("past",)
    assert set(d.admit) == {"be", "stage"}
    tempo = decide(GMAX(goodput="tempo"), [past], [], engine())
    assert tempo.reject == ()  # late completions still pay under a decaying goodput


def test_max_wait_drops_requests_not_started_in_time() -> None:
    slow = req("slow", LAT, arrival_s=-6.0)
    fresh = req("fresh", LAT, arrival_s=-1.0)
    d = decide(GMAX(max_wait_s=5.0), [slow, fresh], [], engine())
    assert d.reject == ("slow",) and d.admit == ("fresh",)


def test_preemption_happens_only_at_frame_boundaries_and_when_it_pays() -> None:
    long_be = req("be", BE, bound=1000, gen=10, running=True)
    urgent = req("d", DL)
    policy = GMAX(tune_p=False)
    first = decide(policy, [urgent], [long_be], engine(step=0, seqs=1))
    assert first.preempt == ("be",) and first.admit == ("d",)
    mid_frame = decide(policy, [urgent], [long_be], engine(step=10, seqs=1))
    assert mid_frame.preempt == ()  # Δ = 50 steps: no churn inside a frame
    next_frame = decide(policy, [urgent], [long_be], engine(step=50, seqs=1))
    assert next_frame.preempt == ("be",)
    off = decide(GMAX(preemption=False), [urgent], [long_be], engine(step=0, seqs=1))
    assert off.preempt == ()


def test_preemption_is_refused_when_recomputing_the_victim_stalls_a_valuable_batch() -> None:
    # V is far behind its stream (pays nothing) but holds 5,100 KV tokens: recomputing them stalls
    # the batch ~0.67 s, and A earns ~66,700 goodput/s, so the stall costs more than W would gain.
    victim = req("v", LAT, gen=5000, bound=6000, arrival_s=-1000.0, running=True)
    valuable = req("a", DL, prompt=20_000, bound=10, running=True)
    waiting = req("w", DL)
    d = decide(GMAX(tune_p=False), [waiting], [valuable, victim], engine(seqs=2))
    assert d.preempt == ()
    alone = decide(GMAX(tune_p=False), [waiting], [victim], engine(seqs=1))
    assert alone.preempt == ("v",)  # nothing else in the batch to stall


def test_running_order_follows_priority_and_omits_preempted() -> None:
    a = req("a", DL, running=True, bound=50)
    b = req("b", DL, running=True, bound=500)
    d = decide(GMAX(), [], [b, a], engine())
    assert d.running_order == ("a", "b")


def test_oracle_and_ablations_differ_where_they_should() -> None:
    overestimated = req("x", DL, bound=1000, true_output_tokens=10)
    accurate = req("y", DL, bound=100, true_output_tokens=100)
    assert decide(GMAX(), [overestimated, accurate], [], engine()).admit == ("y", "x")
    assert decide(GMAXOracle(), [overestimated, accurate], [], engine()).admit == ("x", "y")

    mean = GMAXNoAnalyzer(mean_output_tokens=250.0)
    decide(mean, [overestimated, accurate], [], engine())
    assert mean.last_estimates is not None
    assert mean.last_estimates.bound_tokens.tolist() == [250.0, 250.0]

    short_stream = req("s", LAT, bound=50)
    deadline = req("d", DL, bound=100)
    assert decide(GMAX(), [short_stream, deadline], [], engine()).admit == ("d", "s")
    assert decide(GMAXNoGMAX(), [short_stream, deadline], [], engine()).admit == ("s", "d")


def test_registry_builds_every_variant_and_the_router() -> None:
    for name, cls in [
        ("gmax", GMAX),
        ("gmax-oracle", GMAXOracle),
        ("gmax-no-analyzer", GMAXNoAnalyzer),
        ("gmax-no-gmax", GMAXNoGMAX),
    ]:
        policy = make_engine_policy(name, {"frame_steps": 20})
        assert isinstance(policy, cls) and policy.name == name and policy.frame_steps == 20
    assert make_router_policy("power-of-k", {"k": 2}).name == "power-of-k"
    with pytest.raises(ValueError, match="p_candidates"):
        GMAX(p_candidates=())


def test_fairness_favours_the_tenant_with_less_attained_service() -> None:
    heavy = req("h", DL, tenant="heavy")
    light = req("l", DL, tenant="light")
    served = FinishedView(
        request=req("old", DL, tenant="heavy", gen=5000), finish_s=0.0, gain=1, ideal_gain=1, met_slo=True
    )
    plain = GMAX()
    plain.observe([served], 0.0)
    assert decide(plain, [heavy, light], [], engine()).admit == ("h", "l")  # tie: snapshot order
    fair = GMAX(fairness=0.5)
    fair.observe([served], 0.0)
    assert decide(fair, [heavy, light], [], engine()).admit == ("l", "h")


def test_measured_step_time_corrects_the_model() -> None:
    policy = GMAX()
    running = [req("r", DL, running=True, bound=1000)]
    decide(policy, [], running, engine(now_s=0.0, step=0))
    before = policy.last_estimates
    decide(policy, [], running, engine(now_s=10.0, step=100))  # 0.1 s per step, model says 0.03
    after = policy.last_estimates
    assert before is not None and after is not None
    assert policy.correction.factor == pytest.approx(0.9 + 0.1 * 0.1 / 0.03)
    assert after.t_gen_s[0] == pytest.approx(before.t_gen_s[0] * policy.correction.factor)


def test_idle_engine_gets_an_empty_decision() -> None:
    d = decide(GMAX(), [], [], engine())
    assert d.admit == () and d.preempt == () and d.reject == ()


@pytest.mark.parametrize("path", ["scalar", "numpy"])
def test_the_calm_guard_ages_waiting_requests_only_while_nothing_was_dropped(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """calm_delta_per_frame: a request that waited long outranks a denser fresh one while the engine
    has dropped nothing for calm_window_s; after a drop the shipped δ orders them until the window
    passes. The scalar path (small snapshots) and the numpy path decide alike."""
    if path == "numpy":
        monkeypatch.setattr(gmax_scalar, "MAX_ROWS", -1)
    old = req("old", DL, bound=150, arrival_s=-8.0)  # waited 8 s or more, ~3x the work of "new"
    past = req("past", DL, arrival_s=-30.0)  # its deadline passed: dropped under the request goodput

    def admit(policy: GMAX, now_s: float, *extra: RequestView) -> tuple[str, ...]:
        new = req("new", DL, bound=50, arrival_s=now_s)  # just arrived
        d = decide(policy, [old, new, *extra], [], engine(now_s, step=int(now_s * 100)))
        return d.admit

    unguarded = GMAX(goodput="request", calm_delta_per_frame=None)
    assert admit(unguarded, 0.0) == ("new", "old")
    calm = GMAX(goodput="request", calm_delta_per_frame=1000.0, calm_window_s=2.0)
    assert admit(calm, 0.0) == ("old", "new")  # nothing dropped yet: calm
    assert admit(calm, 0.5, past) == ("old", "new")  # this decision drops "past" (scored calm)
    assert admit(calm, 1.0) == ("new", "old")  # a drop 0.5 s ago: the shipped δ
    assert admit(calm, 2.4) == ("new", "old")
    assert admit(calm, 2.6) == ("old", "new")  # 2.1 s without a drop: calm again
    # no drops to read under a goodput that never drops (nor without reject_past_deadline): no guard
    assert admit(GMAX(goodput="tempo", calm_delta_per_frame=1000.0), 0.0) == admit(GMAX(goodput="tempo"), 0.0)
    off = GMAX(goodput="request", reject_past_deadline=False, calm_delta_per_frame=1000.0)
    assert admit(off, 0.0) == ("new", "old")
