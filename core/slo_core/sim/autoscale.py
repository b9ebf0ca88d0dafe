"""Autoscaling in the simulator: replicas start (taking the profile's start-up time), serve, drain, stop.

The fleet is built with at least ``max_replicas`` engines; an :class:`Autoscaler` attached to it keeps
each in one of four states (off, starting, ready, draining). As a Deployment does, a scale-up starts a
new replica (start-up time) while removed ones finish draining, so a fleet needs spare engines for the
replicas still draining (the diurnal bench gives it twice ``max_replicas``); when no engine is off, a
draining replica is taken back instead. Each replica keeps the counters its sidecar
would export (:class:`slo_core.scaling.PodCounters`), updated at the same points: prompt tokens when a
replica admits a request; output tokens, SLO met/missed per tier and rejections when the request ends
there (an abort counts no outcome, as the sidecar's); outstanding admitted tokens (unprefilled prompt
plus the output bound left, the figure the replica reports to routers), program calls and waiting
requests as gauges. Every ``period_s`` it "scrapes" the ready replicas and steps a
:class:`slo_core.scaling.ScalingLoop` — the signal window and decision the operator steps on the
sidecars' ``/metrics`` — and starts or drains replicas; a scale-down drains the ready replica with
the lowest :func:`slo_core.scaling.deletion_cost` (the annotation the operator sets), never one holding
a program's call. Requests the router refused reach no replica and count nowhere, as live. Only ready
replicas are offered to the routing policy. A replica costs GPU time (``tensor_parallel`` GPUs) from
its start until it has drained.

Start-up time from the profile: weight bytes (from the profile's provenance) read at
``LOAD_BYTES_PER_S`` per GPU, plus ``ENGINE_INIT_S`` (container start, CUDA init, vLLM's profiling
run and CUDA-graph capture). Both constants are estimates for a node with the image and weights cached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slo_core.gain import Delivery, request_goodput
from slo_core.perf.model import PerfProfile
from slo_core.perf.profiles import profile_document
from slo_core.scaling import (
    PodCounters,
    ScaleDecision,
    ScaleStep,
    ScalingLoop,
    ScalingParams,
    deletion_cost,
)
from slo_core.sim.request import ABORTED, FINISHED, REJECTED, SimRequest

if TYPE_CHECKING:
    from collections.abc import Mapping

    from slo_core.sim.fleet import FleetSim

OFF, STARTING, READY, DRAINING = "off", "starting", "ready", "draining"
LOAD_BYTES_PER_S = 2.0e9  # per GPU, from a node-local model cache
ENGINE_INIT_S = 45.0


def startup_time_s(profile: PerfProfile, profile_name: str | None = None) -> float:
    """Seconds from starting a replica to its first request, from the profile's weight size."""
    weight_bytes = 2.0 * 8e9  # an 8B model in bf16 when the profile records no weight size
    try:
        doc = profile_document(profile_name or profile.name)
        weight_bytes = float(doc["provenance"]["kv_cache"]["weight_bytes"])
    except (KeyError, TypeError, ValueError, FileNotFoundError):
        pass
    return ENGINE_INIT_S + weight_bytes / (LOAD_BYTES_PER_S * max(1, profile.tensor_parallel))


def capacity_tokens_per_s(profile: PerfProfile, tbt_s: float, context_tokens: int = 1024) -> float:
    """Tokens per second one replica processes while its iterations stay within ``tbt_s``."""
    budget_ms = tbt_s * 1000.0 - profile.t_c_ms
    per_token_ms = profile.a_ms_per_token + profile.d_ms_per_kv_token * context_tokens
    if budget_ms <= 0 or per_token_ms <= 0:
        return 1.0
    if budget_ms <= profile.floor_ms:  # even a tiny batch misses the TBT: one token per iteration
        return 1000.0 / max(profile.floor_ms + profile.t_c_ms, 1e-6)
    return (budget_ms / per_token_ms) / tbt_s


@dataclass
class _Replica:
    state: str = OFF
    ready_at_s: float = 0.0
    since_s: float = 0.0


@dataclass
class _Counters:
    """A replica's sidecar counters (cumulative since the replica started serving)."""

    met: dict[str, int] = field(default_factory=dict)
    missed: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0

    def ended(self, r: SimRequest) -> None:
        """``r`` left this replica: as the sidecar's end-of-request accounting."""
        self.output_tokens += r.generated
        if r.state == ABORTED:
            return
        self.rejected += r.state == REJECTED
        tier = r.tier or r.slo.priority_class
        outcome = self.met if r.state == FINISHED and _met(r) else self.missed  # a rejection missed
        outcome[tier] = outcome.get(tier, 0) + 1


