"""Per-program bookkeeping for compound requests: stage sub-deadlines from pattern matching (§4.1).

A scheduler (simulator or sidecar) calls :meth:`CompoundTracker.stage_finished` as each stage's
calls complete, :meth:`sub_deadline_at_s` when the next stage starts (its model/tool known), and
:meth:`finish` when the program ends, which stores its graph in the history for later requests.
``sub_deadline_at_s`` returns None when no stored pattern matches: the caller keeps its own rule.
"""

from __future__ import annotations

from slo_core.predict.pattern_store import PatternHistory, PatternMatcher
from slo_core.predict.patterns import PatternGraph, Stage, stage_sub_deadline_s


class CompoundTracker:
    """Matchers for running programs over one shared :class:`PatternHistory`."""

    def __init__(self, history: PatternHistory | None = None) -> None:
        self.history = history or PatternHistory()
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
