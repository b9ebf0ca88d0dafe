"""GMAX's learned reading of the analyzer's bound (gmax_bound): what it learns, from what, and that
the feasibility test reads it on both of GMAX's paths."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from builders import DL, LAT, engine, request

from slo_core.perf import load_profile
from slo_core.policies import gmax_bound
from slo_core.policies.base import EngineView, FinishedView, RequestView
from slo_core.policies.gmax import GMAX, GMAXNoAnalyzer, GMAXOracle
from slo_core.policies.gmax_bound import BoundReading, median_lower_limit
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_priority import z_of_quantile
from slo_core.policies.gmax_snapshot import DEADLINE, LATENCY

STATIC = z_of_quantile(0.95)
PROFILE = load_profile("h100-llama3-8b-tp1")
SIGMA = GMAXParams().length_sigma


def finished(view: RequestView, generated: int) -> FinishedView:
    return FinishedView(replace(view, generated_tokens=generated), 1.0, 1.0, 1.0, True)


def teach(reading: BoundReading | GMAX, kind: Any, ratio: float, n: int, *, prefix: str = "t") -> None:
    """``n`` requests of ``kind`` whose first bound was ``ratio`` times the length they finished at."""
    learn = reading.observe if isinstance(reading, GMAX) else None
    bounds = reading.bounds if isinstance(reading, GMAX) else reading
    views = [request(f"{prefix}{i}", kind, bound=round(100 * ratio), max_tokens=4096) for i in range(n)]
    for v in views:
        bounds.first_seen(v)
    done = [finished(v, 100) for v in views]
    if learn is not None:
        learn(done, 1.0)
    else:
        bounds.learn(done)


def test_learns_per_kind_the_median_log_ratio_over_sigma() -> None:
    reading = BoundReading(GMAXParams())
    teach(reading, DL, 10.0, 30)
    assert reading.z_by_kind[DEADLINE] == pytest.approx(math.log(10.0) / SIGMA)
    assert reading.z_by_kind[LATENCY] == STATIC  # nothing of that kind finished
    rows = reading.z_of(np.array([DEADLINE, LATENCY, DEADLINE]))
    assert rows.tolist() == [reading.z_by_kind[DEADLINE], STATIC, reading.z_by_kind[DEADLINE]]


def test_calibration_moves_a_bound_to_where_the_static_reading_puts_it() -> None:
    """Bounds 10x the lengths: scaled, a bound is the static quantile of lengths whose median is the
    true length (100 · exp(z_static·σ)); a kind nothing was learned of keeps its bound."""
    reading = BoundReading(GMAXParams())
    assert reading.scale_by_kind == [1.0] * len(reading.scale_by_kind)
    teach(reading, DL, 10.0, 30)
    scale = reading.scale_by_kind[DEADLINE]
    assert 1000 * scale == pytest.approx(100 * math.exp(STATIC * SIGMA))
    assert reading.scale_by_kind[LATENCY] == 1.0
    assert reading.scale_of(np.array([DEADLINE, LATENCY])).tolist() == [scale, 1.0]


def test_median_lower_limit_is_a_lower_confidence_limit() -> None:
    assert median_lower_limit([5.0] * 10) == 5.0
    values = list(range(200))  # n = 200: the 86th smallest (index 86)
    random.Random(3).shuffle(values)
    assert median_lower_limit(map(float, values)) == 86.0
    # over many samples of a known distribution the limit sits below the median ~97.5 % of the time
    rng = random.Random(5)
    below = sum(median_lower_limit(rng.gauss(0.0, 1.0) for _ in range(200)) <= 0.0 for _ in range(400))
    assert 0.95 <= below / 400 <= 1.0


def test_the_reading_kept_in_order_is_the_windows_median_limit_at_every_finish() -> None:
    """The window is kept sorted as finishes come and go (one inserted, the oldest evicted): after
    each finish the z is the one :func:`median_lower_limit` of the window's values gives, repeated
    values and evictions included."""
    p = GMAXParams(bound_window=25, bound_min_samples=5)
    reading = BoundReading(p)
    window: deque[float] = deque(maxlen=25)
    rng = random.Random(13)
    for i in range(300):
        bound, length = rng.choice([1000, 400, 250]), rng.choice([100, 120, 250, 400, 990])
        v = request(f"w{i}", DL, bound=bound, max_tokens=4096)
        reading.first_seen(v)
        reading.learn([finished(v, length)])
        window.append(math.log(bound / length))
        want = STATIC
        if len(window) >= p.bound_min_samples:
            want = min(reading.cap, max(STATIC, median_lower_limit(window) / SIGMA))
        assert reading.z_by_kind[DEADLINE] == want, i


def test_a_kind_whose_bounds_sit_where_the_static_reading_puts_them_stays_static() -> None:
    """Bounds at the static 95th percentile, with noise: the plain median lands above the static z
    in 11 of these 20 trials; its lower confidence limit in at most 2."""
    rng = random.Random(11)
    moved = 0
    for trial in range(20):
        reading = BoundReading(GMAXParams())
        views = [request(f"{trial}-{i}", DL, bound=1000, max_tokens=100_000) for i in range(200)]
        for v in views:
            reading.first_seen(v)
        # true lengths log-normal around the median the static reading assumes
        median = 1000 * math.exp(-STATIC * SIGMA)
        reading.learn([finished(v, max(1, round(median * math.exp(rng.gauss(0, SIGMA))))) for v in views])
        moved += reading.z_by_kind[DEADLINE] > STATIC
    assert moved <= 2


def test_static_until_enough_have_finished_then_floored_and_capped() -> None:
    reading = BoundReading(GMAXParams(bound_min_samples=20))
    teach(reading, DL, 10.0, 19)
    assert reading.z_by_kind[DEADLINE] == STATIC
    teach(reading, DL, 10.0, 1, prefix="u")
    assert reading.z_by_kind[DEADLINE] > STATIC
    low = BoundReading(GMAXParams())
    teach(low, DL, 0.5, 40)  # bounds below the true lengths: never read as less than the 95th percentile
    assert low.z_by_kind[DEADLINE] == STATIC
    high = BoundReading(GMAXParams(bound_z_cap=3.0))
    teach(high, DL, 1000.0, 40)
    assert high.z_by_kind[DEADLINE] == 3.0


def test_window_keeps_only_the_latest_finishes() -> None:
    reading = BoundReading(GMAXParams(bound_window=50, bound_min_samples=10))
    teach(reading, DL, 20.0, 50)
    teach(reading, DL, 4.0, 50, prefix="later")
    assert reading.z_by_kind[DEADLINE] == pytest.approx(math.log(4.0) / SIGMA)


def test_learns_only_from_first_bounds_of_requests_that_finished_on_their_own() -> None:
    reading = BoundReading(GMAXParams(bound_min_samples=1))
    cut = request("cut", DL, bound=1000, max_tokens=100)
    unbounded = request("nobound", DL)
    zero = request("zero", DL, bound=0)  # a malformed tag's: never a log(0)
    for v in (cut, unbounded, zero):
        reading.first_seen(v)
    assert reading.tracked == 1  # only "cut" had a bound
    reading.learn([finished(cut, 100), finished(unbounded, 50), finished(zero, 5)])
    assert reading.z_by_kind[DEADLINE] == STATIC  # "cut" stopped at max_tokens: length unknown
    assert reading.tracked == 0
    # the first bound counts, not the refined one seen later
    fresh = request("fresh", DL, bound=1000, max_tokens=4096)
    reading.first_seen(fresh)
    reading.first_seen(replace(fresh, output_bound=120, generated_tokens=0))
    reading.learn([finished(fresh, 100)])
    assert reading.z_by_kind[DEADLINE] == pytest.approx(math.log(10.0) / SIGMA)


def test_a_bound_that_arrives_late_or_above_max_tokens_is_read_as_gmax_reads_it() -> None:
    reading = BoundReading(GMAXParams(bound_min_samples=1, bound_z_cap=10.0))
    late = request("late", DL, max_tokens=4096)
    reading.first_seen(late)  # no bound yet: the analyzer answers later
    reading.first_seen(replace(late, output_bound=2000, generated_tokens=3))
    big = request("big", DL, bound=8000, max_tokens=1000)  # GMAX reads min(bound, max_tokens)
    reading.first_seen(big)
    reading.learn([finished(late, 125), finished(big, 125)])
    # 16x and 8x: of two, the lower confidence limit of the median is the smaller
    assert reading.z_by_kind[DEADLINE] == pytest.approx(math.log(8.0) / SIGMA)


@pytest.mark.parametrize("numpy_path", [False, True], ids=["scalar", "numpy"])
def test_both_paths_pick_up_a_bound_that_arrives_after_the_first_decision(
    monkeypatch: pytest.MonkeyPatch, numpy_path: bool
) -> None:
    if numpy_path:
        monkeypatch.setattr("slo_core.policies.gmax_scalar.MAX_ROWS", -1)
    gmax = GMAX()
    first = request("a", DL, max_tokens=4096)
    gmax.decide([first], [], _engine(1.0), random.Random(0))
    assert gmax.bounds.tracked == 0
    gmax.decide([replace(first, output_bound=900)], [], _engine(1.1), random.Random(0))
    assert gmax.bounds.tracked == 1


def test_min_samples_above_the_window_is_refused() -> None:
    with pytest.raises(ValueError, match="never start"):
        GMAXParams(bound_window=10, bound_min_samples=20)


def test_first_bounds_of_requests_that_never_finish_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gmax_bound, "MAX_TRACKED", 100)
    reading = BoundReading(GMAXParams())
    for i in range(1000):  # rejected or aborted: never observed
        reading.first_seen(request(f"r{i}", DL, bound=50))
    assert reading.tracked <= 100
    reading.first_seen(request("last", DL, bound=50))
    assert reading.tracked <= 100


@pytest.mark.parametrize(
    ("policy", "learns"),
    [
        (GMAX(), True),
        (GMAX(bound_reading="static"), False),
        (GMAXOracle(), False),
        (GMAXNoAnalyzer(), False),
    ],
    ids=["gmax", "static", "oracle", "no-analyzer"],
)
def test_which_variants_learn(policy: GMAX, learns: bool) -> None:
    teach(policy, DL, 10.0, 40)
    assert policy.bounds.learning is learns
    assert (policy.bounds.z_by_kind[DEADLINE] > STATIC) is learns


def _engine(now_s: float) -> EngineView:
    return engine(now_s, step=1, seqs=8, batched=2048, kv_total=20_000, profile=PROFILE)


@pytest.mark.parametrize("numpy_path", [False, True], ids=["scalar", "numpy"])
def test_gmax_reads_a_learned_bound_as_more_likely_to_fit(
    monkeypatch: pytest.MonkeyPatch, numpy_path: bool
) -> None:
    """A deadline request whose bound does not fit its time left: read at the 95th percentile it
    rarely fits; once GMAX learned that deadline bounds sit 10x above the lengths, it likely does."""
    if numpy_path:
        monkeypatch.setattr("slo_core.policies.gmax_scalar.MAX_ROWS", -1)
    tight = request("tight", replace(DL, deadline_s=2.8), bound=800, max_tokens=4096, arrival_s=0.0)
    chat = request("chat", LAT, bound=100, max_tokens=4096, arrival_s=0.0)
    static, learned = GMAX(bound_reading="static"), GMAX()
    teach(learned, DL, 10.0, 40)
    out = {}
    for name, policy in (("static", static), ("learned", learned)):
        policy.decide([tight, chat], [], _engine(1.0), random.Random(0))
        est = policy.last_estimates
        assert est is not None
        out[name] = est.priority.tolist()
    assert out["learned"][0] > 1.5 * out["static"][0]  # the deadline request
    assert out["learned"][1] == out["static"][1]  # latency: nothing of its kind learned


@pytest.mark.parametrize("numpy_path", [False, True], ids=["scalar", "numpy"])
def test_a_calibrated_bound_keeps_the_learned_chance_of_fitting_and_shortens_the_work(
    monkeypatch: pytest.MonkeyPatch, numpy_path: bool
) -> None:
    """``calibrate_bound``: every estimate reads the scaled bound; the chance of finishing in time is
    the learned reading's (under the request goodput a running request's goodput is that chance), the
    modelled remaining time shrinks by the scale."""
    if numpy_path:
        monkeypatch.setattr("slo_core.policies.gmax_scalar.MAX_ROWS", -1)
    run = request("run", replace(DL, deadline_s=4.0), bound=3000, max_tokens=16384, gen=5, prefilled=True)
    out = {}
    for calibrate in (False, True):
        policy = GMAX(goodput="request", calibrate_bound=calibrate)
        teach(policy, DL, 10.0, 40)
        policy.decide([], [run], _engine(1.0), random.Random(0))
        est = policy.last_estimates
        assert est is not None
        out[calibrate] = est
    scale = math.exp(-(math.log(10.0) / SIGMA - STATIC) * SIGMA)
    assert out[True].bound_tokens[0] == pytest.approx(3000 * scale)
    assert out[False].bound_tokens[0] == 3000
    assert 0.05 < out[True].goodput[0] < 0.95
    assert out[True].goodput[0] == pytest.approx(out[False].goodput[0], rel=1e-9)
    assert out[True].t_gen_s[0] < 0.5 * out[False].t_gen_s[0]
