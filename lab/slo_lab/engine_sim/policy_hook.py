"""The engine-level policy hook of engine-sim: the same contract as the vLLM scheduler plugin.

The simulated engine (``slo_core.sim.engine.SimEngine``) calls the policy at frame boundaries and
applies its Decision with ``slo_core.policies.apply``. This wrapper adds what the plugin adds around
vLLM's scheduler: a policy error or an analyzer that stopped answering degrades that frame to stock
order (an empty Decision: waiting requests in arrival order, nothing preempted or rejected), and the
analyzer's output-length bounds are written into the engine's requests before each step.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence

from slo_core.policies.base import Decision, EnginePolicy, EngineView, FinishedView, RequestView

log = logging.getLogger(__name__)


class GuardedPolicy:
    """Wraps an engine policy: degrade to stock order on errors or stale analyzer data."""

    def __init__(self, inner: EnginePolicy, *, analyzer_fresh: Callable[[], bool] | None = None) -> None:
        self.inner = inner
        self.name = str(getattr(inner, "name", type(inner).__name__))
        self.frame_steps = max(1, int(getattr(inner, "frame_steps", 1)))
        self.reschedule_on_events = bool(getattr(inner, "reschedule_on_events", True))
        # a FIFO policy never changes its mind; without an analyzer there is nothing to guard
        if analyzer_fresh is None and getattr(inner, "fifo_fast_path", False):
            self.fifo_fast_path = True
        self._fresh = analyzer_fresh
        self.degraded_reason = ""
        self.decisions = 0
        self.degraded_frames = 0

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        if self._fresh is not None and not self._fresh():
            return self._degrade("analyzer unreachable")
        try:
            decision = self.inner.decide(waiting, running, engine, rng)
        except Exception as exc:  # a policy bug must never fail the engine step
            log.exception("engine-sim policy %s failed", self.name)
            return self._degrade(f"policy error: {exc!r}")
        self.decisions += 1
        if self.degraded_reason:
            log.info("engine-sim policy recovered from: %s", self.degraded_reason)
            self.degraded_reason = ""
        return decision

    def observe(self, finished: Sequence[FinishedView], now_s: float) -> None:
        try:
            self.inner.observe(finished, now_s)
        except Exception:
            log.exception("engine-sim policy %s failed to observe finished requests", self.name)

    def _degrade(self, reason: str) -> Decision:
        if reason != self.degraded_reason:
            log.warning("engine-sim degraded to stock order: %s", reason)
        self.degraded_reason = reason
        self.degraded_frames += 1
        return Decision(reason=f"degraded: {reason}")


def observes_feedback(policy: EnginePolicy) -> bool:
    """Whether the policy overrides ``observe`` (only then is per-request feedback worth computing)."""
    from slo_core.policies.base import BaseEnginePolicy

    return getattr(type(policy), "observe", None) is not BaseEnginePolicy.observe
