"""Tempo LSDF (§4.2): density order, collective rule, throttling, BE reserve, cost-aware preemption."""

from __future__ import annotations

import random

import builders
from builders import BE, SMALL_GPU, deadline, latency, request

from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.tempo import Tempo, TempoParams, service_densities

PROFILE = SMALL_GPU
NOW = 10.0
RNG = random.Random(0)


def dl(
    rid: str,
    *,
    deadline_s: float = 30.0,
    out: int = 100,
    prompt: int = 200,
    weight: float = 1.0,
    arrival: float = NOW,
    gen: int = 0,
    program: str | None = None,
    stage: int | None = None,
) -> RequestView:
    """A deadline request (a stage of ``program``: compound) of ``out`` tokens, due at arrival + deadline."""
    slo = deadline(deadline_s, weight=weight, compound=program is not None)
    return request(
        rid,
        slo,
        arrival_s=arrival,
        prompt=prompt,
        max_tokens=out,
        gen=gen,
        prefilled=gen > 0,
        bound=out,
        due=True,
        program_id=program,
        stage=stage,
    )


def lat(rid: str, *, gen: int = 0, arrival: float = NOW, tbt_s: float = 0.1) -> RequestView:
    slo = latency(1.0, tbt_s)
    return request(
        rid, slo, arrival_s=arrival, prompt=200, max_tokens=300, gen=gen, prefilled=gen > 0, bound=300
    )


def be(rid: str, arrival: float) -> RequestView:
    return request(rid, BE, arrival_s=arrival, prompt=100, max_tokens=50, bound=50)


def engine(step: int = 0, *, seqs: int = 64) -> EngineView:
    return builders.engine(NOW, step=step, seqs=seqs, batched=4096, kv_total=4000, profile=PROFILE)


def order_of(
    policy: Tempo, waiting: list[RequestView], running: list[RequestView] | None = None
) -> tuple[str, ...]:
    return policy.decide(waiting, running or [], engine(), RNG).admit


def test_higher_density_goes_first_priority_and_short_jobs_win() -> None:
    assert order_of(Tempo(), [dl("low", weight=1.0), dl("high", weight=2.0)]) == ("high", "low")
    assert order_of(Tempo(), [dl("long", out=800), dl("short", out=50)]) == ("short", "long")


def test_hopeless_deadlines_decay_the_projected_gain() -> None:
    reqs = [dl("ok", deadline_s=30.0), dl("late", deadline_s=0.2)]
    d = service_densities(reqs, [], engine(), TempoParams())
    assert d.gain[1] < 0.2 * d.gain[0]
    assert order_of(Tempo(), reqs) == ("ok", "late")


def test_collective_calls_share_the_slowest_remaining_time() -> None:
    solo = dl("solo", out=50)
    short_call = dl("call-short", out=50, program="p", stage=1)
    long_call = dl("call-long", out=900, program="p", stage=1)
    d = service_densities([solo, short_call, long_call], [], engine(), TempoParams())
    assert d.remaining_s[1] == d.remaining_s[2] > d.remaining_s[0]
    assert order_of(Tempo(), [short_call, long_call, solo])[0] == "solo"


def test_latency_request_ahead_of_its_pace_is_throttled() -> None:
    # "ahead" arrived just now and already has 40 tokens: its next token is due 5 s from now.
    ahead, due = lat("ahead", gen=40), lat("due", gen=40, arrival=NOW - 4.9)
    d = service_densities([ahead, due], [], engine(), TempoParams())
    assert list(d.throttled) == [True, False]
    assert order_of(Tempo(), [ahead, due]) == ("due", "ahead")


def test_best_effort_gets_its_reserved_slots_fcfs() -> None:
    slo = [dl(f"s{i}", weight=1.0 + i / 10) for i in range(30)]
    order = (
        Tempo(reserve_fraction=0.1)
        .decide([be("be2", 2.0), *slo, be("be1", 1.0)], [], engine(seqs=20), RNG)
        .admit
    )
    assert order.index("be1") < 20 and order.index("be2") < 20
    assert order.index("be1") < order.index("be2")
    no_reserve = Tempo(reserve_fraction=0.0).decide([be("be1", 1.0), *slo], [], engine(seqs=20), RNG).admit
    assert no_reserve.index("be1") == 30


def _full_engine(step: int) -> EngineView:
    return engine(step=step, seqs=2)


def test_preempts_only_when_the_gain_beats_the_recompute_loss_and_only_per_quantum() -> None:
    running = [
        dl("slow", deadline_s=500.0, out=4000, prompt=100, arrival=NOW - 1, gen=10),
        dl("busy", deadline_s=5.0, out=50, prompt=100, weight=3.0, arrival=NOW - 1, gen=10),
    ]
    urgent = dl("urgent", deadline_s=3.0, out=20, weight=5.0)
    policy = Tempo(quantum_steps=20)
    d = policy.decide([urgent], running, _full_engine(100), RNG)
    assert d.preempt == ("slow",)
    assert "slow" not in (d.running_order or ())
    assert policy.decide([urgent], running, _full_engine(110), RNG).preempt == ()  # same quantum
    assert policy.decide([urgent], running, _full_engine(120), RNG).preempt == ("slow",)
    assert Tempo(preemption_cost_scale=1e6).decide([urgent], running, _full_engine(0), RNG).preempt == ()


def test_admit_lists_waiting_and_running_order_lists_running() -> None:
    running = [lat("r1", gen=5, arrival=NOW - 2), lat("r2", gen=5, arrival=NOW - 1)]
    d = Tempo().decide([dl("w1"), dl("w2")], running, engine(), RNG)
    assert set(d.admit) == {"w1", "w2"}
    assert set(d.running_order or ()) == {"r1", "r2"}
    assert Tempo(quantum_steps=7).frame_steps == 7
