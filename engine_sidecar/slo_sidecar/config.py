"""The sidecar's runtime config: the SLOPolicy it serves (tiers, admission, goodput, policy) plus its knobs.

The policy part comes from a mounted file rendered from the SLOPolicy (the ``kind: SLOPolicy`` object
as ``slo_core.crd.loads.render_policy_config`` writes it). It is parsed with ``load_policy`` and
validated completely (tiers resolvable, policy name known and its parameters accepted) before it
replaces the running config: a bad file never takes effect. Process knobs (capacity, limits) are
command-line flags (:class:`SidecarKnobs`).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from slo_core.objective import Objective
from slo_core.policies.base import EnginePolicy
from slo_core.policies.registry import make_engine_policy
from slo_core.runtime_policy import RuntimePolicy
from slo_core.slo import PriorityClass, RequestKind, SLOTier

log = logging.getLogger(__name__)


class SidecarKnobs(BaseModel):
    """Process settings of one sidecar (command-line flags), with units."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: str = Field(
        "proxy", pattern="^(proxy|engine)$", description="proxy: hold and release; engine: tags"
    )
    max_running: int = Field(64, ge=1, description="proxy mode: most requests in the engine at once")
    max_queue: int = Field(1024, ge=1, description="most requests waiting in the sidecar (503 beyond)")
    tier_max_inflight: int | None = Field(None, ge=1, description="per-tier concurrent requests (429 beyond)")
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="longest prompt accepted (tokens); default: the model's context"
    )
    max_context_tokens: int = Field(
        32768, ge=1, description="prompt plus max_tokens limit when the engine reports none (tokens)"
    )
    default_max_tokens: int | None = Field(
        None, ge=1, description="max_tokens when the client gives none; default: the context left (tokens)"
    )
    max_body_bytes: int = Field(4 << 20, ge=1, description="largest request body accepted (bytes)")
    max_header_bytes: int = Field(32 << 10, ge=1, description="largest request header block (bytes)")
    max_json_depth: int = Field(32, ge=1, description="deepest JSON nesting accepted (levels)")
    refine_every_tokens: int = Field(50, ge=1, description="re-estimate the length bound every N tokens")
    frame_s: float = Field(0.02, gt=0, description="proxy mode: scheduling frame length (seconds)")
    kv_cache_tokens: int = Field(262144, ge=1, description="engine KV capacity shown to the policy (tokens)")
    max_batched_tokens: int = Field(8192, ge=1, description="engine token budget per step (tokens)")
    engine_priority: bool = Field(
        False, description="send vLLM 'priority' (engine runs --scheduling-policy priority)"
    )
    request_timeout_s: float = Field(600.0, gt=0, description="longest a request may take in total (seconds)")
    upstream_read_timeout_s: float = Field(
        60.0, gt=0, description="longest silence from the engine (seconds)"
    )
    checkpoint_every_s: float = Field(30.0, gt=0, description="state checkpoint interval (seconds)")
    history_size: int = Field(20000, ge=1, description="completed-request records kept")
    drain_timeout_s: float = Field(
        30.0, ge=0, description="SIGTERM: longest wait for in-flight requests (seconds)"
    )
    model_name: str = Field("", description="model name when the engine reports none")
    pod: str = Field("", description="pod identity in state snapshots (default host:port)")
    profile: str = Field("", description="performance profile name reported to routers")
    step_time_correction: float = Field(
        1.0,
        gt=0,
        le=1e6,
        description="how many times longer the engine's steps take than the profile predicts, reported to "
        "routers, which scale the profile by it (engine-sim at --speedup X: 1/X; 1 on the profiled GPU)",
    )
    calibration: bool = Field(
        True, description="learn an online calibration of the QRF bounds from served traffic (and export it)"
    )
    signed_requests: bool = Field(
        False,
        description="take a request's SLO, tier and tenant only from the router: requests without its "
        "signature (made with --tag-key-file) get 403 (the operator turns this on with tag signing)",
    )
    calibration_apply: bool = Field(
        False,
        description="issue the calibrated bounds (they may tighten as tokens stream); off: the forest's "
        "bounds, as the simulator's default analyzer (bench/results/predictor_shift/README.md says why)",
    )
    calibration_strata: str = Field(
        "kind", pattern=r"^(kind|tenant|kind\+tenant)$", description="calibration stratum per model"
    )
    calibration_window: int = Field(200, ge=10, le=100000, description="recent completions per stratum")
    calibration_peers: str = Field(
        "", description="peer sidecar URLs to share calibration with (comma-separated; dns+http://svc:port)"
    )
    calibration_sync_s: float = Field(10.0, gt=0, description="peer calibration fetch interval (seconds)")
    history_prompt_text: bool = Field(
        False, description="keep prompt text in history rows (retraining with text features; opt-in)"
    )


@dataclass(frozen=True)
class PolicyConfig:
    """The validated SLO half of the config (what hot reload replaces)."""

    tiers: dict[str, SLOTier]
    default_tier: str
    max_wait_s: float = 30.0
    objective: Objective = field(default_factory=Objective)
    policy_name: str = "fcfs"
    policy_params: dict[str, Any] = field(default_factory=dict)
    digest: str = ""

    def make_policy(self) -> EnginePolicy:
        return make_engine_policy(self.policy_name, self.policy_params, self.objective)

    @staticmethod
    def from_runtime(rp: RuntimePolicy, digest: str = "") -> PolicyConfig:
        """The sidecar's half of the one :class:`RuntimePolicy` (``SLOPolicySpec.runtime()``)."""
        return PolicyConfig(
            tiers=dict(rp.tiers),
            default_tier=rp.default_tier,
            max_wait_s=rp.admission.max_wait_s,
            objective=rp.objective,
            policy_name=rp.scheduling.name,
            policy_params=rp.scheduling.kwargs(),
            digest=digest,
        )

    @staticmethod
    def default() -> PolicyConfig:
        """One latency tier and FCFS: what a sidecar runs without a policy file."""
        tier = SLOTier("standard", RequestKind.LATENCY, PriorityClass("default", 1.0), ttft_s=5.0, tbt_s=0.5)
        return PolicyConfig(tiers={"standard": tier}, default_tier="standard")


class ConfigError(ValueError):
    """The policy file cannot be used; the message says what to fix."""


def _load_spec(path: Path) -> Any:
    """The SLOPolicySpec of the file the operator renders (``render_policy_config``), fully validated."""
    from slo_core.crd.loads import load_policy

    return load_policy(path).spec


def parse_policy_file(path: Path) -> PolicyConfig:
    """Read and fully validate ``path``; raises :class:`ConfigError` saying what is wrong."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        spec = _load_spec(path)
        cfg = PolicyConfig.from_runtime(spec.runtime(), digest=hashlib.sha256(raw).hexdigest()[:16])
        cfg.make_policy()  # unknown policy names and parameters fail here, not at the first request
    except ConfigError:
        raise
    except Exception as exc:  # pydantic, YAML, policy factories: all mean "this file is not usable"
        message = _first_line(exc)
        raise ConfigError(message if str(path) in message else f"{path}: {message}") from None
    return cfg


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return " ".join(text.splitlines()[:4]) if text else type(exc).__name__
