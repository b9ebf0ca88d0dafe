"""Online tuning of GMAX's priority cutoff p (JITServe §4.2: explore thresholds, converge to the best).

Time is cut into epochs of ``epoch_s`` engine-clock seconds; one cutoff runs per epoch. An epoch's
reward is the attained share of goodput of the requests that finished in it, Σ gain / Σ ideal gain
(normalizing by the ideal keeps epochs of different load comparable). Each cutoff keeps an
exponential moving average of its rewards. Untried cutoffs run first (nearest to the initial one
first); afterwards the best average runs, except that with probability ε = explore / √(1 + k) after k
epochs a random other cutoff is tried. The random choice uses the generator the engine passes to
``decide``, so runs stay reproducible.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

_MIN_FINISHED = 5


class CutoffTuner:
    """Epoch-based ε-greedy choice of p among ``candidates``."""

    def __init__(
        self,
        candidates: Sequence[float],
        initial: float,
        epoch_s: float,
        explore: float,
        *,
        enabled: bool = True,
        smoothing: float = 0.5,
    ) -> None:
        self.candidates = tuple(sorted(set(candidates)))
        self.enabled = enabled and len(self.candidates) > 1
        self.epoch_s = epoch_s
        self.explore = explore
        self.smoothing = smoothing
        self.current = initial
        self.rewards: dict[float, float] = {}
        self.epochs = 0
        self._untried = sorted(self.candidates, key=lambda c: (abs(c - initial), c))
        if initial in self._untried:
            self._untried.remove(initial)
        self._epoch_start_s: float | None = None
        self._gain = 0.0
        self._ideal = 0.0
        self._finished = 0

    def record(self, gain: float, ideal_gain: float) -> None:
        """Credit one finished request to the running epoch."""
        self._gain += gain
        self._ideal += ideal_gain
        self._finished += 1

    def cutoff(self, now_s: float, rng: random.Random) -> float:
        """The cutoff to use now; closes the epoch and picks the next cutoff when it is over."""
        if not self.enabled:
            return self.current
        if self._epoch_start_s is None:
            self._epoch_start_s = now_s
            return self.current
        if now_s - self._epoch_start_s < self.epoch_s:
            return self.current
        if self._finished >= _MIN_FINISHED and self._ideal > 0:
            reward = self._gain / self._ideal
            old = self.rewards.get(self.current)
            self.rewards[self.current] = (
                reward if old is None else (self.smoothing * old + (1 - self.smoothing) * reward)
            )
            self.epochs += 1
            self.current = self._next(rng)
        # An epoch with too few completions carries no signal: keep the cutoff and keep counting.
        else:
            return self.current
        self._epoch_start_s = now_s
        self._gain = self._ideal = 0.0
        self._finished = 0
        return self.current

    def _next(self, rng: random.Random) -> float:
        if self._untried:
            return self._untried.pop(0)
        best = max(self.rewards, key=lambda c: (self.rewards[c], c))
        eps = self.explore / math.sqrt(1 + self.epochs)
        if rng.random() < eps:
            others = [c for c in self.candidates if c != best]
            return rng.choice(others)
        return best
