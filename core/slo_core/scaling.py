"""Autoscaling on multi-tier SLO goodput: one pure decision, used by the simulator and the operator.

Goodput-driven recommendation (the fleet's own signals over the last window)::

    load  = ceil((demand_tokens_per_s + admitted_tokens / drain_s) / (utilization · capacity_tokens_per_s))
    rec   = max(load, current + 1)   if a tier with ≥ min_samples outcomes is below its attainment
                                     target, or requests were rejected, and no replica is starting
          = load                     otherwise (may be below current: a scale-down candidate)
    rec   = max(rec, protected)      replicas holding in-flight compound programs are never removed

Queue-length recommendation (the baseline users run today: an HPA on vLLM's
``num_requests_waiting``): ``ceil(current · (queue_len / ready) / target_queue)``, kept at ``current``
within a 10 % tolerance, as the HPA algorithm does.

Both then pass the HPA's stabilization (scale up to the *lowest* recommendation of the up window,
down to the *highest* of the down window), a per-decision step limit, and the min/max bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ScalingMetric = Literal["goodput", "queue"]
HPA_TOLERANCE = 0.1


@dataclass(frozen=True, slots=True)
class TierSignal:
    """One tier's outcomes in the window: how many ended, how many met their SLO, the target share."""

    tier: str
    finished: int
    met: int
    target: float

    @property
    def attainment(self) -> float | None:
        return self.met / self.finished if self.finished else None


@dataclass(frozen=True, slots=True)
class FleetSignals:
    """What the fleet measured over the last window (all rates per second of that window)."""

    ready: int  # replicas serving
    starting: int  # replicas started but not ready (model loading)
    tiers: tuple[TierSignal, ...] = ()
    rejected: int = 0  # requests rejected by the router or the engines in the window
    admitted_tokens: float = 0.0  # outstanding admitted work: unprefilled prompt + expected output left
    demand_tokens_per_s: float = 0.0  # work arriving (prompt + output tokens of arrivals) per second
    capacity_tokens_per_s: float = 1.0  # what one replica sustains within its tiers' SLOs
    protected: int = 0  # replicas holding calls of in-flight compound programs
    queue_len: int = 0  # requests waiting in the engines (the queue-length baseline's metric)


class ScalingParams(BaseModel):
    """Bounds, targets and stabilization of one ModelDeployment's autoscaling."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_replicas: int = Field(1, ge=0, description="fewest replicas (replicas)")
    max_replicas: int = Field(8, ge=1, description="most replicas (replicas)")
    metric: ScalingMetric = Field("goodput", description="what drives the recommendation")
    utilization: float = Field(
        0.75, gt=0, le=1, description="share of a replica's goodput capacity to plan for (fraction)"
    )
    drain_s: float = Field(30.0, gt=0, description="admitted work should drain within this time (s)")
    min_samples: int = Field(20, ge=1, description="outcomes a tier needs before its attainment counts")
    target_queue: float = Field(
        4.0, gt=0, description="queue metric: waiting requests per ready replica to aim for (requests)"
    )
    up_window_s: float = Field(0.0, ge=0, description="scale-up stabilization window (s; HPA default 0)")
    down_window_s: float = Field(
        300.0, ge=0, description="scale-down stabilization window (s; HPA default 300)"
    )
    max_step_up: int = Field(4, ge=1, description="most replicas added by one decision (replicas)")
    max_step_down: int = Field(1, ge=1, description="most replicas removed by one decision (replicas)")


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    desired: int
    recommendation: int
    reason: str
    history: tuple[tuple[float, int], ...]  # (time, recommendation) kept for the stabilization windows


def goodput_recommendation(s: FleetSignals, p: ScalingParams) -> tuple[int, str]:
    """Replicas the SLO-goodput signals ask for, and why (see the module docstring)."""
    current = s.ready + s.starting
    need = s.demand_tokens_per_s + s.admitted_tokens / p.drain_s
    load = math.ceil(need / (p.utilization * max(s.capacity_tokens_per_s, 1e-9)) - 1e-9)
    missed = [
        t for t in s.tiers if t.finished >= p.min_samples and (a := t.attainment) is not None and a < t.target
    ]
    if (missed or s.rejected > 0) and s.starting == 0:
        why = ", ".join(f"{t.tier} {t.attainment:.3f}<{t.target}" for t in missed) or f"{s.rejected} rejected"
        rec, reason = max(load, current + 1), f"SLO pressure ({why})"
    else:
        rec, reason = load, f"load {need:.0f} tok/s of {s.capacity_tokens_per_s:.0f} per replica"
    if rec < s.protected:
        return s.protected, reason + f"; {s.protected} replicas hold in-flight programs"
    return rec, reason


def queue_recommendation(s: FleetSignals, p: ScalingParams) -> tuple[int, str]:
    """The HPA formula on the average waiting requests per ready replica."""
    current = s.ready + s.starting
    if s.ready == 0:
        return max(current, 1), "no ready replica"
    ratio = (s.queue_len / s.ready) / p.target_queue
    if abs(ratio - 1.0) <= HPA_TOLERANCE:
        return current, "within tolerance"
    return math.ceil(s.ready * ratio - 1e-9), f"queue {s.queue_len} over {s.ready} ready"


def stabilize(
    rec: int, current: int, now_s: float, history: tuple[tuple[float, int], ...], p: ScalingParams
) -> tuple[int, tuple[tuple[float, int], ...]]:
    """HPA-style stabilization: the desired count and the history to keep."""
    keep = max(p.up_window_s, p.down_window_s)
    hist = (*((t, r) for t, r in history if now_s - t < keep), (now_s, rec))
    ups = [r for t, r in hist if now_s - t <= p.up_window_s]
    downs = [r for t, r in hist if now_s - t <= p.down_window_s]
    desired = current
    if rec > current:
        desired = max(current, min(ups))
        desired = min(desired, current + p.max_step_up)
    elif rec < current:
        desired = min(current, max(downs))
        desired = max(desired, current - p.max_step_down)
    return max(p.min_replicas, min(p.max_replicas, desired)), hist


def decide(
    signals: FleetSignals, params: ScalingParams, history: tuple[tuple[float, int], ...], now_s: float
) -> ScaleDecision:
    """The replica count to run now, from the window's signals and the recommendations so far."""
    if params.metric == "goodput":
        rec, reason = goodput_recommendation(signals, params)
    else:
        rec, reason = queue_recommendation(signals, params)
    current = signals.ready + signals.starting
    desired, hist = stabilize(rec, current, now_s, history, params)
    return ScaleDecision(desired, rec, reason, hist)
