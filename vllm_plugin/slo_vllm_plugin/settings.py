"""Plugin settings, read once from the environment of the vLLM EngineCore process.

``SLOFLEET_POLICY``          engine policy name from the registry (default ``gmax``; falls back to
                             ``fcfs`` with a log line when that name is not available)
``SLOFLEET_POLICY_PARAMS``   JSON object of the policy's parameters
``SLOFLEET_OBJECTIVE``       JSON object of the SLOPolicy's objective (slo_core.objective.Objective: goodput,
                             gain weights, fairness) that SLO-aware policies maximize; unset: their defaults
``SLOFLEET_ANALYZER``        host:port of the sidecar's gRPC analyzer (bounds and priorities)
``SLOFLEET_ENGINE_TRACE``    path of a JSONL engine-side trace (admissions, preemptions, finishes)
``SLOFLEET_PROFILE``         performance-model profile for policies that need one (e.g. h100/llama-3-8b)
``SLOFLEET_STALE_AFTER_S``   analyzer data older than this counts as unreachable (default 5 s)
``SLOFLEET_METRICS_PORT``    serve the plugin's Prometheus metrics on this port (optional)
``SLOFLEET_REPORT_INTERVAL_S`` engine mode: at most one engine report to the analyzer per interval
                             (default 0.05 s; each report is answered with the live requests' bounds)
``SLOFLEET_TAG_KEY_FILE``    keys (one a line) the sidecar signs SLO tags with; when set, a request whose
                           tags are unsigned, forged or stale is scheduled best-effort (and counted)
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slo_core.objective import Objective
from slo_core.policies.base import EnginePolicy
from slo_core.policies.registry import make_engine_policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginSettings:
    policy: str = "gmax"
    policy_params: dict[str, Any] = field(default_factory=dict)
    objective: dict[str, Any] | None = None
    analyzer: str | None = None
    trace_path: str | None = None
    profile: str | None = None
    stale_after_s: float = 5.0
    metrics_port: int | None = None
    tag_key_file: str | None = None
    report_interval_s: float = 0.05

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PluginSettings:
        env = os.environ if env is None else env
        raw_params = env.get("SLOFLEET_POLICY_PARAMS", "").strip()
        try:
            params = json.loads(raw_params) if raw_params else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"SLOFLEET_POLICY_PARAMS is not valid JSON: {exc}") from None
        if not isinstance(params, dict):
            raise ValueError('SLOFLEET_POLICY_PARAMS must be a JSON object, e.g. {"frame_steps": 50}')
        raw_objective = env.get("SLOFLEET_OBJECTIVE", "").strip()
        try:
            objective = json.loads(raw_objective) if raw_objective else None
        except json.JSONDecodeError as exc:
            raise ValueError(f"SLOFLEET_OBJECTIVE is not valid JSON: {exc}") from None
        if objective is not None and not isinstance(objective, dict):
            raise ValueError('SLOFLEET_OBJECTIVE must be a JSON object, e.g. {"goodput": "token"}')
        port = env.get("SLOFLEET_METRICS_PORT")
        return cls(
            policy=env.get("SLOFLEET_POLICY", "gmax").strip() or "gmax",
            policy_params=params,
            objective=objective,
            analyzer=env.get("SLOFLEET_ANALYZER") or None,
            trace_path=env.get("SLOFLEET_ENGINE_TRACE") or None,
            profile=env.get("SLOFLEET_PROFILE") or None,
            stale_after_s=float(env.get("SLOFLEET_STALE_AFTER_S", "5")),
            metrics_port=int(port) if port else None,
            tag_key_file=env.get("SLOFLEET_TAG_KEY_FILE") or None,
            report_interval_s=float(env.get("SLOFLEET_REPORT_INTERVAL_S", "0.05")),
        )


def load_objective(settings: PluginSettings) -> Objective | None:
    """The SLOPolicy's objective (ValueError when it does not validate)."""
    return Objective.model_validate(settings.objective) if settings.objective is not None else None


def load_policy(settings: PluginSettings) -> EnginePolicy:
    """The configured policy, maximizing the SLOPolicy's objective (fcfs, logged, if it cannot be built)."""
    try:
        return make_engine_policy(settings.policy, settings.policy_params, load_objective(settings))
    except (ValueError, ImportError, TypeError) as exc:
        log.error("slofleet: cannot build policy %r (%s); using fcfs", settings.policy, exc)
        return make_engine_policy("fcfs")
