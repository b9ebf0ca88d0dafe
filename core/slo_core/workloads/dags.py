"""Compound-request DAGs: stages of parallel calls ``(input_tokens, output_tokens)``.

Three sources, all seeded:

* ``tot``: the Tree-of-Thoughts Game-of-24 BFS log (100 real tasks). Each BFS step is two stages:
  one *propose* call per kept candidate (``ys``), then one *value* call per proposal (``new_ys``);
  the fan-outs are the log's. Per-call lengths are estimated from the text (about 4 characters per
  token, plus the prompt template) and scaled so that each task's totals equal the tokens its
  ``usage_so_far`` grew by (the log's real prompt and completion usage).
* ``deep-research``: a generator of 4 or 6 sequential stages with a fan-out of 1–3 calls per
  stage; call lengths are log-normal around JITServe Table 2's deep-research compound totals
  (about 12k input and 3.5k output tokens per program).
* a JSONL file: lines ``{"request_id": ..., "stages": [[[input_tokens, output_tokens], ...], ...]}``.
"""

from __future__ import annotations

import gzip
import json
import random
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from slo_core import data
from slo_core.workloads.jobs import Stages

DAG_SOURCES = ("deep-research", "tot", "mixed")

# ToT prompt templates (propose: few-shot of one example; value: many examples) in characters
_PROPOSE_TEMPLATE_CHARS = 700
_VALUE_TEMPLATE_CHARS = 2600
_CHARS_PER_TOKEN = 4.0


class DeepResearchParams(BaseModel):
    """The deep-research-style generator (token counts per call)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage_counts: tuple[int, ...] = Field((4, 6), description="possible numbers of sequential stages")
    min_fan_out: int = Field(1, ge=1, description="fewest parallel calls in a stage (calls)")
    max_fan_out: int = Field(3, ge=1, description="most parallel calls in a stage (calls)")
    input_median_tokens: float = Field(1000.0, gt=0, description="median input length of a call (tokens)")
    output_median_tokens: float = Field(300.0, gt=0, description="median output length of a call (tokens)")
    sigma: float = Field(0.6, ge=0, description="log-normal spread of call lengths (natural log)")
    max_input_tokens: int = Field(7000, ge=1, description="cap on a call's input (tokens)")
    max_output_tokens: int = Field(2048, ge=1, description="cap on a call's output (tokens)")


def deep_research_dag(rng: random.Random, params: DeepResearchParams | None = None) -> Stages:
    """One program: ``stage_counts`` sequential stages, each of ``min..max_fan_out`` parallel calls."""
    p = params or DeepResearchParams()
    stages = []
    for _ in range(rng.choice(p.stage_counts)):
        calls = []
        for _ in range(rng.randint(p.min_fan_out, max(p.min_fan_out, p.max_fan_out))):
            inp = int(rng.lognormvariate(0.0, p.sigma) * p.input_median_tokens)
            out = int(rng.lognormvariate(0.0, p.sigma) * p.output_median_tokens)
            calls.append((min(max(16, inp), p.max_input_tokens), min(max(4, out), p.max_output_tokens)))
        stages.append(tuple(calls))
    return tuple(stages)


def _scaled(estimates: list[float], total: float) -> list[int]:
    s = sum(estimates)
    factor = total / s if s > 0 and total > 0 else 1.0
    return [max(1, round(e * factor)) for e in estimates]


@lru_cache(maxsize=1)
def tot_dags() -> tuple[Stages, ...]:
    """The 100 Tree-of-Thoughts tasks of the shipped log as DAGs (propose / value stages per step)."""
    with gzip.open(data.path("tot_game24_bfs_log.json.gz"), "rt", encoding="utf-8") as fh:
        tasks = json.load(fh)
    dags: list[Stages] = []
    prev_prompt = prev_completion = 0
    for task in tasks:
        usage = task["usage_so_far"]
        d_prompt = usage["prompt_tokens"] - prev_prompt
        d_completion = usage["completion_tokens"] - prev_completion
        prev_prompt, prev_completion = usage["prompt_tokens"], usage["completion_tokens"]
        shape: list[list[tuple[float, float]]] = []
        for step in task["steps"]:
            x = step["x"]
            ys = step["ys"]
            new_ys = step["new_ys"]
            propose: list[tuple[float, float]] = []
            for y in ys:
                children = [n for n in new_ys if n.startswith(y)]
                out_chars = sum(len(n) - len(y) for n in children) or 40
                propose.append((float(_PROPOSE_TEMPLATE_CHARS + len(x) + len(y)), float(out_chars)))
            value = [(float(_VALUE_TEMPLATE_CHARS + len(n)), 3 * 60.0) for n in new_ys]
            shape.append(propose)
            if value:
                shape.append(value)
        flat = [c for stage in shape for c in stage]
        ins = _scaled([c[0] / _CHARS_PER_TOKEN for c in flat], d_prompt)
        outs = _scaled([c[1] / _CHARS_PER_TOKEN for c in flat], d_completion)
        stages: list[tuple[tuple[int, int], ...]] = []
        k = 0
        for stage in shape:
            stages.append(tuple((ins[k + j], outs[k + j]) for j in range(len(stage))))
            k += len(stage)
        dags.append(tuple(stages))
    return tuple(dags)


def read_dags_jsonl(path: str | Path) -> list[tuple[str, Stages]]:
    """Load ``(request_id, stages)`` programs from a JSONL file, with errors that name the line."""
    out: list[tuple[str, Stages]] = []
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"DAG file {str(p)!r} does not exist")
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                stages = tuple(tuple((int(call[0]), int(call[1])) for call in stage) for stage in d["stages"])
                if not stages or any(not s for s in stages):
                    raise ValueError("every program needs at least one stage and every stage a call")
                if any(i < 1 or o < 1 for s in stages for i, o in s):
                    raise ValueError("input and output tokens must be >= 1")
                out.append((str(d.get("request_id", f"dag{lineno}")), stages))
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise ValueError(
                    f'{p}:{lineno}: expected {{"request_id": ..., "stages": [[[in, out], ...], ...]}} ({exc})'
                ) from None
    if not out:
        raise ValueError(f"DAG file {str(p)!r} has no programs")
    return out


class DagSource:
    """Draws program DAGs from a named source or a JSONL file."""

    def __init__(self, source: str, params: DeepResearchParams | None = None) -> None:
        self.source = source
        self.params = params or DeepResearchParams()
        self._pool: list[Stages] | None = None
        if source == "tot":
            self._pool = list(tot_dags())
        elif source not in DAG_SOURCES:
            self._pool = [stages for _, stages in read_dags_jsonl(source)]

    def draw(self, rng: random.Random) -> Stages:
        if self._pool is not None:
            return self._pool[rng.randrange(len(self._pool))]
        if self.source == "mixed" and rng.random() < 0.5:
            return tot_dags()[rng.randrange(len(tot_dags()))]
        return deep_research_dag(rng, self.params)