@dataclass
class ScaleEvent:
    t_s: float
    ready: int
    starting: int
    draining: int
    desired: int
    reason: str
    step: ScaleStep | None = None  # the period's signals and decision; None on the first (measuring)
    samples: Mapping[str, PodCounters] = field(default_factory=dict)  # what the period scraped


@dataclass
class Autoscaler:
    """Drives a :class:`FleetSim`'s replica count with :func:`slo_core.scaling.decide`."""

    params: ScalingParams
    startup_s: float
    capacity_tokens_per_s: float
    tier_targets: Mapping[str, float]
    default_target: float = 0.9  # a tier absent from tier_targets (the CRD's attainmentTarget default)
    period_s: float = 15.0
    initial: int | None = None
    gpus_per_replica: int = 1
    timeline: list[ScaleEvent] = field(default_factory=list)
    _replicas: list[_Replica] = field(default_factory=list)
    _loop: ScalingLoop = field(default_factory=ScalingLoop)
    _counters: list[_Counters] = field(default_factory=list)
    _pending: list[SimRequest] = field(default_factory=list)
    _seen: int = 0
    _last_s: float = 0.0
    _gpu_s: float = 0.0
    _ready_ids: frozenset[str] = frozenset()
    _ready_until: float = -1.0

    # ---- the fleet's hooks ------------------------------------------------------------------------

    def attach(self, fleet: FleetSim) -> None:
        n = len(fleet.engines)
        if n < self.params.max_replicas:
            raise ValueError(
                f"the fleet has {n} engines; autoscaling needs max_replicas={self.params.max_replicas}"
            )
        first = self.params.min_replicas if self.initial is None else self.initial
        self._replicas = [_Replica(READY if i < first else OFF) for i in range(n)]
        self._counters = [_Counters() for _ in range(n)]
        self._loop = ScalingLoop()
        self._fleet = fleet
        self._ready_until = -1.0

    def tick(self, fleet: FleetSim, t: float) -> None:
        self._account(t)
        for i, rep in enumerate(self._replicas):
            if rep.state == STARTING and rep.ready_at_s <= t:
                rep.state = READY
            elif rep.state == DRAINING and not _busy(fleet, i):
                rep.state, rep.since_s = OFF, t
        self._count(fleet)
        samples = self.scrape(fleet, t)
        current = sum(r.state in (READY, STARTING) for r in self._replicas)
        step = self._loop.step(
            self.params,
            samples,
            now_s=t,
            current=current,
            ready_pods=len(samples),
            capacity_tokens_per_s=self.capacity_tokens_per_s,
            target=lambda tier: self.tier_targets.get(tier, self.default_target),
        )
        if step is None:
            self._event(current, "measuring", None, samples, t)
        else:
            self._apply(fleet, step.decision, t, samples)
            self._event(step.decision.desired, step.decision.reason, step, samples, t)
        self._ready_until = -1.0

    # ---- what routing sees ------------------------------------------------------------------------

    def ready_ids(self, now_s: float) -> frozenset[str]:
        if now_s > self._ready_until or not self._ready_ids:
            engines = self._fleet.engines
            ids, soonest = [], math.inf
            for i, rep in enumerate(self._replicas):
                if rep.state == READY or (rep.state == STARTING and rep.ready_at_s <= now_s):
                    ids.append(engines[i].engine_id)
                elif rep.state == STARTING:
                    soonest = min(soonest, rep.ready_at_s)
            self._ready_ids, self._ready_until = frozenset(ids), soonest
        return self._ready_ids

    # ---- accounting -------------------------------------------------------------------------------

    def gpu_hours(self, end_s: float) -> float:
        self._account(end_s)
        return self._gpu_s / 3600.0

    def _account(self, t: float) -> None:
        running = sum(1 for r in self._replicas if r.state != OFF)
        self._gpu_s += running * self.gpus_per_replica * max(0.0, t - self._last_s)
        self._last_s = max(self._last_s, t)

    # ---- signals and actions ----------------------------------------------------------------------

    def _count(self, fleet: FleetSim) -> None:
        """Bring every replica's counters up to now: requests admitted and ended since the last period."""
        requests = fleet._requests
        for r in requests[self._seen :]:
            if r.replica >= 0:  # admitted by a replica (the router's refusals reach none)
                self._counters[r.replica].prompt_tokens += r.prompt_tokens
                self._pending.append(r)
        self._seen = len(requests)
        still = []
        for r in self._pending:
            if r.state in (FINISHED, REJECTED, ABORTED):
                self._counters[r.replica].ended(r)
            else:
                still.append(r)
        self._pending = still

    def scrape(self, fleet: FleetSim, t: float) -> dict[str, PodCounters]:
        """What the operator reads off the ready replicas' sidecars now."""
        out = {}
        for i, rep in enumerate(self._replicas):
            if rep.state != READY:
                continue
            e, c = fleet.engines[i], self._counters[i]
            out[e.engine_id] = PodCounters(
                t_s=t,
                met=dict(c.met),
                missed=dict(c.missed),
                rejected=c.rejected,
                prompt_tokens=c.prompt_tokens,
                output_tokens=c.output_tokens,
                outstanding_tokens=e.prompt_left_tokens + e.output_left_tokens,
                program_requests=sum(q.program is not None for q in (*e.running, *e.waiting)),
                waiting=len(e.waiting),
            )
        return out

    def _apply(self, fleet: FleetSim, d: ScaleDecision, t: float, samples: Mapping[str, PodCounters]) -> None:
        reps = self._replicas
        current = sum(1 for r in reps if r.state in (READY, STARTING))
        if d.desired > current:
            for _ in range(d.desired - current):
                i = _first(reps, OFF)  # a new pod: a deleted one finishes terminating meanwhile
                if i is None:  # no spare engine in the fleet: take a draining one back (unlike live)
                    i = _first(reps, DRAINING)
                    if i is None:
                        break
                    reps[i].state = READY
                    continue
                reps[i].state, reps[i].ready_at_s, reps[i].since_s = STARTING, t + self.startup_s, t
                self._counters[i] = _Counters()  # its sidecar counts from zero
        elif d.desired < current:
            for _ in range(current - d.desired):
                self._drain_one(fleet, t, samples)

    def _event(
        self,
        desired: int,
        reason: str,
        step: ScaleStep | None,
        samples: Mapping[str, PodCounters],
        t: float,
    ) -> None:
        reps = self._replicas
        self.timeline.append(
            ScaleEvent(
                t,
                sum(r.state == READY for r in reps),
                sum(r.state == STARTING for r in reps),
                sum(r.state == DRAINING for r in reps),
                desired,
                reason,
                step,
                samples,
            )
        )

    def _drain_one(self, fleet: FleetSim, t: float, samples: Mapping[str, PodCounters] | None = None) -> None:
        """Stop a starting replica first, else drain the ready one of lowest deletion cost (the period's
        scrape, as the operator's annotation) unless it holds a program's call."""
        reps = self._replicas
        starting = [i for i, r in enumerate(reps) if r.state == STARTING]
        if starting:
            i = max(starting, key=lambda k: reps[k].ready_at_s)
            reps[i].state, reps[i].since_s = OFF, t
            return
        scraped = samples if samples is not None else self.scrape(fleet, t)
        engines = fleet.engines
        ready = [i for i, r in enumerate(reps) if r.state == READY]
        if not ready:
            return
        i = min(ready, key=lambda k: deletion_cost(scraped.get(engines[k].engine_id)))
        e = engines[i]
        if any(q.program is not None for q in (*e.running, *e.waiting)):
            return  # every ready replica holds a program's call
        reps[i].state, reps[i].since_s = DRAINING, t


def _busy(fleet: FleetSim, i: int) -> bool:
    e = fleet.engines[i]
    return bool(e.running or e.waiting)


def _first(reps: list[_Replica], state: str) -> int | None:
    return next((i for i, r in enumerate(reps) if r.state == state), None)


def _met(r: SimRequest) -> bool:
    """A finished request met its SLO, judged as the sidecar judges it (``Tracker.outcome``): a
    program's call against its program's deadline (the program's arrival plus its deadline)."""
    arrival = r.program.arrival_s if r.program is not None else r.arrival_s
    d = Delivery(r.slo, arrival, r.prompt_tokens, tuple(r.token_times), True)
    return request_goodput(d) > 0
