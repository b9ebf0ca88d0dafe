"""Per-program bookkeeping for compound requests: stage sub-deadlines from pattern matching (§4.1).

A scheduler (simulator or sidecar) calls :meth:`CompoundTracker.stage_finished` as each stage's
calls complete, :meth:`sub_deadline_at_s` when the next stage starts (its model/tool known), and
:meth:`finish` when the program ends, which stores its graph in the history for later requests.
``sub_deadline_at_s`` returns None when no stored pattern matches; :meth:`stage_deadline_at_s` then
applies the one fallback rule (:func:`fallback_stage_deadline_at_s`). The simulator's analyzer
(slo_core.sim.analyzer) and the sidecar's tracker (slo_sidecar.tracker) both call these, with a stage
of LLM calls named :data:`LLM_STAGE`, so they give the same sub-deadlines for the same program.
"""

from __future__ import annotations

from slo_core.predict.pattern_store import PatternHistory, PatternMatcher
from slo_core.predict.patterns import PatternGraph, Stage, stage_sub_deadline_s

LLM_STAGE = "llm"  # node identity of a stage of LLM calls (one model behind a pod; no tool stages yet)


def fallback_stage_deadline_at_s(
    program_deadline_at_s: float,
    program_arrival_s: float,
    now_s: float,
    stage: int,
    *,
    stages: int | None,
    tier_share: tuple[float, ...] | None = None,
) -> float:
    """A stage's sub-deadline when no stored pattern matches.

    The tier's ``stage_deadline_share`` (cumulative, from the program's arrival) when it names this
    stage; else the time left split equally over the stages left, when the number of stages is known;
    else the program's deadline. Never after the program's deadline.
    """
    if tier_share and stage < len(tier_share):
        deadline_s = program_deadline_at_s - program_arrival_s
        at = program_arrival_s + stage_sub_deadline_s(sum(tier_share[: stage + 1]), deadline_s)
        return min(program_deadline_at_s, max(now_s, at))
    if stages:
        left = max(1, stages - stage)
        return min(program_deadline_at_s, now_s + (program_deadline_at_s - now_s) / left)
    return program_deadline_at_s


def routing_deadline_at_s(
    program_arrival_s: float,
    deadline_s: float,
    now_s: float,
    stage: int | None,
    *,
    stages: int | None,
    tier_share: tuple[float, ...] | None = None,
) -> float:
    """A compound call's due time as a router knows it when the call arrives: the rule of
    :func:`fallback_stage_deadline_at_s` on the program's deadline (``deadline_s`` after its first call
    arrived), for the stated stage; the program's deadline when the call names no stage. The pod's
    analyzer may then narrow it with a matched pattern (its answer reaches only the engine), so the live
    router and the simulator's route every call on this same figure."""
    program_deadline_at_s = program_arrival_s + deadline_s
    if stage is None:
        return program_deadline_at_s
    return fallback_stage_deadline_at_s(
        program_deadline_at_s, program_arrival_s, now_s, stage, stages=stages, tier_share=tier_share
    )


class CompoundTracker:
    """Matchers for running programs over one shared :class:`PatternHistory`."""

    def __init__(self, history: PatternHistory | None = None) -> None:
        self.history = history if history is not None else PatternHistory()  # an empty one is falsy
        self._stages: dict[str, list[Stage]] = {}
        self._matchers: dict[str, PatternMatcher] = {}

    def _matcher(self, program_id: str) -> PatternMatcher:
        m = self._matchers.get(program_id)
        if m is None:
            m = self._matchers[program_id] = self.history.matcher()
            self._stages[program_id] = []
        return m

    def stage_finished(self, program_id: str, stage: Stage) -> None:
        """Record a completed stage (summed output/input tokens of its calls, its wall time)."""
        self._matcher(program_id).observe(stage)
        self._stages[program_id].append(stage)

    def stage_share(
        self, program_id: str, next_ident: str | None, now_s: float | None = None
    ) -> float | None:
        """φ of the stage that is starting, from the best-matching stored pattern (None: no match)."""
        return self._matcher(program_id).next_share(next_ident, now_s)

    def sub_deadline_at_s(
        self,
        program_id: str,
        next_ident: str | None,
        program_arrival_s: float,
        deadline_s: float,
        now_s: float | None = None,
    ) -> float | None:
        """Absolute sub-deadline arrival + φ(s)·D of the starting stage; never after arrival + D."""
        share = self.stage_share(program_id, next_ident, now_s)
        if share is None:
            return None
        return program_arrival_s + stage_sub_deadline_s(share, deadline_s)

    def stage_deadline_at_s(
        self,
        program_id: str,
        next_ident: str | None,
        program_arrival_s: float,
        deadline_s: float,
        now_s: float,
        *,
        fallback_at_s: float,
    ) -> tuple[float, bool]:
        """The starting stage's absolute sub-deadline, and whether a stored pattern gave it.

        The best match's φ(s)·D when it lies ahead (capped at the program's deadline), else
        ``fallback_at_s`` (see :func:`fallback_stage_deadline_at_s`).
        """
        matched = self.sub_deadline_at_s(program_id, next_ident, program_arrival_s, deadline_s, now_s)
        if matched is None or matched <= now_s:
            return fallback_at_s, False
        return min(matched, program_arrival_s + deadline_s), True

    def finish(self, program_id: str, now_s: float, store: bool = True) -> PatternGraph | None:
        """Forget the program; store its graph (if it ran any stage) for future matching."""
        self._matchers.pop(program_id, None)
        stages = self._stages.pop(program_id, [])
        if not stages:
            return None
        graph = PatternGraph(tuple(stages[:255]))
        if store:
            self.history.add(graph, now_s)
        return graph
