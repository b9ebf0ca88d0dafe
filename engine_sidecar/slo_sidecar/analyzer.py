"""The request analyzer's pattern graphs (JITServe §4.1) in the sidecar: compound sub-deadlines D_s = φ(s)·D.

The matching is core's :class:`~slo_core.predict.compound.CompoundTracker`, the same object the
simulator's analyzer uses (output-length bounds live in :mod:`slo_sidecar.estimators`). What is
sidecar-specific is only how calls become stages: the sidecar sees one HTTP request per call, so the
calls of a stage are summed (tokens, count) and the stage's wall time runs from its first call's
arrival to its last call's end; a stage is handed to the tracker when the next stage's first call
arrives, or when the program ends. Without a matching pattern the fallback is core's
:func:`~slo_core.predict.compound.fallback_stage_deadline_at_s` (tier share, else the time left split
over the stages left, else the whole deadline).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from slo_core.predict.compound import LLM_STAGE, CompoundTracker, fallback_stage_deadline_at_s
from slo_core.predict.pattern_store import PatternHistory
from slo_core.predict.patterns import PatternGraph, Stage
from slo_core.slo import SLOTier
from slo_core.wire.tags import program_start_s


@dataclass
class ProgramRun:
    """A running compound program: its deadline and the stage whose calls are arriving now."""

    program_id: str
    arrival_s: float
    deadline_at_s: float | None
    stated_stages: int | None
    last_seen_s: float
    stage: int = -1
    stage_start_s: float = 0.0
    stage_end_s: float = 0.0
    stage_input_tokens: int = 0
    stage_output_tokens: int = 0
    stage_calls: int = 0
    stage_deadline_at_s: float | None = None
    stage_open_calls: int = 0
    stages_recorded: int = 0
    failed: bool = False


class CompoundAnalyzer:
    """Stage sub-deadlines of the compound programs one sidecar serves (see the module docstring)."""

    def __init__(self, history: PatternHistory | None = None) -> None:
        self.tracker = CompoundTracker(history)
        self.programs: dict[str, ProgramRun] = {}
        self.matched_stages = 0
        self.default_stages = 0

    @property
    def history(self) -> PatternHistory:
        return self.tracker.history

    def program(
        self,
        program_id: str,
        now_s: float,
        deadline_s: float | None,
        stated: int | None,
        *,
        start_s: float | None = None,
    ) -> ProgramRun:
        """The program a call at ``now_s`` belongs to; first seen here, it began at the router's stated
        ``start_s`` (its first call in the fleet) when the call carries one, else now."""
        prog = self.programs.get(program_id)
        if prog is None:
            start = program_start_s(now_s, start_s)
            prog = ProgramRun(program_id, start, start + deadline_s if deadline_s else None, stated, now_s)
            self.programs[program_id] = prog
        prog.last_seen_s = now_s
        return prog

    def call_arrived(
        self,
        prog: ProgramRun,
        stage: int | None,
        tier: SLOTier,
        now_s: float,
        *,
        fallback_at_s: float | None = None,
    ) -> float | None:
        """A call of ``stage`` (None: the next stage) arrives: its absolute sub-deadline (None: none).

        ``fallback_at_s``: the due time to keep when no stored pattern matches, where the caller has a
        better one than this sidecar's own rule (engine mode: the router's ``routing_deadline_at_s``,
        reckoned from the program's first call anywhere in the fleet and the stated stage count, which
        a pod's reports do not carry)."""
        s = stage if stage is not None else prog.stage + 1
        if s > prog.stage:
            self._flush(prog)
            prog.stage, prog.stage_start_s, prog.stage_end_s = s, now_s, now_s
            if prog.deadline_at_s is not None:
                fallback = fallback_at_s
                if fallback is None:
                    fallback = fallback_stage_deadline_at_s(
                        prog.deadline_at_s,
                        prog.arrival_s,
                        now_s,
                        s,
                        stages=prog.stated_stages,
                        tier_share=tier.stage_deadline_share,
                    )
                at, matched = self.tracker.stage_deadline_at_s(
                    prog.program_id,
                    LLM_STAGE,
                    prog.arrival_s,
                    prog.deadline_at_s - prog.arrival_s,
                    now_s,
                    fallback_at_s=fallback,
                )
                prog.stage_deadline_at_s = at
                if matched:
                    self.matched_stages += 1
                else:
                    self.default_stages += 1
        if s == prog.stage:
            prog.stage_open_calls += 1
        if prog.deadline_at_s is None or prog.stage_deadline_at_s is None:
            return None
        return min(prog.deadline_at_s, max(now_s, prog.stage_deadline_at_s))

    def call_ended(
        self,
        prog: ProgramRun,
        stage: int | None,
        *,
        ok: bool,
        input_tokens: int,
        output_tokens: int,
        now_s: float,
    ) -> bool:
        """A call completed (``ok``) or failed; True when it ended the program.

        The program ends with the last call of its stated last stage; a failed call fails the program
        (as a rejected call does in the simulator), which then is not stored as a pattern.
        """
        s = stage if stage is not None else prog.stage
        if s == prog.stage:
            prog.stage_open_calls = max(0, prog.stage_open_calls - 1)
            if ok:
                prog.stage_input_tokens += input_tokens
                prog.stage_output_tokens += output_tokens
                prog.stage_calls += 1
                prog.stage_end_s = max(prog.stage_end_s, now_s)
        if not ok:
            prog.failed = True
        stated = prog.stated_stages
        if stated is not None and s + 1 >= stated and prog.stage_open_calls == 0:
            self.finish(prog, now_s, store=not prog.failed)
            return True
        return False

    def finish(self, prog: ProgramRun, now_s: float, *, store: bool) -> None:
        """The program ended: a completed one becomes a pattern for later programs."""
        self._flush(prog)
        self.tracker.finish(prog.program_id, now_s, store=store and prog.stages_recorded > 0)
        self.programs.pop(prog.program_id, None)

    def _flush(self, prog: ProgramRun) -> None:
        if prog.stage_calls == 0:
            return
        self.tracker.stage_finished(
            prog.program_id,
            Stage(
                LLM_STAGE,
                output_tokens=float(prog.stage_output_tokens),
                input_tokens=float(prog.stage_input_tokens),
                duration_s=max(0.0, prog.stage_end_s - prog.stage_start_s),
                calls=prog.stage_calls,
            ),
        )
        prog.stages_recorded += 1
        prog.stage_input_tokens = prog.stage_output_tokens = prog.stage_calls = 0


