"""A sidecar in proxy or engine mode driven by a scripted policy, and jobs queued on it (no network).

For tests of the sidecar's scheduling and of what it sends upstream (bodies, signed engine tags):
the policy returns whatever the test sets, the engine URL is never dialled.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.front import COMPLETION, parse_body
from slo_sidecar.job import Job
from slo_sidecar.service import Sidecar

TIER = SLOTier("t", RequestKind.DEADLINE, PriorityClass("p", 1.0), deadline_s=10.0)


class Scripted(BaseEnginePolicy):
    """Returns whatever the test put in ``next``; raises when told to."""

    name = "scripted"

    def __init__(self) -> None:
        self.next = Decision()
        self.fail = False
        self.seen: list[tuple[list[str], list[str]]] = []

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        self.seen.append(([r.request_id for r in waiting], [r.request_id for r in running]))
        if self.fail:
            raise RuntimeError("policy bug")
        return self.next


def scripted_sidecar(**knobs: object) -> tuple[Sidecar, Scripted]:
    """A sidecar with one deadline tier (10 s) whose policy is a fresh :class:`Scripted`."""
    sc = Sidecar(
        knobs=SidecarKnobs(**knobs),  # type: ignore[arg-type]
        config=PolicyConfig(tiers={"t": TIER}, default_tier="t"),
        engine_url="http://engine.invalid",
        estimator=FallbackEstimator(),
    )
    policy = Scripted()
    sc.scheduler.set_policy(policy)
    return sc, policy


def queued_job(
    sc: Sidecar, rid: str, body: dict[str, object] | None = None, endpoint: str = COMPLETION
) -> Job:
    """Parse ``body`` (default: a streamed 20-token completion) as the front does; register it as ``rid``."""
    raw = body or {"model": "m", "prompt": f"prompt of {rid}", "max_tokens": 20, "stream": True}
    parsed = parse_body(raw, endpoint, 16)
    live = sc.tracker.new_request(
        tier=TIER,
        targets=TIER.targets(),
        prompt_text=parsed.prompt_text,
        prompt_tokens=parsed.prompt_tokens,
        max_tokens=parsed.max_tokens,
        max_wait_s=5,
        bound=10,
        program_id=None,
        stage=None,
        stated_stages=None,
        request_id=rid,
    )
    job = Job(live, parsed)
    sc.jobs[rid] = job
    return job
