"""Autoscaling in the simulator: replicas start (taking the profile's start-up time), serve, drain, stop.

The fleet is built with ``max_replicas`` engines; an :class:`Autoscaler` attached to it keeps each in
one of four states (off, starting, ready, draining). Every ``period_s`` it measures the window's
signals (per-tier SLO attainment of the requests that ended, rejections, admitted work, arrival rate,
queue length, replicas holding in-flight programs; output lengths are expected at the mean observed
so far, as a router without length bounds would learn them), asks :func:`slo_core.scaling.decide` — the same
function the operator calls — and starts or drains replicas. Only ready replicas are offered to the
routing policy. A replica costs GPU time (``tensor_parallel`` GPUs) from its start until it has drained.

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
from slo_core.scaling import FleetSignals, ScaleDecision, ScalingParams, TierSignal, decide
from slo_core.sim.request import FINISHED, REJECTED, SimRequest

if TYPE_CHECKING:
    from collections.abc import Mapping

    from slo_core.sim.fleet import FleetSim

OFF, STARTING, READY, DRAINING = "off", "starting", "ready", "draining"
LOAD_BYTES_PER_S = 2.0e9  # per GPU, from a node-local model cache
ENGINE_INIT_S = 45.0
DEFAULT_OUTPUT_TOKENS = 256.0  # expected output before any request finished


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
class ScaleEvent:
    t_s: float
    ready: int
    starting: int
    draining: int
    desired: int
    reason: str


@dataclass
class Autoscaler:
    """Drives a :class:`FleetSim`'s replica count with :func:`slo_core.scaling.decide`."""

    params: ScalingParams
    startup_s: float
    capacity_tokens_per_s: float
    tier_targets: Mapping[str, float]
    period_s: float = 15.0
    initial: int | None = None
    gpus_per_replica: int = 1
    timeline: list[ScaleEvent] = field(default_factory=list)
    _replicas: list[_Replica] = field(default_factory=list)
    _history: tuple[tuple[float, int], ...] = ()
    _pending: list[SimRequest] = field(default_factory=list)
    _seen: int = 0
    _last_s: float = 0.0
    _gpu_s: float = 0.0
    _ready_ids: frozenset[str] = frozenset()
    _ready_until: float = -1.0
    _out_sum: float = 0.0
    _out_n: int = 0

    # ---- the fleet's hooks ------------------------------------------------------------------------

    def attach(self, fleet: FleetSim) -> None:
        n = len(fleet.engines)
        if n < self.params.max_replicas:
            raise ValueError(
                f"the fleet has {n} engines; autoscaling needs max_replicas={self.params.max_replicas}"
            )
        first = self.params.min_replicas if self.initial is None else self.initial
        self._replicas = [_Replica(READY if i < first else OFF) for i in range(n)]
        self._fleet = fleet
        self._ready_until = -1.0

    def tick(self, fleet: FleetSim, t: float) -> None:
        self._account(t)
        for i, rep in enumerate(self._replicas):
            if rep.state == STARTING and rep.ready_at_s <= t:
                rep.state = READY
            elif rep.state == DRAINING and not _busy(fleet, i):
                rep.state, rep.since_s = OFF, t
        signals = self._signals(fleet, t)
        decision = decide(signals, self.params, self._history, t)
        self._history = decision.history
        self._apply(fleet, decision, t)
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

    def _signals(self, fleet: FleetSim, t: float) -> FleetSignals:
        requests = fleet._requests
        new = requests[self._seen :]
        self._seen = len(requests)
        window = t - self.timeline[-1].t_s if self.timeline else self.period_s
        out_mean = self._out_sum / self._out_n if self._out_n else DEFAULT_OUTPUT_TOKENS
        demand = sum(r.prompt_tokens + min(out_mean, r.max_tokens) for r in new) / max(window, 1e-9)
        self._pending.extend(new)
        finished: dict[str, int] = {}
        met: dict[str, int] = {}
        rejected = 0
        still = []
        for r in self._pending:
            if r.state not in (FINISHED, REJECTED):
                still.append(r)
                continue
            rejected += r.state == REJECTED
            if r.state == FINISHED:
                self._out_sum += r.generated
                self._out_n += 1
            tier = r.tier or r.slo.priority_class
            finished[tier] = finished.get(tier, 0) + 1
            if r.state == FINISHED and r.program is None and _met(r):
                met[tier] = met.get(tier, 0) + 1
            elif r.state == FINISHED and r.program is not None:
                met[tier] = met.get(tier, 0) + (
                    r.finish_s is not None and r.finish_s <= (r.deadline_at_s or math.inf)
                )
        self._pending = still
        tiers = tuple(
            TierSignal(name, finished.get(name, 0), met.get(name, 0), target)
            for name, target in sorted(self.tier_targets.items())
        )
        states = [r.state for r in self._replicas]
        admitted = 0.0
        queue = 0
        protected = 0
        for i, e in enumerate(fleet.engines):
            if states[i] in (READY, DRAINING):
                for q in (*e.running, *e.waiting):
                    admitted += max(0, q.prompt_tokens - q.computed) + max(0.0, out_mean - q.generated)
                queue += len(e.waiting)
            if states[i] == READY and any(r.program is not None for r in (*e.running, *e.waiting)):
                protected += 1
        return FleetSignals(
            ready=states.count(READY),
            starting=states.count(STARTING),
            tiers=tiers,
            rejected=rejected,
            admitted_tokens=admitted,
            demand_tokens_per_s=demand,
            capacity_tokens_per_s=self.capacity_tokens_per_s,
            protected=protected,
            queue_len=queue,
        )

    def _apply(self, fleet: FleetSim, d: ScaleDecision, t: float) -> None:
        reps = self._replicas
        current = sum(1 for r in reps if r.state in (READY, STARTING))
        if d.desired > current:
            for _ in range(d.desired - current):
                i = _first(reps, DRAINING)  # a draining replica still runs: take it back at once
                if i is not None:
                    reps[i].state = READY
                    continue
                i = _first(reps, OFF)
                if i is None:
                    break
                reps[i].state, reps[i].ready_at_s, reps[i].since_s = STARTING, t + self.startup_s, t
        elif d.desired < current:
            for _ in range(current - d.desired):
                self._drain_one(fleet, t)
        self.timeline.append(
            ScaleEvent(
                t,
                sum(r.state == READY for r in reps),
                sum(r.state == STARTING for r in reps),
                sum(r.state == DRAINING for r in reps),
                d.desired,
                d.reason,
            )
        )

    def _drain_one(self, fleet: FleetSim, t: float) -> None:
        """Stop a starting replica first, else drain the least-loaded ready one holding no program."""
        reps = self._replicas
        starting = [i for i, r in enumerate(reps) if r.state == STARTING]
        if starting:
            i = max(starting, key=lambda k: reps[k].ready_at_s)
            reps[i].state, reps[i].since_s = OFF, t
            return
        free = [
            i
            for i, r in enumerate(reps)
            if r.state == READY
            and not any(q.program is not None for q in (*fleet.engines[i].running, *fleet.engines[i].waiting))
        ]
        if not free:
            return
        e = fleet.engines
        i = min(free, key=lambda k: e[k].prompt_left_tokens + e[k].output_left_tokens)
        reps[i].state, reps[i].since_s = DRAINING, t


def _busy(fleet: FleetSim, i: int) -> bool:
    e = fleet.engines[i]
    return bool(e.running or e.waiting)


def _first(reps: list[_Replica], state: str) -> int | None:
    return next((i for i, r in enumerate(reps) if r.state == state), None)


def _met(r: SimRequest) -> bool:
    d = Delivery(r.slo, r.arrival_s, r.prompt_tokens, tuple(r.token_times), True)
    return request_goodput(d) > 0
