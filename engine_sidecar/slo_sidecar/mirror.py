"""Engine mode: the engine's own view of its requests, reported by its scheduler, and their bounds.

The router streams straight from the engine, so the sidecar sees no token. The engine-side scheduler
(vLLM plugin, engine-sim) reports at most once per interval (``Analyzer.Report``): load, KV use and each
live request's phase, token counts and SLO tags. Each report is answered with the live requests'
output-length bounds: a new request gets the analyzer's submission bound, a running one is refined
every ``refine_every_tokens`` generated tokens (the predictor runs off the event loop, all of a report's
requests in one call), and finished ones teach the online estimator and calibration. The same report
is what the sidecar's state stream serves routers (:func:`slo_sidecar.grpc_service.pod_state`).

The reports also feed the counters the proxy-mode sidecar exports, with the same meaning (what the
operator's autoscaler scrapes, :mod:`slo_core.scaling`): prompt tokens when a request is first seen
(or, for one that came and went between two reports, when it finishes); output tokens, the SLO outcome
per tier the engine judged by core's rule and policy rejections when it finishes (an abort counts no
outcome); and, per report, the outstanding admitted tokens (prompts not yet started plus output
bounds left), the requests of compound programs and the engine's waiting queue as gauges.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slo_core.slo import SLOTier
from slo_proto import slofleet_pb2 as pb
from slo_sidecar.analyzer import CompoundAnalyzer
from slo_sidecar.calibration import CalibrationHub
from slo_sidecar.config import SidecarKnobs
from slo_sidecar.estimators import LengthEstimator
from slo_sidecar.metrics import SidecarMetrics

MAX_TRACKED = 100_000  # requests the mirror remembers bounds for (an engine never runs this many)
PROGRAM_IDLE_S = 600.0  # a compound program with no call for this long ends (a pattern if it completed)


@dataclass
class Tracked:
    """The analyzer's state of one request the engine reported."""

    bound: int
    bound_at_arrival: int
    refined_at_tokens: int
    kind: str
    tier: str
    max_tokens: int
    plan: Any = None
    deadline_unix_s: float = 0.0  # a compound call's stage sub-deadline (0: the tags' own deadline)
    program_id: str = ""
    stage: int | None = None
    prompt_tokens: int = 0
    generated_tokens: int = 0  # as of the newest report (the calibration reads it while in flight)


