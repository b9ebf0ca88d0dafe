"""The engine simulator's limits (EngineConfig) and what one step produced (StepOutcome)."""

from __future__ import annotations

import math
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


@dataclass(frozen=True, slots=True)
class DecisionCost:
    """The engine-process CPU time a policy decision takes, charged to the step it is made for: in a
    pod the vLLM plugin decides on the engine's step loop (a synchronous scheduler), between two GPU
    steps, so a decision's seconds delay that step's end. ``base_s`` + ``per_request_s`` x the requests
    it reads (waiting and running). Charged for every decision the plugin would make: not for one the
    engines leave out (quiet, or deferred over a deep queue), nor for a FIFO policy's (never asked)."""

    base_s: float = 0.0
    per_request_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("base_s", "per_request_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"DecisionCost.{name} must be a finite number >= 0, not {value!r}")

    def seconds(self, n_requests: int) -> float:
        """The CPU seconds of a decision over ``n_requests`` requests."""
        return self.base_s + self.per_request_s * n_requests


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
