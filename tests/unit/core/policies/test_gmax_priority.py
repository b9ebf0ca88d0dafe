"""GMAX per-request formulas (JITServe §4.2) pinned on hand-worked cases: bound, bandwidth, priority."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from builders import BE, CP, DL, LAT, deadline, request

from slo_core import detmath
from slo_core.policies.base import RequestView
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_priority import (
    Estimates,
    Groups,
    SpeedModel,
    estimate,
    fit_probability,
    nan_to_num,
    normal_cdf,
    stage_product,
    stage_sum,
)
from slo_core.policies.gmax_snapshot import SnapshotTable
from slo_core.slo import SLOTargets

SPEED = SpeedModel(step_s=0.01, prefill_s_per_token=0.001)


def req(rid: str, slo: SLOTargets, *, done: bool = True, **kw: Any) -> RequestView:
    """Bounded at 100 output tokens (capped at 2048), prompt and generated tokens computed unless not done."""
    kw.setdefault("bound", 100)
    kw.setdefault("max_tokens", 2048)
    return request(rid, slo, prefilled=done, **kw)


def run(
    reqs: list[RequestView],
    now_s: float,
    *,
    waiting: list[RequestView] | None = None,
    speed: SpeedModel = SPEED,
    frame_s: float = 0.5,
    **params: Any,
) -> Estimates:
    cols = SnapshotTable().columns(waiting or [], reqs)
    return estimate(cols, now_s, speed, GMAXParams(**params), frame_s)


def test_deadline_request_bandwidth_and_priority() -> None:
    # 100 tokens left at 10 ms each: t_gen = 1 s; deadline 20 s after arrival, now 10 → t_rem = 10 s.
    e = run([req("d", DL)], now_s=10.0)
    assert e.t_gen_s[0] == pytest.approx(1.0)
    assert e.t_rem_s[0] == pytest.approx(10.0)
    assert e.bandwidth[0] == pytest.approx(0.1)
    # token goodput of a deadline request: input + output tokens = 200, over t_gen = 1 s.
    assert e.goodput[0] == pytest.approx(200.0)
    assert e.priority[0] == pytest.approx(200.0)


def test_deadline_request_that_cannot_finish_pays_nothing() -> None:
    # 100 tokens need 1 s but only 0.5 s remain: the Appendix B filter zeroes its goodput.
    e = run([req("d", DL)], now_s=19.5, feasibility="bound")
    assert e.bandwidth[0] == pytest.approx(2.0)
    assert not e.feasible[0]
    assert e.goodput[0] == 0.0
    assert e.priority[0] == 0.0


def test_latency_request_bandwidth_is_set_by_tbt_and_counts_tokens_still_on_time() -> None:
    # Start 1 s after TTFT's 2 s: token i arrives at 3 + (i+1)·0.05 and is due at 2 + 0.1·i,
    # so it is on time iff i ≥ 21 → 100 − 21 = 79 of 100 tokens still pay.
    speed = SpeedModel(step_s=0.05, prefill_s_per_token=0.0)
    e = run([req("l", LAT)], now_s=3.0, speed=speed)
    assert e.bandwidth[0] == pytest.approx(0.5)  # v / TBT = 0.05 / 0.1
    assert e.goodput[0] == pytest.approx(79.0)
    assert e.priority[0] == pytest.approx(79.0 / 5.0)
    assert e.t_rem_s[0] == pytest.approx(2.0 + 99 * 0.1 - 3.0)  # due time of the last bounded token


def test_latency_request_on_time_pays_every_remaining_token() -> None:
    e = run([req("l", LAT, gen=10, first_token_s=0.5)], now_s=1.5)
    assert e.goodput[0] == pytest.approx(90.0)


def test_prefill_of_uncomputed_tokens_counts_in_t_gen() -> None:
    # 100 prompt tokens not yet computed: one chunk step (10 ms) + 100·1 ms of prefill work.
    e = run([], now_s=0.0, waiting=[req("w", DL, done=False, waiting_since_s=0.0)])
    assert e.t_gen_s[0] == pytest.approx(0.01 + 0.1 + 1.0)


def test_waiting_requests_gain_delta_per_frame_waited() -> None:
    w = req("w", DL, waiting_since_s=0.0)
    e = run([], now_s=19.8, waiting=[w], delta_per_frame=2.0, frame_s=0.5, feasibility="bound")
    # infeasible (needs 1 s, 0.2 s left) so only the starvation guard pays: 2 · 19.8 / 0.5
    assert e.goodput[0] == pytest.approx(2.0 * 19.8 / 0.5)
    running = run([req("r", DL)], now_s=19.8, delta_per_frame=2.0, frame_s=0.5, feasibility="bound")
    assert running.goodput[0] == 0.0  # running requests are not waiting


def test_under_request_goodput_the_guard_is_delta_tokens_share_of_a_request() -> None:
    # a request is worth one under the request goodput: δ·frames waited would outweigh any value
    # after one frame, so the guard pays δ/(prompt + bound) a frame: 2 · 19.8 / 0.5 / (100 + 100)
    w = req("w", DL, waiting_since_s=0.0)
    e = run(
        [], now_s=19.8, waiting=[w], delta_per_frame=2.0, frame_s=0.5, feasibility="bound", goodput="request"
    )
    assert e.goodput[0] == pytest.approx(2.0 * 19.8 / 0.5 / 200.0)


def test_best_effort_gets_the_default_deadline() -> None:
    e = run([req("b", BE, arrival_s=5.0)], now_s=5.0, best_effort_deadline_s=30.0)
    assert e.deadline_at_s[0] == pytest.approx(35.0)
    assert e.goodput[0] == pytest.approx(200.0)


def test_compound_calls_are_judged_against_their_program_deadline_by_default() -> None:
    # the goodput functions pay a compound program only at its own deadline, never at a stage's
    a = req("a", CP, program_id="p", stage=0, deadline_at_s=5.0, program_deadline_at_s=60.0)
    e = run([a], now_s=10.0)  # the stage sub-deadline passed; the program has 50 s left
    assert e.deadline_at_s[0] == pytest.approx(60.0)
    assert e.goodput[0] > 0
    stage = run([a], now_s=10.0, compound_deadline="stage")
    assert stage.deadline_at_s[0] == pytest.approx(5.0)
    assert stage.goodput[0] == 0.0


def test_compound_stage_calls_aggregate_length_bandwidth_and_goodput() -> None:
    # program p attained 500 tokens: 300 in stage 0 plus the two live calls' computed prompts
    a = req("a", CP, program_id="p", stage=1, program_attained_tokens=500, deadline_at_s=30.0, bound=50)
    b = req("b", CP, program_id="p", stage=1, program_attained_tokens=500, deadline_at_s=30.0, bound=150)
    other = req("c", CP, program_id="q", stage=0, deadline_at_s=30.0, bound=100)
    # the stage's own work only (program_rest off: the later stages' reserved time is tested below)
    e = run([a, b, other], now_s=10.0, compound_deadline="stage", program_rest=False)
    # stage p/1: len_rem 50 + 150, t_gen 0.5 + 1.5 = 2 s; goodput = 300 earlier + (100+50) + (100+150)
    assert e.len_rem_tokens[:2].tolist() == [200.0, 200.0]
    assert e.t_gen_s[:2] == pytest.approx([2.0, 2.0])
    assert e.bandwidth[:2] == pytest.approx([0.1, 0.1])  # 2 s over the 20 s to the stage sub-deadline
    assert e.goodput[:2] == pytest.approx([700.0, 700.0])
    assert e.priority[0] == e.priority[1] == pytest.approx(350.0)
    assert e.t_gen_s[2] == pytest.approx(1.0)  # another program is not aggregated


def test_compound_sub_deadline_never_exceeds_the_program_deadline() -> None:
    late = req("a", CP, program_id="p", stage=0, deadline_at_s=500.0, program_deadline_at_s=60.0)
    e = run([late], now_s=0.0)
    assert e.deadline_at_s[0] == pytest.approx(60.0)
    unset = req("b", CP, program_id="p", stage=0, program_arrival_s=-10.0)
    assert run([unset], now_s=0.0).deadline_at_s[0] == pytest.approx(50.0)  # program arrival + 60 s


@pytest.mark.parametrize(
    ("kwargs", "params", "expected"),
    [
        ({"bound": 300}, {}, 300.0),
        ({"bound": None}, {}, 1024.0),  # analyzer gave no bound: the fallback
        ({"bound": None, "max_tokens": 200}, {}, 200.0),  # ... capped by max_tokens
        ({"bound": 100, "gen": 120}, {}, 170.0),  # passed bound relaxes by one 50-token step
        ({"bound": 300, "true_output_tokens": 42}, {"length_source": "oracle"}, 42.0),
        ({"bound": 300}, {"length_source": "mean", "mean_output_tokens": 250.0}, 250.0),
    ],
)
def test_output_bound_sources(kwargs: dict[str, Any], params: dict[str, Any], expected: float) -> None:
    e = run([req("r", DL, **kwargs)], now_s=0.0, **params)
    assert e.bound_tokens[0] == pytest.approx(expected)


def test_request_goodput_counts_one_per_feasible_request() -> None:
    e = run(
        [req("d", DL), req("late", DL, arrival_s=-19.5)], now_s=0.0, goodput="request", feasibility="bound"
    )
    assert e.goodput.tolist() == [1.0, 0.0]


def test_priority_weight_scales_goodput() -> None:
    heavy = deadline(weight=3.0)
    e = run([req("d", DL), req("h", heavy)], now_s=0.0)
    assert e.priority[1] == pytest.approx(3.0 * e.priority[0])


@pytest.mark.parametrize("name", ["token", "request", "tempo", "tdg"])
def test_every_goodput_function_gives_finite_nonnegative_priorities(name: str) -> None:
    reqs = [req("l", LAT), req("d", DL), req("c", CP, program_id="p", stage=0), req("b", BE)]
    e = run(reqs, now_s=1.0, goodput=name)
    assert np.all(np.isfinite(e.priority)) and np.all(e.priority >= 0)
    assert e.priority[1] > 0  # a feasible deadline request pays under every function


def test_request_and_token_goodputs_weigh_a_program_by_its_remaining_work() -> None:
    # p is in its first stage, with 40 s reserved for its later stages (stage sub-deadline 20 s,
    # program deadline 60 s); q is in its last stage. Each call: 100 tokens left, t_gen = 1 s.
    p = req("p", CP, program_id="p", stage=0, deadline_at_s=20.0, program_deadline_at_s=60.0)
    q = req("q", CP, program_id="q", stage=3, deadline_at_s=60.0, program_deadline_at_s=60.0)
    e = run([p, q], now_s=10.0, goodput="request", feasibility="bound")
    # both programs pay 1 when done; p still needs this stage and 40 s of later stages
    assert e.goodput.tolist() == [1.0, 1.0]
    assert e.priority == pytest.approx([1.0 / (1.0 + 40.0), 1.0])
    off = run([p, q], now_s=10.0, goodput="request", feasibility="bound", program_rest=False)
    assert off.priority == pytest.approx([1.0, 1.0])
    # the token goodput also pays a program once, at its end (slo_core.gain): the same weighing
    tok = run([p, q], now_s=10.0, feasibility="bound")
    assert tok.goodput[0] == pytest.approx(tok.goodput[1])
    assert tok.priority[0] == pytest.approx(tok.priority[1] / 41.0)
    tok_off = run([p, q], now_s=10.0, feasibility="bound", program_rest=False)
    assert tok_off.priority[0] == pytest.approx(tok_off.priority[1])
    # tdg pays per token: per-stage priority whatever program_rest says
    tdg = run([p, q], now_s=10.0, goodput="tdg", feasibility="bound")
    assert tdg.priority[0] == pytest.approx(tdg.priority[1])


_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-300, -3.5, 39.0, 41.0, 1e300, -1e308, 7.25])


@pytest.mark.parametrize("nan", [0.0, -np.inf, np.inf, 3.0])
def test_nan_to_num_is_numpys(nan: float) -> None:
    assert np.array_equal(nan_to_num(_SPECIAL, nan=nan), np.nan_to_num(_SPECIAL, nan=nan), equal_nan=True)


def test_normal_cdf_and_fit_probability_give_numpys_clipping_results_bit_for_bit() -> None:
    """The hot-path forms (no np.nan_to_num / np.clip) against the forms they replaced (exp and log
    the host-independent ones, slo_core.detmath, as in the policy)."""
    x = np.concatenate((_SPECIAL, np.linspace(-60.0, 60.0, 2001)))
    z = np.abs(np.nan_to_num(x, nan=0.0, posinf=40.0, neginf=-40.0)) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    with np.errstate(over="ignore"):  # the replaced form squared 1e300 (the new one caps |x| first)
        erf = 1.0 - poly * detmath.exp(-z * z)
    before = np.where(np.nan_to_num(x, nan=0.0) >= 0, 0.5 * (1.0 + erf), 0.5 * (1.0 - erf))
    assert np.array_equal(normal_cdf(x), before)
    rng = np.random.default_rng(5)
    g = np.concatenate(([0.0, 0.0, 5.0, 5.0], rng.integers(0, 400, 500).astype(float)))
    bound = np.concatenate(([0.0, 10.0, 1.0, np.inf], rng.integers(1, 800, 500).astype(float)))
    slack = np.concatenate(([np.nan, -np.inf, np.inf, 0.0], rng.normal(100.0, 300.0, 500)))
    with np.errstate(divide="ignore", invalid="ignore"):
        p = fit_probability(g, bound, slack, 0.45, 1.64)
    assert np.all((p >= 0.0) & (p <= 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        log_b = detmath.log(np.maximum(bound, 1.0))
        hi = normal_cdf((detmath.log(np.maximum(g + slack, 1e-9)) - log_b) / 0.45 + 1.64)
        lo = np.where(g > 0, normal_cdf((detmath.log(np.maximum(g, 1e-9)) - log_b) / 0.45 + 1.64), 0.0)
        raw = np.where(slack <= 0, 0.0, (hi - lo) / np.maximum(1.0 - lo, 1e-12))
    assert np.array_equal(p, np.clip(np.nan_to_num(raw), 0.0, 1.0))


def _fit_probability_whole_array(
    g: np.ndarray, bound: np.ndarray, slack: np.ndarray, z: object, sigma: float = 0.45
) -> np.ndarray:
    """fit_probability as it was before it evaluated only the rows with slack: every row, then masked."""
    with np.errstate(divide="ignore", invalid="ignore"):
        log_b = detmath.log(np.maximum(bound, 1.0))
        hi = normal_cdf((detmath.log(np.maximum(g + slack, 1e-9)) - log_b) / sigma + z)
        lo = np.where(g > 0, normal_cdf((detmath.log(np.maximum(g, 1e-9)) - log_b) / sigma + z), 0.0)
        p = np.where(slack <= 0, 0.0, (hi - lo) / np.maximum(1.0 - lo, 1e-12))
    out: np.ndarray = np.where(np.isnan(p), 0.0, np.minimum(np.maximum(p, 0.0), 1.0))
    return out


@pytest.mark.parametrize("per_row_z", [False, True])
def test_fit_probability_on_the_rows_with_slack_is_the_whole_array_form_bit_for_bit(per_row_z: bool) -> None:
    """Evaluating the CDFs only where they matter gives each row the very bits the whole-array form
    gave (signed zeros included), for one z or one per row, at sizes on both sides of numpy's SIMD
    blocks."""
    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(1, 3000))
        g = np.where(rng.random(n) < 0.6, 0.0, rng.integers(1, 2000, n).astype(float))
        bound = rng.lognormal(5.0, 1.5, n)
        bound[rng.random(n) < 0.05] = np.nan
        bound[rng.random(n) < 0.02] = np.inf
        slack = rng.normal(100.0, 400.0, n)
        slack[rng.random(n) < 0.1] = -np.inf
        slack[rng.random(n) < 0.05] = np.nan
        slack[rng.random(n) < 0.02] = np.inf
        z: np.ndarray | float = rng.uniform(1.6, 6.0, n) if per_row_z else 1.6448536
        with np.errstate(divide="ignore", invalid="ignore"):
            got = fit_probability(g, bound, slack, 0.45, z)
        want = _fit_probability_whole_array(g, bound, slack, z)
        assert np.array_equal(got.view(np.int64), want.view(np.int64))


def test_stage_product_is_exp_of_the_stage_sums_of_logs_bit_for_bit() -> None:
    """Rows whose probability is 0 or 1 (and stages whose log sum is 0 or −inf) take constants
    instead of detmath's log and exp: each row gets the bits of exp(stage_sum(log p)) over every row,
    with signed zeros, NaN and values outside [0, 1] evaluated as before, at sizes on both sides of
    detmath's scalar cut-over."""
    rng = np.random.default_rng(5)
    for _ in range(400):
        n = int(rng.integers(1, 400))
        p = rng.choice([0.0, -0.0, 1.0, 1.0, 1.0, np.nan, 1.5, -0.2], n)
        inner = rng.random(n) < rng.random()
        p[inner] = rng.random(int(inner.sum()))
        key = rng.integers(0, max(1, n // 3), n)
        groups = Groups(key, rng.random(n) < 0.7)
        with np.errstate(divide="ignore", invalid="ignore"):
            want = detmath.exp(stage_sum(groups, detmath.log(p)))
            got = stage_product(groups, p)
        assert np.array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("sigma", [0.45, 1e-9, 1e-15])
@pytest.mark.parametrize("per_row_z", [False, True])
def test_fit_probability_of_rows_certain_to_fit_is_the_whole_array_form_bit_for_bit(
    per_row_z: bool, sigma: float
) -> None:
    """Rows with slack to spare take 1 without a log or a CDF: their upper argument lies around the
    cut (7–10 standard units) and their lower one around its own (3–7), so rows on both sides of
    each are compared with evaluating every row; with a spread so small that rounding would blur the
    cut, every row is evaluated."""
    rng = np.random.default_rng(17)
    for _ in range(300):
        n = int(rng.integers(1, 2000))
        z: np.ndarray | float = rng.uniform(1.6, 6.0, n) if per_row_z else 1.6448536
        bound = rng.lognormal(5.0, 1.5, n)
        bound[rng.random(n) < 0.03] = np.inf
        x_hi = rng.uniform(7.0, 10.0, n)
        x_lo = rng.uniform(3.0, 7.0, n)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            g = np.where(rng.random(n) < 0.5, 0.0, np.floor(bound * np.exp(sigma * (x_lo - z))))
            slack = bound * np.exp(sigma * (x_hi - z)) - g
            got = fit_probability(g, bound, slack, sigma, z)
            want = _fit_probability_whole_array(g, bound, slack, z, sigma)
        assert np.array_equal(got.view(np.int64), want.view(np.int64))
        if sigma == 0.45:
            assert (got == 1.0).any()


def test_normal_cdf_is_exactly_one_from_8_25_on_and_leaves_room_below_five() -> None:
    """What fit_probability's rows certain to fit rest on (its _X_CERTAIN, 8.3, and _X_ROOM)."""
    x = np.concatenate((np.linspace(8.25, 9.0, 750_001), np.linspace(9.0, 45.0, 200_001), [1e6, np.inf]))
    assert (normal_cdf(x) == 1.0).all()
    assert (1.0 - normal_cdf(np.linspace(-5.0, 5.0, 100_001)) > 1e-7).all()