class EngineMirror:
    """The newest engine report and the bounds of its requests (see the module docstring)."""

    def __init__(
        self,
        *,
        knobs: SidecarKnobs,
        estimator: LengthEstimator,
        metrics: SidecarMetrics,
        calibration: CalibrationHub | None = None,
        compound: CompoundAnalyzer | None = None,
        tiers: Callable[[], Mapping[str, SLOTier]] = dict,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.knobs, self.estimator, self.metrics = knobs, estimator, metrics
        self.calibration = calibration
        self.compound = compound or CompoundAnalyzer()  # times here are the engine's unix seconds
        self.tiers = tiers
        self.clock = clock
        self.report: Any = None
        self.received_s: float | None = None
        self.tracked: dict[str, Tracked] = {}
        self.reports = 0

    def fresh(self, stale_after_s: float) -> bool:
        return self.received_s is not None and self.clock() - self.received_s <= stale_after_s

    @property
    def seen(self) -> bool:
        """An engine reported at least once: its view, not the sidecar's relayed jobs, is the pod's."""
        return self.report is not None

    def bound_of(self, key: str, fallback: int) -> int:
        t = self.tracked.get(key)
        return t.bound if t is not None else fallback

    def deadline_of(self, key: str) -> float:
        """A compound call's stage sub-deadline (unix seconds), 0 when it has none."""
        t = self.tracked.get(key)
        return t.deadline_unix_s if t is not None else 0.0

    async def take(self, report: Any) -> list[tuple[str, int, float]]:
        """Apply one report; returns (request key, bound, sub-deadline or 0) of every live request."""
        self.report, self.received_s = report, self.clock()
        self.reports += 1
        live = report.requests
        if report.finished:
            self._finish(report.finished, report.snapshot_unix_s)
            # a row that ended after the engine took this report's snapshot is gone, not new
            done = {f.request_key for f in report.finished}
            live = [r for r in live if r.request_key not in done]
        new = [r for r in live if r.request_key not in self.tracked]
        due = [
            r
            for r in live
            if (t := self.tracked.get(r.request_key)) is not None
            and r.generated_tokens - t.refined_at_tokens >= self.knobs.refine_every_tokens
        ]
        if new or due:
            if getattr(self.estimator, "cheap", False) and self.calibration is None:
                self._estimate(new, due)
            else:  # a forest pass per request: off the event loop, the whole batch in one call
                await asyncio.to_thread(self._estimate, new, due)
        prompts = self.metrics.prompt_tokens
        for r in new:
            prompts.labels(r.tier or "-", "-").inc(int(r.prompt_tokens))  # admitted: counted once
            if r.program_id and r.request_key in self.tracked:
                self._place_in_program(r, self.tracked[r.request_key])
        self._gauges(report, live)
        if self.reports % 100 == 0:
            self._expire_programs(report.snapshot_unix_s)
        return [
            (r.request_key, self.bound_of(r.request_key, r.max_tokens), self.deadline_of(r.request_key))
            for r in report.requests
        ]

    def _gauges(self, report: Any, live: list[Any]) -> None:
        """The proxy sidecar's gauges from the engine's view: admitted work not yet done (prompts not
        yet started plus output bounds left), requests of compound programs, the engine's queue."""
        outstanding = programs = 0
        tracked = self.tracked
        for r in live:  # proto int64 fields read as ints
            t = tracked.get(r.request_key)
            generated = r.generated_tokens
            if t is None:
                bound = r.max_tokens
            elif (bound := t.bound) < generated:  # as the proxy's tracker: a bound generated tokens passed
                bound = t.bound = min(t.max_tokens, generated + 1)
            if t is not None:
                t.generated_tokens = generated
            left = bound - generated
            outstanding += (left if left > 0 else 0) + (0 if generated else r.prompt_tokens)
            if r.program_id:
                programs += 1
        m = self.metrics
        m.outstanding_tokens.set(outstanding)
        m.program_requests.set(programs)
        m.engine_waiting.set(int(report.waiting))

    def _place_in_program(self, r: Any, t: Tracked) -> None:
        """A compound call: its program (deadline from the tags) and its stage's sub-deadline φ(s)·D."""
        tier = self.tiers().get(r.tier)
        if tier is None or r.deadline_s <= 0:
            return
        now = float(r.arrival_unix_s)
        # the stated stage count: the fallback's equal split, and the program's end (its pattern stored)
        started = float(r.program_start_unix_s)
        prog = self.compound.program(
            r.program_id,
            now,
            float(r.deadline_s),
            int(r.stages) or None,
            start_s=started if started > 0 else None,
        )
        stage = int(r.stage) if r.HasField("stage") else None
        # Without a matching pattern the call keeps the due time its tags carry: the router's
        # routing_deadline_at_s, the simulator's fallback rule on what only the router knows (the
        # program's first call in the fleet, the stated stage count); this pod's own rule, lacking
        # both, gave the whole program's deadline and undid the split (live vs simulated, issue 15).
        tagged = float(r.deadline_unix_s)
        sub = self.compound.call_arrived(prog, stage, tier, now, fallback_at_s=tagged if tagged > 0 else None)
        t.program_id, t.stage, t.prompt_tokens = r.program_id, stage, int(r.prompt_tokens)
        if t.stage is None:
            t.stage = prog.stage
        if sub is not None:
            t.deadline_unix_s = sub

    def _expire_programs(self, now: float) -> None:
        busy = {t.program_id for t in self.tracked.values() if t.program_id}
        for pid, prog in list(self.compound.programs.items()):
            if pid not in busy and now - prog.last_seen_s > PROGRAM_IDLE_S:
                self.compound.finish(prog, now, store=not prog.failed)

    def _estimate(self, new: list[Any], due: list[Any]) -> None:
        hub, apply = self.calibration, self.knobs.calibration_apply
        for r in new:
            kind = r.kind or "best-effort"
            max_tokens = max(1, int(r.max_tokens))
            plan = None
            if hub is not None:
                plan = hub.plan(None, int(r.prompt_tokens), kind, max_tokens, self.knobs.model_name, r.tenant)
                bound = hub.bound_at(plan, 0) if apply else hub.forest_bound(plan)
            else:
                bound = int(self.estimator.bound(None, int(r.prompt_tokens), kind, max_tokens))
            if r.output_bound > 0:  # the router's bound (from the tags) when it is tighter
                bound = min(bound, int(r.output_bound))
            bound = max(bound, int(r.generated_tokens) + 1) if r.generated_tokens else max(1, bound)
            t = self.tracked[r.request_key] = Tracked(
                bound, bound, int(r.generated_tokens), kind, r.tier, max_tokens, plan
            )
            t.generated_tokens = int(r.generated_tokens)
            if hub is not None and plan is not None:  # in flight: a censored score until it finishes
                hub.calibrator.track(t)
        for r in due:
            t = self.tracked[r.request_key]
            generated = int(r.generated_tokens)
            t.refined_at_tokens = generated
            if hub is not None and t.plan is not None and apply:
                value = hub.bound_at(t.plan, generated)
            else:
                value = self.estimator.refine(
                    t.bound, None, int(r.prompt_tokens), generated, None, t.kind, t.max_tokens
                )
            t.bound = max(int(value), min(t.max_tokens, generated + 1))
        while len(self.tracked) > MAX_TRACKED:  # rows whose finish never arrived (engine restarted)
            self._untrack(self.tracked.pop(next(iter(self.tracked))))

    def _untrack(self, t: Tracked | None) -> float | None:
        """Stop counting ``t`` as in flight; its arrival time on the calibration's clock."""
        if t is not None and t.plan is not None and self.calibration is not None:
            return self.calibration.calibrator.untrack(t)
        return None

    def _finish(self, finished: Any, now: float) -> None:
        learn = getattr(self.estimator, "observe", None)
        for f in finished:
            t = self.tracked.pop(f.request_key, None)
            arrived_s = self._untrack(t)
            if t is not None and t.program_id and (prog := self.compound.programs.get(t.program_id)):
                self.compound.call_ended(
                    prog,
                    t.stage,
                    ok=f.finish_reason in ("stop", "length"),
                    input_tokens=t.prompt_tokens,
                    output_tokens=int(f.generated_tokens),
                    now_s=now,
                )
            tier = f.tier or (t.tier if t is not None else "") or "-"
            self._count(f, tier, seen=t is not None)
            if f.finish_reason != "stop":  # only a natural end is a true length sample
                continue
            if learn is not None:
                learn(int(f.generated_tokens))
            if self.calibration is not None and t is not None and t.plan is not None:
                self.calibration.observe(t.plan, int(f.generated_tokens), t.bound_at_arrival, arrived_s)

    def _count(self, f: Any, tier: str, *, seen: bool) -> None:
        """A finished request's counters, as the proxy sidecar's end-of-request accounting."""
        m = self.metrics
        outcome = f.outcome
        if outcome == pb.SLO_OUTCOME_REJECTED:
            status = "rejected"
        else:
            status = "ok" if f.finish_reason in ("stop", "length") else "aborted"
        m.requests.labels(tier, "-", status).inc()
        m.output_tokens.labels(tier, "-").inc(int(f.generated_tokens))
        if not seen and f.prompt_tokens > 0:  # it came and went between two reports
            m.prompt_tokens.labels(tier, "-").inc(int(f.prompt_tokens))
        if outcome == pb.SLO_OUTCOME_REJECTED:
            m.rejects.labels(tier, "-", "engine_policy").inc()
        if outcome != pb.SLO_OUTCOME_UNSPECIFIED:
            m.slo_result(tier, "-", outcome == pb.SLO_OUTCOME_MET)
