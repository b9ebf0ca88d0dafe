"""The degrade-to-stock guard around an engine policy: one implementation for every engine.

The vLLM scheduler plugin, engine-sim and the sidecar's proxy scheduler all wrap their engine policy in
:class:`GuardedPolicy`: a policy error, or an analyzer that stopped answering (``analyzer_fresh``
returns False), turns that frame's decision into the stock one, an empty :class:`Decision` (waiting
requests in arrival order, nothing preempted or rejected, no token budget), so a policy bug never fails
an engine step or a request. The guard logs the first failure of a kind and every 100th repeat, and
counts degraded frames; ``degraded_reason`` is empty while the policy runs normally.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence

from slo_core.policies.base import (
    BaseEnginePolicy,
    Decision,
    EnginePolicy,
    EngineView,
    FinishedView,
    RequestView,
)

log = logging.getLogger(__name__)


class GuardedPolicy:
    """An engine policy that degrades to stock order instead of failing (see the module docstring)."""

    def __init__(self, inner: EnginePolicy, *, analyzer_fresh: Callable[[], bool] | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.frame_steps = max(1, int(inner.frame_steps))
        self.reschedule_on_events = bool(inner.reschedule_on_events)
        self.skip_quiet_decisions = bool(getattr(inner, "skip_quiet_decisions", False))
        self.deep_queue_from = max(0, int(getattr(inner, "deep_queue_from", 0)))
        self.deep_queue_every = max(1, int(getattr(inner, "deep_queue_every", 1)))
        # a FIFO policy never changes its mind; without an analyzer there is nothing to guard
        self.fifo_fast_path = analyzer_fresh is None and bool(getattr(inner, "fifo_fast_path", False))
        self._fresh = analyzer_fresh
        self.degraded_reason = ""
        self.decisions = 0
        self.degraded_frames = 0
        self.errors = 0

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
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.exception("engine policy %s failed (%d times); using stock order", self.name, self.errors)
            return self._degrade(f"policy error: {exc!r}")
        self.decisions += 1
        if self.degraded_reason:
            log.info("engine policy %s recovered from: %s", self.name, self.degraded_reason)
            self.degraded_reason = ""
        return decision

    def observe(self, finished: Sequence[FinishedView], now_s: float) -> None:
        try:
            self.inner.observe(finished, now_s)
        except Exception:
            log.exception("engine policy %s failed to observe finished requests", self.name)

    @property
    def observes_feedback(self) -> bool:
        """Whether the inner policy overrides ``observe`` (only then is feedback worth computing)."""
        return observes_feedback(self.inner)

    def _degrade(self, reason: str) -> Decision:
        if reason != self.degraded_reason:
            log.warning("engine policy %s degraded to stock order: %s", self.name, reason)
        self.degraded_reason = reason
        self.degraded_frames += 1
        return Decision(reason=f"degraded: {reason}")


def observes_feedback(policy: EnginePolicy) -> bool:
    """Whether ``policy`` overrides ``observe`` (only then is per-request feedback worth computing)."""
    inner = policy.inner if isinstance(policy, GuardedPolicy) else policy
    method: object = type(inner).observe
    return method is not BaseEnginePolicy.observe
