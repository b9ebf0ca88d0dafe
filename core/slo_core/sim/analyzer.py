"""The sidecar's request analyzer inside the simulator (JITServe §4.1): bounds and sub-deadlines.

In a real pod the sidecar gives every request an output-length upper bound on arrival, re-estimates
it every N generated tokens, and gives each stage of a compound program a sub-deadline from the
best-matching past program. :class:`SimAnalyzer` does the same for simulated requests with the same
code: the QRF estimator's text-free bound schedules (``OutputBoundEstimator.schedules``: the bound at
every checkpoint from one forest pass) and the pattern-graph :class:`CompoundTracker`, which learns
from the programs the run completes. Without a matching pattern a stage keeps the simulator's
equal-split rule. Policies see the result as ``RequestView.output_bound`` and ``deadline_at_s``.

With a ``calibrator`` (``slofleet bench --analyzer qrf-calibrated``) the bounds go through the online
conformal calibration the sidecar runs (:class:`slo_core.predict.calibration.CalibratedEstimator`):
each request's schedule reads the calibration current when it is refined, and every request that
finishes naturally updates it (stratum = request kind, as in the sidecar's default).
"""

from __future__ import annotations

from collections.abc import Sequence

from slo_core.predict import BoundQuery, BoundSchedule, OutputBoundEstimator, load_estimator
from slo_core.predict.calibration import CalibratedEstimator, OnlineCalibrator, Plan
from slo_core.predict.compound import LLM_STAGE, CompoundTracker, fallback_stage_deadline_at_s
from slo_core.predict.patterns import Stage
from slo_core.sim.request import ProgramState
from slo_core.workloads.jobs import Job

__all__ = ["LLM_STAGE", "SimAnalyzer"]


class CalibratedSchedule:
    """A request's bounds through the live calibration: ``at(g)`` as the sidecar's refinement gives.

    One per request: it is tracked by the calibration while the request is in flight (its progress is
    a censored score, see slo_core.predict.calibration) until :meth:`SimAnalyzer.request_finished`.
    """

    __slots__ = ("calibrated", "generated_tokens", "plan")

    def __init__(self, calibrated: CalibratedEstimator, plan: Plan) -> None:
        self.calibrated = calibrated
        self.plan = plan
        self.generated_tokens = 0

    def at(self, generated_tokens: int) -> int:
        self.generated_tokens = generated_tokens
        return self.calibrated.bound_at(self.plan, generated_tokens)


class SimAnalyzer:
    """Bound schedules per request and pattern-matched stage sub-deadlines for one fleet run."""

    def __init__(
        self,
        estimator: OutputBoundEstimator | None = None,
        *,
        patterns: bool = True,
        calibrator: OnlineCalibrator | None = None,
    ) -> None:
        self.estimator = estimator if estimator is not None else load_estimator()
        self.calibrated = CalibratedEstimator(self.estimator, calibrator) if calibrator is not None else None
        self._plans: dict[tuple[int, str, int], Plan] = {}
        self.tracker = CompoundTracker() if patterns else None
        self._schedules: dict[tuple[int, str, int], BoundSchedule] = {}
        self._stage_start_s: dict[str, float] = {}
        self.matched_stages = 0
        self.default_stages = 0

    def prepare(self, jobs: Sequence[Job]) -> None:
        """Compute every schedule the run will need in one batched pass (optional; else on demand)."""
        keys = set()
        for j in jobs:
            if j.stages is None:
                keys.add((j.prompt_tokens, j.slo.kind.value, j.max_tokens))
            else:
                for stage in j.stages:
                    for inp, out in stage:
                        keys.add((inp, j.slo.kind.value, max(out, j.max_tokens)))
        self._compute(sorted(keys - self._schedules.keys()))

    def _compute(self, keys: Sequence[tuple[int, str, int]]) -> None:
        if not keys:
            return
        if self.calibrated is not None:
            qs = [BoundQuery(None, p, kind, m) for p, kind, m in keys]
            for key, plan in zip(keys, self.calibrated.plans(qs, [k[1] for k in keys]), strict=True):
                self._plans[key] = plan
            return
        queries = [BoundQuery(None, p, kind, m) for p, kind, m in keys]
        for key, schedule in zip(keys, self.estimator.schedules(queries), strict=True):
            self._schedules[key] = schedule

    def schedule(self, prompt_tokens: int, kind: str, max_tokens: int) -> BoundSchedule | CalibratedSchedule:
        """The request's bound at every checkpoint (``schedule.at(generated_tokens)``)."""
        key = (prompt_tokens, kind, max_tokens)
        if self.calibrated is not None:
            if key not in self._plans:
                self._compute([key])
            schedule = CalibratedSchedule(self.calibrated, self._plans[key])
            self.calibrated.calibrator.track(schedule)
            return schedule
        if key not in self._schedules:
            self._compute([key])
        return self._schedules[key]

    def request_finished(
        self, schedule: object, output_tokens: int, max_tokens: int, finished: bool = True
    ) -> None:
        """A request left its engine having emitted ``output_tokens``: a natural end (below its cap)
        teaches the calibration, as a completion with finish_reason "stop" does in the sidecar; a
        rejected or aborted one (``finished=False``) only stops counting as in flight."""
        if self.calibrated is None or not isinstance(schedule, CalibratedSchedule):
            return
        arrived_s = self.calibrated.calibrator.untrack(schedule)
        if finished and 0 < output_tokens < max_tokens:
            self.calibrated.observe(schedule.plan, output_tokens, arrived_s=arrived_s)

    # ---- compound programs -----------------------------------------------------------------------

    def stage_deadline_at_s(
        self, p: ProgramState, stage: int, now_s: float, *, tier_share: tuple[float, ...] | None = None
    ) -> float:
        """The sub-deadline of ``stage`` starting now: φ(s)·D from the best match, else the sidecar's
        fallback (the tier's stage shares, else the time left split equally over the stages left)."""
        self._stage_start_s[p.program_id] = now_s
        fallback = fallback_stage_deadline_at_s(
            p.deadline_at_s, p.arrival_s, now_s, stage, stages=len(p.stages), tier_share=tier_share
        )
        if self.tracker is None:
            return fallback
        deadline_s = p.deadline_at_s - p.arrival_s
        at, matched = self.tracker.stage_deadline_at_s(
            p.program_id, LLM_STAGE, p.arrival_s, deadline_s, now_s, fallback_at_s=fallback
        )
        if matched:
            self.matched_stages += 1
        else:
            self.default_stages += 1
        return at

    def stage_finished(self, p: ProgramState, stage: int, now_s: float) -> None:
        if self.tracker is None:
            return
        calls = p.stages[stage]
        started = self._stage_start_s.get(p.program_id, now_s)
        self.tracker.stage_finished(
            p.program_id,
            Stage(
                LLM_STAGE,
                output_tokens=float(sum(o for _, o in calls)),
                input_tokens=float(sum(i for i, _ in calls)),
                duration_s=max(0.0, now_s - started),
                calls=len(calls),
            ),
        )

    def program_finished(self, p: ProgramState, now_s: float, completed: bool) -> None:
        """Forget the program; a completed one becomes a pattern for later programs."""
        self._stage_start_s.pop(p.program_id, None)
        if self.tracker is not None:
            self.tracker.finish(p.program_id, now_s, store=completed)