def patterns_to_json(history: PatternHistory) -> list[str]:
    """The stored pattern graphs, each as base64 of its compact byte form (for the checkpoint)."""
    return [base64.b64encode(history.graphs[i]).decode("ascii") for i in range(len(history))]


def patterns_from_json(raw: list[Any], history: PatternHistory, now_s: float = 0.0) -> None:
    """Restore graphs written by :func:`patterns_to_json`; older checkpoints' per-call stage rows
    (``{"stages": [[stage, start_s, end_s, input, output], ...]}``) are summed into stages."""
    for item in raw:
        if isinstance(item, str):
            history.add(PatternGraph.from_bytes(base64.b64decode(item, validate=True)), now_s)
        elif isinstance(item, dict):
            graph = _legacy_graph(item)
            if graph is not None:
                history.add(graph, now_s)
        else:
            raise ValueError("history.patterns entries must be strings")


def _legacy_graph(item: dict[str, Any]) -> PatternGraph | None:
    rows = item.get("stages") or []
    if not isinstance(rows, list):
        raise ValueError("history.patterns[].stages must be a list")
    by_stage: dict[int, list[list[float]]] = {}
    for r in rows:
        by_stage.setdefault(int(r[0]), []).append([float(x) for x in r[1:5]])
    stages = []
    for s in sorted(by_stage):
        calls = by_stage[s]
        duration = max(c[1] for c in calls) - min(c[0] for c in calls)
        stages.append(
            Stage(
                LLM_STAGE, sum(c[3] for c in calls), sum(c[2] for c in calls), max(0.0, duration), len(calls)
            )
        )
    return PatternGraph(tuple(stages)) if stages else None
