"""Engine-sim settings (one pydantic model shared by the CLI and the in-process server) and profiles."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from slo_core.objective import Objective
from slo_core.perf import PerfProfile, load_profile

DEFAULT_PROFILE = "h100-llama3-8b-tp1"


class EngineSimSettings(BaseModel):
    """Everything that shapes one simulated engine server."""

    model_config = ConfigDict(extra="forbid")

    profile: str = Field(
        DEFAULT_PROFILE, description="performance profile: a shipped name (slo_core.perf) or a JSON path"
    )
    model: str | None = Field(None, description="served model name; None: the profile's model")
    speedup: float = Field(1.0, gt=0, description="run X times faster than the GPU (step times divided by X)")
    policy: str = Field("fcfs", description="engine policy name from slo_core.policies.registry")
    policy_params: dict[str, Any] = Field(default_factory=dict, description="the policy's parameters")
    objective: Objective | None = Field(
        None, description="what SLO-aware policies maximize (the SLOPolicy's); None: each policy's default"
    )
    scheduling_policy: str = Field(
        "fcfs", pattern="^(fcfs|priority)$", description="vLLM's --scheduling-policy: priority orders waiting"
    )
    max_num_seqs: int = Field(256, ge=1, description="most requests running at once (sequences)")
    max_num_batched_tokens: int = Field(8192, ge=1, description="token budget of one step (tokens)")
    block_size: int = Field(16, ge=1, description="tokens per KV-cache block (tokens)")
    kv_cache_tokens: int | None = Field(None, ge=1, description="KV capacity (tokens); None: the profile's")
    max_model_len: int | None = Field(None, ge=2, description="context length (tokens); None: the profile's")
    analyzer: str | None = Field(None, description="host:port of a sidecar's gRPC Analyzer for bounds")
    analyzer_interval_s: float = Field(0.2, gt=0, description="analyzer refresh period (s)")
    stale_after_s: float = Field(5.0, gt=0, description="analyzer data older than this: stock order (s)")
    seed: int = Field(0, description="seed of the policy's random generator")
    tag_key_file: str | None = Field(
        None,
        description="the tag-key Secret's file (followed live), as the vLLM plugin's SLOFLEET_TAG_KEY_FILE: "
        "SLO tags not signed with it are scheduled best-effort (counted), analyzer calls carry a token",
    )
    report_interval_s: float = Field(
        0.05, gt=0, description="engine mode: at most one engine report to the analyzer per interval (s)"
    )


def resolve_profile(name: str) -> PerfProfile:
    """The named shipped profile (or profile file); ValueError lists the shipped names."""
    return load_profile(name)
