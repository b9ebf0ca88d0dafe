"""Online tuning of GMAX's cutoff p: explore every threshold, then converge to the best recent one."""

from __future__ import annotations

import random

from slo_core.policies.gmax_tuning import CutoffTuner


def run_epochs(
    tuner: CutoffTuner, reward: dict[float, float], epochs: int, rng: random.Random
) -> list[float]:
    """Drive ``epochs`` epochs of 10 s, each finishing 10 requests paying reward[p] of their ideal."""
    used = []
    now = 0.0
    tuner.cutoff(now, rng)
    for _ in range(epochs):
        p = tuner.current
        used.append(p)
        for _ in range(10):
            tuner.record(reward[p], 1.0)
        now += 10.0
        tuner.cutoff(now, rng)
    return used


def test_tries_every_cutoff_nearest_first_then_keeps_the_best() -> None:
    tuner = CutoffTuner((0.5, 0.8, 1.0), initial=0.8, epoch_s=10.0, explore=0.0)
    used = run_epochs(tuner, {0.5: 0.9, 0.8: 0.5, 1.0: 0.6}, epochs=8, rng=random.Random(1))
    assert used[:3] == [0.8, 1.0, 0.5]  # initial, then by distance from it (ties: smaller first)
    assert used[3:] == [0.5] * 5


def test_follows_a_change_in_which_cutoff_pays_best() -> None:
    tuner = CutoffTuner((0.5, 1.0), initial=1.0, epoch_s=10.0, explore=0.5)
    rng = random.Random(3)
    run_epochs(tuner, {0.5: 0.2, 1.0: 0.8}, epochs=20, rng=rng)
    assert tuner.rewards[1.0] > tuner.rewards[0.5]
    used = run_epochs(tuner, {0.5: 0.9, 1.0: 0.1}, epochs=60, rng=rng)
    assert used[-10:].count(0.5) >= 8  # exploration found the new best and stayed with it


def test_epochs_without_enough_completions_keep_the_cutoff() -> None:
    tuner = CutoffTuner((0.5, 1.0), initial=1.0, epoch_s=10.0, explore=0.0)
    rng = random.Random(0)
    tuner.cutoff(0.0, rng)
    tuner.record(1.0, 1.0)
    assert tuner.cutoff(50.0, rng) == 1.0 and tuner.epochs == 0


def test_disabled_or_single_candidate_never_moves() -> None:
    rng = random.Random(0)
    for tuner in (
        CutoffTuner((0.5, 1.0), initial=0.95, epoch_s=1.0, explore=1.0, enabled=False),
        CutoffTuner((0.9,), initial=0.9, epoch_s=1.0, explore=1.0),
    ):
        assert run_epochs(tuner, {0.5: 1.0, 0.9: 0.0, 0.95: 0.0, 1.0: 1.0}, 5, rng) == [tuner.current] * 5
