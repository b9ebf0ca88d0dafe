"""The request analyzer's pattern graphs (JITServe §4.1): compound sub-deadlines D_s = φ(s)·D from the
most similar historical program (output-length bounds live in :mod:`slo_sidecar.estimators`).

φ(s) = t_≤s / t_total of the best-matching completed program, matched by a Gaussian kernel over the
output lengths of the stages this program has finished so far (programs with a different number of
stages, when the client states it, are pruned). Without history it falls back to the tier's
``stage_deadline_share`` (cumulative), then to (s+1)/stages, then to the whole deadline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from slo_core.slo import SLOTier


@dataclass
class StageRecord:
    """One finished call of a compound program (offsets in seconds from the program's arrival)."""

    stage: int
    start_s: float
    end_s: float
    input_tokens: int
    output_tokens: int


@dataclass
class ProgramPattern:
    """A program's stages as seen so far (a primitive pattern graph: a chain of LLM calls)."""

    program_id: str
    stages: list[StageRecord] = field(default_factory=list)
    stated_stages: int | None = None

    def total_s(self) -> float:
        return max((s.end_s for s in self.stages), default=0.0)

    def to_json(self) -> dict[str, object]:
        return {
            "program_id": self.program_id,
            "stated_stages": self.stated_stages,
            "stages": [[s.stage, s.start_s, s.end_s, s.input_tokens, s.output_tokens] for s in self.stages],
        }

    @staticmethod
    def from_json(raw: dict[str, object]) -> ProgramPattern:
        rows = raw.get("stages") or []
        assert isinstance(rows, list)
        stated = raw.get("stated_stages")
        return ProgramPattern(
            program_id=str(raw["program_id"]),
            stated_stages=int(stated) if isinstance(stated, int) else None,
            stages=[StageRecord(int(r[0]), float(r[1]), float(r[2]), int(r[3]), int(r[4])) for r in rows],
        )


def _similarity(done: Sequence[StageRecord], candidate: ProgramPattern, width_tokens: float = 200.0) -> float:
    """Gaussian kernel over the output lengths of the stages both have (1 when nothing is known)."""
    by_stage = {s.stage: s for s in candidate.stages}
    sim = 1.0
    for s in done:
        other = by_stage.get(s.stage)
        if other is None:
            return 0.0
        sim *= math.exp(-(((s.output_tokens - other.output_tokens) / width_tokens) ** 2))
    return sim


def stage_share(
    stage: int,
    done: Sequence[StageRecord],
    history: Sequence[ProgramPattern],
    tier: SLOTier,
    stated_stages: int | None,
) -> float:
    """φ(stage): the share of the program deadline by which ``stage`` should finish, in (0, 1]."""
    best, best_sim = None, 0.0
    for cand in history:
        if len(cand.stages) <= stage or (stated_stages is not None and len(cand.stages) != stated_stages):
            continue
        sim = _similarity(done, cand)
        if sim > best_sim:
            best, best_sim = cand, sim
    if best is not None and best.total_s() > 0:
        end = max(s.end_s for s in best.stages if s.stage <= stage)
        return min(1.0, max(1e-3, end / best.total_s()))
    share = tier.stage_deadline_share
    if share:
        return min(1.0, sum(share[: stage + 1]))
    if stated_stages:
        return min(1.0, (stage + 1) / stated_stages)
    return 1.0
