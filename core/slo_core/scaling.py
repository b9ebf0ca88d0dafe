"""Autoscaling on multi-tier SLO goodput: one signal definition and one decision, used by the simulator
and the operator.

Signals (:func:`window`): every engine pod's sidecar exports cumulative counters and gauges
(:class:`PodCounters`: per-tier SLO met/missed, rejections, prompt tokens admitted, output tokens
delivered; outstanding admitted tokens, in-flight program calls, waiting requests). Two scrapes of the
ready pods give the period's :class:`FleetSignals`. The operator parses the sidecars' ``/metrics``
into them; the simulator keeps the same counters per replica, updated where a sidecar updates its own,
and both step one :class:`ScalingLoop` per ModelDeployment.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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


# ---- the signals: sidecar counters over one period ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodCounters:
    """One scrape of one pod's sidecar metrics: counters since the sidecar started, gauges now.

    The counters are ``slofleet_sidecar_{slo_met,slo_missed,rejects,prompt_tokens,output_tokens}_total``
    (prompt tokens counted when a request is admitted, output tokens when it ends); the gauges are
    ``slofleet_sidecar_{outstanding_tokens,program_requests,engine_waiting}``.
    """

    t_s: float
    met: Mapping[str, float] = field(default_factory=dict)  # per tier
    missed: Mapping[str, float] = field(default_factory=dict)
    rejected: float = 0.0
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    outstanding_tokens: float = 0.0
    program_requests: float = 0.0
    waiting: float = 0.0


def _delta(now: float, before: float) -> float:
    """A counter's increase; a counter below its last value means the sidecar restarted from zero."""
    return now - before if now >= before else now


def window(
    before: Mapping[str, PodCounters],
    now: Mapping[str, PodCounters],
    *,
    ready: int,
    starting: int,
    capacity_tokens_per_s: float,
    target: Callable[[str], float],
) -> FleetSignals:
    """Signals over the period between two scrapes of each pod (pods scraped once add only gauges).

    Demand is the prompt and output tokens the pods took in per second; admitted work, queue and
    in-flight programs are the gauges of the latest scrape. Requests a router refused before any pod
    saw them are in no pod's counters, so they are not in the signals.
    """
    finished: dict[str, float] = {}
    met: dict[str, float] = {}
    rejected = demand = admitted = queue = 0.0
    protected = 0
    for pod, cur in now.items():
        admitted += cur.outstanding_tokens
        queue += cur.waiting
        protected += cur.program_requests > 0
        old = before.get(pod)
        if old is None or cur.t_s <= old.t_s:
            continue
        for tier in set(cur.met) | set(cur.missed):
            m = _delta(cur.met.get(tier, 0.0), old.met.get(tier, 0.0))
            x = _delta(cur.missed.get(tier, 0.0), old.missed.get(tier, 0.0))
            met[tier] = met.get(tier, 0.0) + m
            finished[tier] = finished.get(tier, 0.0) + m + x
        rejected += _delta(cur.rejected, old.rejected)
        tokens = _delta(cur.prompt_tokens, old.prompt_tokens) + _delta(cur.output_tokens, old.output_tokens)
        demand += tokens / (cur.t_s - old.t_s)
    tiers = tuple(
        TierSignal(t, round(finished[t]), round(met.get(t, 0.0)), target(t))
        for t in sorted(finished)
        if t != "-"
    )
    return FleetSignals(
        ready=ready,
        starting=starting,
        tiers=tiers,
        rejected=round(rejected),
        admitted_tokens=admitted,
        demand_tokens_per_s=demand,
        capacity_tokens_per_s=capacity_tokens_per_s,
        protected=protected,
        queue_len=round(queue),
    )


def deletion_cost(sample: PodCounters | None) -> int:
    """Which pod a scale-down removes first (lowest cost): its outstanding work, and far above any work
    while it holds calls of an in-flight program (``controller.kubernetes.io/pod-deletion-cost``)."""
    if sample is None:
        return 0
    cost = int(min(sample.outstanding_tokens, 1e9)) + (1_000_000_000 if sample.program_requests > 0 else 0)
    return min(cost, 2**31 - 1)


@dataclass(frozen=True, slots=True)
class ScaleStep:
    """One period's outcome: the signals measured and the decision taken on them."""

    signals: FleetSignals
    decision: ScaleDecision


@dataclass
class ScalingLoop:
    """One ModelDeployment's scaling state between periods: the last scrape and the recommendations.

    The first step only measures (there is no window yet) and seeds the history with the current
    count, so a loop that starts on a running fleet waits a full down window before removing a replica.
    """

    history: tuple[tuple[float, int], ...] = ()
    samples: Mapping[str, PodCounters] = field(default_factory=dict)
    measured: bool = False

    def step(
        self,
        params: ScalingParams,
        samples: Mapping[str, PodCounters],
        *,
        now_s: float,
        current: int,
        ready_pods: int,
        capacity_tokens_per_s: float,
        target: Callable[[str], float],
    ) -> ScaleStep | None:
        """The period ending now: ``samples`` are the scrapes of the ``ready_pods`` ready pods (one that
        did not answer is left out), ``current`` the replica count last set; None on the first step."""
        before, self.samples = self.samples, dict(samples)
        if not self.measured:
            self.measured, self.history = True, ((now_s, current),)
            return None
        ready = min(ready_pods, current)
        signals = window(
            before,
            samples,
            ready=ready,
            starting=max(0, current - ready),
            capacity_tokens_per_s=capacity_tokens_per_s,
            target=target,
        )
        decision = decide(signals, params, self.history, now_s)
        self.history = decision.history
        return ScaleStep(signals, decision)
