"""A fleet of simulated replicas behind a router: the discrete-event loop.

Events, in time order (arrivals before engine steps at equal times, so that simultaneous arrivals
join the same step): a job arrives (a single request, or a compound program whose first stage is
released at once); a compound stage is released (its calls arrive together); an engine's step ends
(tokens delivered, finished requests leave, the next step is planned at once). Every arriving request
or call is routed at its arrival time from fresh replica snapshots through the same routing pipeline
the router service runs (``slo_core.routing``: filters, policy, feasibility and admission), so a
request no replica can serve in time is rejected or demoted to best effort here exactly as a live
router answers 503 or demotes it; routers that declare ``needs_request_snapshots = False`` get the
replicas' counters only, which is much cheaper.

Stage ``s+1`` of a program is released ``tool_latency_s`` after the last call of stage ``s``
finished. A call is routed on the due time a live router knows (core's ``routing_deadline_at_s``: the
program's deadline split over its stated stages, or its tier's stage shares), and its engine then gets
its stage's sub-deadline from the analyzer (the pod's sidecar live). A rejected call fails its program.
The run stops when no event is left or, with ``drain="slo"``, once no delivery could earn SLO gain any
more (every job's last token deadline has passed).
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from slo_core.objective import Objective
from slo_core.perf.model import PerfProfile
from slo_core.policies.base import EnginePolicy, ReplicaCapabilities, ReplicaView, RequestView, RouterPolicy
from slo_core.policies.feedback import Feedback
from slo_core.policies.registry import make_engine_policy, make_router_policy
from slo_core.predict.compound import fallback_stage_deadline_at_s, routing_deadline_at_s
from slo_core.routing import Endpoint, RoutingPipeline, SnapshotEndpoint, with_sent
from slo_core.runtime_policy import AdmissionRule, RuntimePolicy
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.collector import young_collections_only
from slo_core.sim.engine import SimEngine
from slo_core.sim.engine_types import DecisionCost, EngineConfig
from slo_core.sim.outcomes import finished_view
from slo_core.sim.request import ABORTED, FINISHED, REJECTED, WAITING, ProgramState, SimRequest
from slo_core.sim.views import request_view
from slo_core.slo import RequestKind, SLOTier
from slo_core.workloads.jobs import Job, bound_to_tier

_ARRIVAL = 0
_STEP = 1
_TICK = 2  # a periodic hook (the autoscaler, slo_core.sim.autoscale)


class SimConfig(BaseModel):
    """How a fleet run is driven (not the engines' limits: see EngineConfig)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool_latency_s: float = Field(0.0, ge=0, description="delay between a stage's end and the next stage (s)")
    drain: Literal["slo", "all"] = Field(
        "slo", description="stop once no SLO gain is possible ('slo') or when every request finished ('all')"
    )
    max_drain_s: float = Field(
        3600.0, gt=0, description="with drain='all': stop this long after the last arrival (s)"
    )
    feedback_goodput: str = Field(
        "token", description="goodput function of the FinishedViews policies observe"
    )
    report_interval_s: float = Field(
        0.0,
        ge=0,
        description="the router sees each replica as its last report showed it, reports at most this often, "
        "plus the requests it routed there since (a live router's state stream); 0: the exact state",
    )
    coast: bool = Field(
        True,
        description="run an engine's steps that nothing can change in one pass (SimEngine.coast: the "
        "same run, faster); False: every step through the event queue (the reference it is tested against)",
    )


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One replica: its performance profile and engine limits."""

    profile: PerfProfile
    config: EngineConfig = field(default_factory=EngineConfig)


@dataclass
class SimResult:
    """Everything a run produced: per-request and per-program state, and per-replica counters."""

    jobs: list[Job]
    requests: list[SimRequest]
    programs: list[ProgramState]
    end_s: float
    duration_s: float
    wall_s: float
    replica_stats: list[dict[str, float]]
    rejected_by_router: int = 0
    demoted_by_router: int = 0
    demoted_by_tier: dict[str, int] = field(default_factory=dict)  # by the tier each request asked for
    demoted_ids: list[str] = field(default_factory=list)  # the requests and calls demoted, in order


PolicyFactory = Callable[[], EnginePolicy]


class Ticker(Protocol):
    """Called every ``period_s`` of simulated time (e.g. :class:`slo_core.sim.autoscale.Autoscaler`)."""

    period_s: float

    def attach(self, fleet: FleetSim) -> None: ...

    def tick(self, fleet: FleetSim, t: float) -> None: ...

    def ready_ids(self, now_s: float) -> frozenset[str]:
        """The replicas that may take traffic now (the rest are off, starting or draining)."""
        ...


def _policy_factory(
    policy: str | PolicyFactory, params: Mapping[str, Any] | None, objective: Objective | None = None
) -> PolicyFactory:
    if isinstance(policy, str):
        name = policy
        return lambda: make_engine_policy(name, params, objective)
    return policy


class _EngineEndpoint:
    """A simulated replica as the routing pipeline's :class:`Endpoint`, for a router that reads only
    its counters: what ``SnapshotEndpoint(engine.replica_view(t, with_requests=False))`` answers (the
    id, the capabilities, always usable), the view taken only when the pipeline reads it."""

    __slots__ = ("endpoint_id", "engine")

    usable = True  # the fleet's reported views are always healthy

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.endpoint_id = engine.engine_id

    def capabilities(self) -> ReplicaCapabilities:
        return self.engine.capabilities

    def replica_view(self, now_s: float) -> ReplicaView:
        return self.engine.replica_view(now_s, with_requests=False)


class FleetSim:
    """Runs a workload on replicas with one engine policy each (a fresh instance per replica)."""

    def __init__(
        self,
        replicas: Sequence[ReplicaSpec],
        policy: str | PolicyFactory,
        router: str | RouterPolicy = "round-robin",
        *,
        seed: int = 0,
        config: SimConfig | None = None,
        policy_params: Mapping[str, Any] | None = None,
        router_params: Mapping[str, Any] | None = None,
        analyzer: SimAnalyzer | None = None,
        admission: AdmissionRule | None = None,
        shuffle_ties: bool = True,
        objective: Objective | None = None,
        autoscaler: Ticker | None = None,
        tiers: Mapping[str, SLOTier] | None = None,
        decision_cost: DecisionCost | None = None,
    ) -> None:
        """``analyzer``: the sidecar's request analyzer (QRF bounds refined as tokens stream, pattern-graph
        stage sub-deadlines); None leaves bounds unknown (policies fall back to max_tokens) and splits a
        program's remaining time equally over its remaining stages. ``admission``: what happens to a
        request no replica can serve in time (the SLOPolicy's, ``RuntimePolicy.admission``; default
        reject, as a router without a best-effort tier does); ``shuffle_ties`` as the router's;
        ``objective``: what SLO-aware policies maximize (given to the engine and router policies named
        here, and the goodput of the feedback they observe); None keeps each policy's own defaults and
        feeds back ``config.feedback_goodput``. ``tiers``: the SLOPolicy's tiers by name: a job of a
        tier gets the targets the router binds for what it states (:meth:`SLOTier.bind`: never stricter
        than the tier's), and a compound tier's stage deadline shares (as the router and the sidecar
        read them). ``decision_cost``: the CPU time each engine's policy decisions add to their steps,
        as the vLLM plugin's do in a pod (:class:`DecisionCost`); None: decisions take no time."""
        self.analyzer = analyzer
        self.tiers = dict(tiers or {})
        self.stage_shares = {
            name: t.stage_deadline_share for name, t in self.tiers.items() if t.stage_deadline_share
        }
        if not replicas:
            raise ValueError("a fleet needs at least one replica")
        self.config = config or SimConfig()
        make_policy = _policy_factory(policy, policy_params, objective)
        feedback = partial(finished_view, Feedback.for_objective(objective, self.config.feedback_goodput))
        self.router = (
            make_router_policy(router, router_params, objective) if isinstance(router, str) else router
        )
        self._router_needs_requests = self.router.needs_request_snapshots
        # an online-calibrated analyzer learns from the views every decision refreshes
        views_free = analyzer is None or analyzer.calibrated is None
        self.engines = [
            SimEngine(
                f"replica-{i}",
                spec.profile,
                make_policy(),
                spec.config,
                rng=random.Random(seed * 1_000_003 + i),
                feedback=feedback,
                index=i,
                skip_order_free=views_free,
                # a router that reads the queues would see them sorted before the policy's decision
                keyed_admission=views_free and not self._router_needs_requests,
                live_running=views_free,
                decision_cost=decision_cost,
            )
            for i, spec in enumerate(replicas)
        ]
        self.by_id = {e.engine_id: e for e in self.engines}
        # a router that reads only the counters is offered each replica as itself (its view taken when
        # the pipeline reads it, a pure read); one that reads the queues, a snapshot of each taken first
        self._endpoints = None if self._router_needs_requests else [_EngineEndpoint(e) for e in self.engines]
        self.router_rng = random.Random(seed * 7_919 + 17)
        self.pipeline = RoutingPipeline(self.router, admission, shuffle=shuffle_ties)
        self.autoscaler = autoscaler

    @classmethod
    def from_runtime(cls, replicas: Sequence[ReplicaSpec], runtime: RuntimePolicy, **kwargs: Any) -> FleetSim:
        """A fleet running an SLOPolicy's :class:`RuntimePolicy`: its engine and routing policies with
        their parameters, its admission rule and its objective (the same object the services get)."""
        return cls(
            replicas,
            runtime.scheduling.name,
            runtime.routing.name,
            policy_params=runtime.scheduling.kwargs(),
            router_params=runtime.routing.kwargs(),
            admission=runtime.admission,
            objective=runtime.objective,
            tiers=runtime.tiers,
            **kwargs,
        )

    # ---- the event loop ---------------------------------------------------------------------------

    def run(self, jobs: Sequence[Job], progress: Callable[[float], None] | None = None) -> SimResult:
        """Simulate ``jobs`` (any order); ``progress`` gets the fraction of arrivals done now and then.

        The garbage collector runs only its young generation meanwhile (:mod:`slo_core.sim.collector`):
        its full passes over the run's long-lived objects were up to a fifth of a run's CPU time."""
        with young_collections_only():
            return self._run(jobs, progress)

    def _run(self, jobs: Sequence[Job], progress: Callable[[float], None] | None) -> SimResult:
        started = time.perf_counter()
        tiers = self.tiers  # each job with the targets the router binds in its tier
        ordered = sorted((bound_to_tier(j, tiers) for j in jobs), key=lambda j: j.arrival_s)
        if self.analyzer is not None:
            self.analyzer.prepare(ordered)
        self._requests: list[SimRequest] = []
        self._programs: list[ProgramState] = []
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._idle = [True] * len(self.engines)
        self._rejected_by_router = 0
        self._demoted_by_tier: dict[str, int] = {}
        self._demoted_ids: list[str] = []
        self._reports: dict[int, ReplicaView] = {}
        self._sent: dict[int, list[tuple[float, RequestView]]] = {e.index: [] for e in self.engines}
        last_arrival = ordered[-1].arrival_s if ordered else 0.0
        if self.config.drain == "slo":
            horizon = max((j.last_useful_s() for j in ordered), default=0.0) + 1e-9
        else:
            horizon = last_arrival + self.config.max_drain_s
        heap = self._heap
        n_jobs = len(ordered)
        # coasting needs every event that reads or changes an engine in view: arrivals (below) and
        # other engines' steps; a timed stage release or an autoscaler tick would be neither
        self._coast = self.config.coast and self.autoscaler is None and self.config.tool_latency_s <= 0
        self._coast_horizon = math.nextafter(horizon, math.inf)  # steps ending after it never run
        i = 0
        t = 0.0
        engines = self.engines
        tick = max(1, n_jobs // 200)
        if self.autoscaler is not None:
            self.autoscaler.attach(self)
            self._push(0.0, _TICK, 0)
        while True:
            next_job = ordered[i].arrival_s if i < n_jobs else math.inf
            if heap and (heap[0][0] < next_job or (heap[0][0] == next_job and heap[0][1] == _ARRIVAL)):
                t, kind, _, payload = heapq.heappop(heap)
                if t > horizon:
                    break
                if kind == _STEP:
                    self._step(engines[payload], t, next_job)
                elif kind == _TICK:
                    self._tick(t, more=i < n_jobs)
                else:
                    self._release_stage(self._programs[payload], t)
            elif i < n_jobs:
                t = next_job
                if t > horizon:
                    break
                self._arrive(ordered[i], t)
                i += 1
                if progress is not None and i % tick == 0:
                    progress(i / n_jobs)
            else:
                break
        if progress is not None:
            progress(1.0)
        stats = [
            {
                "preemptions": float(e.preemptions),
                "decisions": float(e.decisions),
                "busy_s": e.busy_s,
                "steps": float(e.steps_run),
                "steps_coasted": float(e.steps_coasted),
            }
            for e in engines
        ]
        return SimResult(
            jobs=list(ordered),
            requests=self._requests,
            programs=self._programs,
            end_s=min(t, horizon),
            duration_s=last_arrival,
            wall_s=time.perf_counter() - started,
            replica_stats=stats,
            rejected_by_router=self._rejected_by_router,
            demoted_by_router=len(self._demoted_ids),
            demoted_by_tier=dict(self._demoted_by_tier),
            demoted_ids=list(self._demoted_ids),
        )

    def _tick(self, t: float, *, more: bool) -> None:
        assert self.autoscaler is not None
        self.autoscaler.tick(self, t)
        if more or self._heap or not all(self._idle):
            self._push(t + self.autoscaler.period_s, _TICK, 0)

    def _push(self, t: float, kind: int, payload: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    def _step(self, engine: SimEngine, t: float, next_job_s: float) -> None:
        engine.complete()
        self._collect(engine, t)
        if self._coast and engine.running and not engine.waiting:  # coast's cheapest refusals first
            t = engine.coast(t, self._coast_limit(engine, next_job_s))
        nxt = engine.plan(t)
        if engine.done:
            self._collect(engine, t)
        if nxt is None:
            self._idle[engine.index] = True
        else:
            self._push(nxt, _STEP, engine.index)

    def _coast_limit(self, engine: SimEngine, next_job_s: float) -> float:
        """The time before which ``engine`` may coast: the next arrival (routing reads every replica),
        the horizon, and the next step end of every other engine holding a compound call (a call
        finishing there routes its program's next stage at once). Events at that very time come first."""
        limit = min(next_job_s, self._coast_horizon)
        idle = self._idle
        for e in self.engines:
            if e.calls_held and e is not engine and not idle[e.index] and e.step_end_s < limit:
                limit = e.step_end_s
        return limit

    def _collect(self, engine: SimEngine, t: float) -> None:
        """Program bookkeeping for requests that left ``engine`` (finished or rejected)."""
        done = engine.done
        engine.done = []
        for r in done:
            if self.analyzer is not None:  # online calibration learns (and stops tracking it)
                self.analyzer.request_finished(
                    r.bound_schedule, r.generated, r.max_tokens, finished=r.state == FINISHED
                )
            p = r.program
            if p is None:
                continue
            if r.state in (REJECTED, ABORTED):
                p.failed = True
            self._call_left(p, t)

    def _call_left(self, p: ProgramState, t: float) -> None:
        p.pending_calls -= 1
        analyzer = self.analyzer
        if p.pending_calls > 0:
            return
        if p.failed:
            if analyzer is not None:
                analyzer.program_finished(p, t, completed=False)
            return
        p.attained_done_tokens = sum(c.attained_tokens() for c in p.calls)
        p.live_from = len(p.calls)  # the stage's calls are now all in attained_done_tokens
        p.attained_cache = -1
        if analyzer is not None:
            analyzer.stage_finished(p, p.next_stage - 1, t)
        if p.next_stage < len(p.stages):
            if self.config.tool_latency_s > 0:
                self._push(t + self.config.tool_latency_s, _ARRIVAL, p.index)
            else:
                self._release_stage(p, t)
        else:
            p.finish_s = t
            if analyzer is not None:
                analyzer.program_finished(p, t, completed=True)

    # ---- arrivals and routing -----------------------------------------------------------------------

    def _arrive(self, job: Job, t: float) -> None:
        if job.stages is None:
            schedule = None
            bound = job.output_bound
            if self.analyzer is not None and bound is None:
                schedule = self.analyzer.schedule(job.prompt_tokens, job.slo.kind.value, job.max_tokens)
                bound = schedule.at(0)
            r = SimRequest(
                job.job_id,
                t,
                job.slo,
                job.prompt_tokens,
                output_tokens=job.output_tokens,
                max_tokens=job.max_tokens,
                deadline_at_s=None
                if job.slo.kind is RequestKind.LATENCY
                else t + job.slo.effective_deadline_s,
                output_bound=bound,
                tier=job.tier,
                tenant=job.tenant,
            )
            r.bound_schedule = schedule
            self._requests.append(r)
            self._route(r, t)
            return
        p = ProgramState(
            job.job_id,
            t,
            job.slo,
            job.stages,
            tier=job.tier,
            tenant=job.tenant,
            max_tokens=job.max_tokens,
            index=len(self._programs),
        )
        self._programs.append(p)
        self._release_stage(p, t)

    def _release_stage(self, p: ProgramState, t: float) -> None:
        s = p.next_stage
        p.next_stage += 1
        calls = p.stages[s]
        p.pending_calls = len(calls)
        analyzer = self.analyzer
        share = self.stage_shares.get(p.tier)
        deadline_s = p.deadline_at_s - p.arrival_s
        if analyzer is None:
            deadline_at = fallback_stage_deadline_at_s(
                p.deadline_at_s, p.arrival_s, t, s, stages=len(p.stages), tier_share=share
            )
        else:
            deadline_at = analyzer.stage_deadline_at_s(p, s, t, tier_share=share)
        routed_at = routing_deadline_at_s(
            p.arrival_s, deadline_s, t, s, stages=len(p.stages), tier_share=share
        )
        new = []
        for k, (inp, out) in enumerate(calls):
            max_tokens = max(out, p.max_tokens)
            schedule = None if analyzer is None else analyzer.schedule(inp, p.slo.kind.value, max_tokens)
            r = SimRequest(
                f"{p.program_id}/s{s}/c{k}",
                t,
                p.slo,
                inp,
                output_tokens=out,
                max_tokens=max_tokens,
                deadline_at_s=routed_at,
                output_bound=None if schedule is None else schedule.at(0),
                tier=p.tier,
                tenant=p.tenant,
                program=p,
                stage=s,
            )
            r.bound_schedule = schedule
            p.calls.append(r)
            self._requests.append(r)
            new.append(r)
        for r in new:
            self._route(r, t, deadline_at)

    def _route(self, r: SimRequest, t: float, engine_deadline_at_s: float | None = None) -> None:
        """Route ``r`` as the router would; a compound call (``engine_deadline_at_s``: its stage's
        sub-deadline from the analyzer) is routed on what the router knows of its due time and reaches
        its engine with the sub-deadline, unless it was demoted to best effort."""
        r.set_state(WAITING)
        r.waiting_since_s = t
        lazy = self._endpoints
        engines = self.engines
        if self.autoscaler is not None:  # only replicas that are up take traffic
            ready = self.autoscaler.ready_ids(t)
            engines = [e for e in engines if e.engine_id in ready]
        endpoints: Sequence[Endpoint]
        if lazy is None:
            endpoints = [SnapshotEndpoint(self._reported_view(e, t)) for e in engines]
        else:
            endpoints = lazy if engines is self.engines else [lazy[e.index] for e in engines]
        view = request_view(r)
        routed = self.pipeline.route(view, endpoints, now_s=t, rng=self.router_rng)
        if routed.outcome == "demoted":
            self._demoted_by_tier[r.tier] = self._demoted_by_tier.get(r.tier, 0) + 1
            r.slo, r.deadline_at_s = routed.request.slo, routed.request.deadline_at_s
            r.tier = self.pipeline.admission.best_effort_tier or r.tier
            r.view_key = None  # the cached view still carries the old targets
            self._demoted_ids.append(r.request_id)
        elif engine_deadline_at_s is not None and engine_deadline_at_s != r.deadline_at_s:
            r.deadline_at_s = engine_deadline_at_s
            r.view_key = None  # the cached view still carries the routing deadline
        engine = self.by_id.get(routed.endpoint.endpoint_id) if routed.endpoint is not None else None
        if engine is None or not engine.accept(r, t):
            r.set_state(REJECTED)
            r.finish_s = t
            self._rejected_by_router += 1
            if r.program is not None:
                r.program.failed = True
                self._call_left(r.program, t)
            return
        if self.config.report_interval_s > 0 and self._router_needs_requests:
            self._sent[engine.index].append((t, routed.request))
        if self._idle[engine.index]:
            self._idle[engine.index] = False
            self._push(t, _STEP, engine.index)

    def _reported_view(self, engine: SimEngine, t: float) -> ReplicaView:
        """``engine`` as a router that reads the queues sees it at ``t`` (one that reads only counters
        is offered the engine itself, :class:`_EngineEndpoint`): exact, or (``report_interval_s`` > 0)
        its last report, taken at most once per interval, plus the requests routed to it since, as a
        live router's endpoint adds what it sent after the snapshot it holds."""
        interval = self.config.report_interval_s
        if interval <= 0:
            return engine.replica_view(t)
        i = engine.index
        last = self._reports.get(i)
        if last is None or t - last.snapshot_s >= interval:
            last = self._reports[i] = engine.replica_view(t)
            self._sent[i] = []
        return with_sent(last, [req for _, req in self._sent[i]])
