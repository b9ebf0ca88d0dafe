"""GMAX's batch selection and preemption rule (Algorithm 1, §4.2) on small hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest

from slo_core.policies.gmax_select import (
    batch_capacity,
    best_window,
    cutoff_mask,
    plan_preemptions,
    preemption_gain_loss,
)


def arr(*xs: float) -> np.ndarray:
    return np.asarray(xs, dtype=np.float64)


def idx(*xs: int) -> np.ndarray:
    return np.asarray(xs, dtype=np.int64)


@pytest.mark.parametrize(
    ("p", "kept"),
    [
        (1.0, [0, 1]),  # only the B = 2 best (9 is the 2nd highest)
        (0.85, [0, 1, 2]),  # ≥ 7.65
        (0.5, [0, 1, 2, 3]),  # ≥ 4.5
        (0.1, [0, 1, 2, 3, 4]),
    ],
)
def test_cutoff_keeps_requests_within_p_of_the_bth_priority(p: float, kept: list[int]) -> None:
    prio = arr(10, 9, 8, 5, 1)
    assert np.flatnonzero(cutoff_mask(prio, 2, p)).tolist() == kept


def test_cutoff_with_fewer_requests_than_the_batch_keeps_all_and_zero_batch_keeps_none() -> None:
    assert cutoff_mask(arr(1, 2), 5, 1.0).all()
    assert not cutoff_mask(arr(1, 2), 0, 1.0).any()


def test_window_picks_the_length_sorted_window_with_the_largest_priority_sum() -> None:
    # input lengths:   100  900  120  880  110  905
    # priorities:       5    6    5    6    5    1
    # by length: 100(5) 110(5) 120(5) 880(6) 900(6) 905(1); windows of 3 sum to 15, 16, 17, 13.
    prio = arr(5, 6, 5, 6, 5, 1)
    length = arr(100, 900, 120, 880, 110, 905)
    chosen = best_window(prio, length, idx(0, 1, 2, 3, 4, 5), 3)
    assert sorted(chosen.tolist()) == [1, 2, 3]  # 120, 880, 900 → 5 + 6 + 6 = 17


def test_window_keeps_homogeneous_lengths_when_priorities_tie() -> None:
    prio = arr(1, 1, 1, 1)
    length = arr(50, 4000, 60, 4100)
    # every window sums to 2: the first (shortest inputs) wins, never the mixed one
    assert sorted(best_window(prio, length, idx(0, 1, 2, 3), 2).tolist()) == [0, 2]


def test_window_of_fewer_candidates_than_the_batch_returns_them_all() -> None:
    assert sorted(best_window(arr(1, 2, 3), arr(3, 2, 1), idx(0, 2), 4).tolist()) == [0, 2]
    assert best_window(arr(1), arr(1), idx(0), 0).tolist() == []


def test_batch_capacity_is_bounded_by_slots_and_kv_blocks() -> None:
    need = arr(4, 4, 4, 4)
    order = idx(0, 1, 2, 3)
    assert batch_capacity(need, order, max_num_seqs=3, kv_blocks_budget=100) == 3
    assert batch_capacity(need, order, max_num_seqs=10, kv_blocks_budget=9) == 2
    assert batch_capacity(need, order, max_num_seqs=0, kv_blocks_budget=100) == 0


def test_preemption_gain_and_loss_formula() -> None:
    # gain: (P_w − P_v)·horizon = (50 − 10)·1.5 = 60; loss: stall·Σ running P = 0.2·200 = 40
    assert preemption_gain_loss(50.0, 10.0, 1.5, 0.2, 200.0) == pytest.approx((60.0, 40.0))


def test_preemption_happens_only_when_gain_beats_loss() -> None:
    prio = arr(50, 10)
    args = {"priority": prio, "horizon_s": arr(1.5, 1.5), "batch_rate": 200.0, "min_ratio": 1.0}
    cheap = plan_preemptions(idx(0), idx(1), stall_s=arr(0.0, 0.2), **args)  # type: ignore[arg-type]
    assert [(s.preemptor, s.victim) for s in cheap] == [(0, 1)]
    costly = plan_preemptions(idx(0), idx(1), stall_s=arr(0.0, 0.4), **args)  # type: ignore[arg-type]
    assert costly == []  # loss 80 > gain 60


def test_preemption_needs_the_priority_ratio_and_pairs_each_victim_once() -> None:
    prio = arr(30, 25, 20, 10, 13)
    common = {"priority": prio, "stall_s": np.zeros(5), "horizon_s": np.ones(5), "batch_rate": 1.0}
    swaps = plan_preemptions(idx(0, 1, 2), idx(3, 4), min_ratio=2.0, **common)  # type: ignore[arg-type]
    # 30 ≥ 2·10 swaps; 25 < 2·13 stops the greedy pairing
    assert [(s.preemptor, s.victim) for s in swaps] == [(0, 3)]
    both = plan_preemptions(idx(0, 1, 2), idx(3, 4), min_ratio=1.0, **common)  # type: ignore[arg-type]
    assert [(s.preemptor, s.victim) for s in both] == [(0, 3), (1, 4)]
