"""The SLO model: request kinds, priority classes, SLO tiers and a request's resolved targets.

Request kinds follow JITServe §3: ``latency`` requests stream and count token by token against
TTFT + i·TBT; ``deadline`` requests count only when they finish by an end-to-end deadline;
``compound`` requests are a DAG of calls with one deadline for the whole; ``best-effort`` requests
have no SLO but get a default deadline so that a goodput-maximizing scheduler never starves them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

# JITServe §3/§4.2: best-effort requests get a default completion deadline so they never starve.
DEFAULT_BEST_EFFORT_DEADLINE_S = 120.0


class RequestKind(StrEnum):
    """What kind of SLO a request carries (JITServe §3)."""

    LATENCY = "latency"
    DEADLINE = "deadline"
    COMPOUND = "compound"
    BEST_EFFORT = "best-effort"


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority class; its weight multiplies every goodput function (PROSERVE §2)."""

    name: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a priority class needs a non-empty name")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(
                f"priority class {self.name!r}: weight must be a positive number, got {self.weight}"
            )


@dataclass(frozen=True, slots=True)
class SLOTargets:
    """A request's resolved SLO: its kind, targets (seconds, relative to arrival) and priority.

    ``ttft_s`` and ``tbt_s`` apply to latency requests, ``deadline_s`` to deadline, compound and
    best-effort requests (for compound requests it is the deadline of the whole DAG).
    """

    kind: RequestKind
    ttft_s: float | None = None
    tbt_s: float | None = None
    deadline_s: float | None = None
    priority_class: str = "default"
    priority_weight: float = 1.0

    def __post_init__(self) -> None:
        for field_name in ("ttft_s", "tbt_s", "deadline_s"):
            value = getattr(self, field_name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{field_name} must be a positive number of seconds, got {value}")
        if not (self.priority_weight > 0 and math.isfinite(self.priority_weight)):
            raise ValueError(f"priority_weight must be a positive number, got {self.priority_weight}")
        if self.kind is RequestKind.LATENCY and (self.ttft_s is None or self.tbt_s is None):
            raise ValueError("a latency SLO needs both ttft_s and tbt_s")
        if self.kind in (RequestKind.DEADLINE, RequestKind.COMPOUND) and self.deadline_s is None:
            raise ValueError(f"a {self.kind.value} SLO needs deadline_s")

    @property
    def effective_deadline_s(self) -> float:
        """The end-to-end deadline used by schedulers; best-effort falls back to the default."""
        if self.deadline_s is not None:
            return self.deadline_s
        if self.kind is RequestKind.BEST_EFFORT:
            return DEFAULT_BEST_EFFORT_DEADLINE_S
        # A latency request's last token is due at TTFT + (n-1)·TBT; without n there is no single
        # deadline, so callers that need one pass the output length to token_deadline_s instead.
        raise ValueError("a latency SLO has per-token deadlines; use token_deadline_s(i)")

    def token_deadline_s(self, index: int) -> float:
        """Deadline (relative to arrival) of output token ``index`` (0-based): TTFT + index·TBT."""
        if self.kind is RequestKind.LATENCY:
            assert self.ttft_s is not None and self.tbt_s is not None
            return self.ttft_s + index * self.tbt_s
        return self.effective_deadline_s


@dataclass(frozen=True, slots=True)
class SLOTier:
    """A named tier binds a kind, its targets and a priority class (what a tenant is allowed)."""

    name: str
    kind: RequestKind
    priority_class: PriorityClass
    ttft_s: float | None = None
    tbt_s: float | None = None
    deadline_s: float | None = None
    stage_deadline_share: tuple[float, ...] | None = None

    def targets(
        self,
        *,
        ttft_s: float | None = None,
        tbt_s: float | None = None,
        deadline_s: float | None = None,
    ) -> SLOTargets:
        """Resolve a request's targets: what the request states, else the tier's defaults.

        The tier bounds the client: a stated target may be looser than the tier's, never stricter (a
        stricter one is raised to the tier's; deadline-ordered policies would otherwise treat it as
        the most urgent). Where the tier states no deadline, a best-effort request's is at least the
        default best-effort deadline and a latency request's at least its TTFT. The priority class
        always comes from the tier: a client can state its timing needs, never raise its own priority.
        """
        ttft = _loosest(ttft_s, self.ttft_s)
        floor = DEFAULT_BEST_EFFORT_DEADLINE_S if self.kind is RequestKind.BEST_EFFORT else ttft
        return SLOTargets(
            kind=self.kind,
            ttft_s=ttft,
            tbt_s=_loosest(tbt_s, self.tbt_s),
            deadline_s=self.deadline_s
            if deadline_s is None
            else _loosest(deadline_s, self.deadline_s if self.deadline_s is not None else floor),
            priority_class=self.priority_class.name,
            priority_weight=self.priority_class.weight,
        )

    def bind(self, stated: SLOTargets) -> SLOTargets:
        """What a request that states ``stated`` gets in this tier: :meth:`targets` of its stated
        timings (a latency request states no deadline on the wire), as the router binds it."""
        latency = stated.kind is RequestKind.LATENCY
        return self.targets(
            ttft_s=stated.ttft_s if latency else None,
            tbt_s=stated.tbt_s if latency else None,
            deadline_s=None if latency else stated.deadline_s,
        )


def _loosest(asked: float | None, bound: float | None) -> float | None:
    """A client's target, never stricter (smaller) than ``bound``; the bound when none is asked."""
    if asked is None:
        return bound
    return asked if bound is None else max(asked, bound)
