"""The autoscaling decision (slo_core.scaling): recommendations, stabilization, bounds, protection."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slo_core.scaling import FleetSignals, ScalingParams, TierSignal, decide, queue_recommendation

P = ScalingParams(min_replicas=1, max_replicas=10, utilization=0.5, drain_s=10.0, min_samples=10)


def signals(**kw: object) -> FleetSignals:
    base: dict[str, object] = {"ready": 4, "starting": 0, "capacity_tokens_per_s": 1000.0}
    base.update(kw)
    return FleetSignals(**base)  # type: ignore[arg-type]


def test_load_sets_the_count_from_goodput_capacity_and_admitted_work() -> None:
    # 1500 tok/s arriving + 5000 admitted over 10 s = 2000 tok/s; 500 tok/s per replica at 50 %
    d = decide(signals(demand_tokens_per_s=1500, admitted_tokens=5000), P, (), 0.0)
    assert d.recommendation == 4 and d.desired == 4


def test_a_tier_below_target_adds_a_replica_even_when_load_says_enough() -> None:
    gold = TierSignal("gold", finished=50, met=40, target=0.95)
    d = decide(signals(demand_tokens_per_s=100, tiers=(gold,)), P, (), 0.0)
    assert d.desired == 5 and "gold 0.800<0.95" in d.reason


def test_too_few_outcomes_or_replicas_already_starting_add_nothing_more() -> None:
    few = TierSignal("gold", finished=5, met=0, target=0.95)
    assert decide(signals(demand_tokens_per_s=1900, tiers=(few,)), P, (), 0.0).desired == 4
    missed = TierSignal("gold", finished=50, met=0, target=0.95)
    d = decide(signals(ready=3, starting=1, demand_tokens_per_s=1900, tiers=(missed,)), P, (), 0.0)
    assert d.desired == 4  # capacity is on its way: wait for it


def test_scale_down_waits_for_the_down_window_and_steps_one_at_a_time() -> None:
    params = P.model_copy(update={"down_window_s": 60.0})
    hist: tuple[tuple[float, int], ...] = ()
    d = decide(signals(demand_tokens_per_s=1900), params, hist, 0.0)  # recommends 4: keep
    hist = d.history
    quiet = signals(demand_tokens_per_s=0)
    d = decide(quiet, params, hist, 30.0)
    assert d.recommendation == 0 and d.desired == 4  # the window still holds a 4
    d = decide(quiet, params, d.history, 61.0)
    assert d.desired == 3  # the old 4 left the window; one step down


def test_in_flight_programs_protect_their_replicas() -> None:
    d = decide(signals(demand_tokens_per_s=0, protected=3), P.model_copy(update={"down_window_s": 0}), (), 0)
    assert d.recommendation == 3 and d.desired == 3


def test_queue_metric_follows_the_hpa_formula_with_tolerance() -> None:
    q = P.model_copy(update={"metric": "queue", "target_queue": 4.0})
    assert queue_recommendation(signals(queue_len=32), q)[0] == 8
    assert queue_recommendation(signals(queue_len=17), q)[0] == 4  # 1.06 of target: within 10 %
    assert decide(signals(queue_len=100), q, (), 0.0).desired == 8  # +4 at most per decision


@given(
    ready=st.integers(0, 12),
    starting=st.integers(0, 4),
    demand=st.floats(0, 1e6),
    admitted=st.floats(0, 1e7),
    protected=st.integers(0, 12),
    metric=st.sampled_from(["goodput", "queue"]),
    queue=st.integers(0, 500),
)
def test_desired_stays_within_bounds_and_step_limits(
    ready: int, starting: int, demand: float, admitted: float, protected: int, metric: str, queue: int
) -> None:
    params = P.model_copy(update={"metric": metric, "down_window_s": 0.0})
    s = signals(
        ready=ready,
        starting=starting,
        demand_tokens_per_s=demand,
        admitted_tokens=admitted,
        protected=min(protected, ready),
        queue_len=queue,
    )
    d = decide(s, params, (), 0.0)
    current = ready + starting
    assert params.min_replicas <= d.desired <= params.max_replicas
    if params.min_replicas <= current <= params.max_replicas:
        assert current - params.max_step_down <= d.desired <= current + params.max_step_up
