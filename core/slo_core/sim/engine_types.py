"""The engine simulator's limits (EngineConfig) and what one step produced (StepOutcome)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from slo_core.sim.request import SimRequest


class EngineConfig(BaseModel):
    """vLLM engine limits of one replica (defaults: vLLM v1 serving on an 80 GB GPU)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_seqs: int = Field(256, ge=1, description="most requests running at once (sequences)")
    max_num_batched_tokens: int = Field(8192, ge=1, description="token budget of one step (tokens)")
    block_size: int = Field(16, ge=1, description="tokens per KV-cache block (tokens)")
    kv_cache_tokens: int | None = Field(
        None, ge=1, description="KV-cache capacity (tokens); None: the performance profile's"
    )
    max_model_len: int | None = Field(
        None, ge=2, description="context length served (tokens); None: the performance profile's"
    )
    idle_poll_s: float = Field(
        0.01, gt=0, description="when requests wait but none can be scheduled, poll again after (s)"
    )


@dataclass(slots=True)
class StepOutcome:
    """The token events of one completed step.

    ``emitted``: every request that received one new output token at ``end_s`` (its newest entry
    of ``token_times`` is ``end_s``; ``generated`` is its token count): requests whose prefill
    completed first, then the decodes. ``finished``: those of them that reached their length and
    left the engine (state FINISHED, blocks freed).
    """

    end_s: float
    emitted: list[SimRequest] = field(default_factory=list)
    finished: list[SimRequest] = field(default_factory=list)
