"""Operator settings: from ``SLOFLEET_OPERATOR_*`` environment variables, overridden by command-line flags.

Nothing here is secret; :meth:`OperatorSettings.describe` is what the operator logs at startup.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from slo_core.wire.keyring import MIN_PERIOD_S

DEFAULT_IMAGE = "ghcr.io/slofleet/slofleet:0.1.0"
DEFAULT_ENGINE_IMAGE = "vllm/vllm-openai:v0.32.0"  # the scheduler plugin is pinned to vLLM 0.32
ENV_PREFIX = "SLOFLEET_OPERATOR_"


class OperatorSettings(BaseModel):
    """Everything the operator needs besides the objects it watches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespaces: tuple[str, ...] = Field(
        default=(), description="namespaces to watch; empty means every namespace (cluster-wide)"
    )
    image: str = Field(
        default=DEFAULT_IMAGE,
        description="the slofleet image of sidecars and the plugin-copying init container (a ModelDeployment "
        "may override the sidecar's)",
    )
    engine_image: str = Field(
        default=DEFAULT_ENGINE_IMAGE,
        description="the vLLM image of engine pods (a ModelDeployment may override)",
    )
    image_pull_policy: str = Field(
        default="IfNotPresent", description="pull policy of the slofleet containers"
    )
    field_manager: str = Field(default="slofleet-operator", description="server-side apply field manager")
    peering: str | None = Field(
        default=None, description="kopf peering object for leader election; None runs standalone"
    )
    priority: int = Field(
        default_factory=lambda: random.randint(1, 1_000_000),
        description="peering priority; distinct per replica so exactly one replica is active",
    )
    liveness_port: int | None = Field(
        default=8080, description="port of the liveness endpoint (/healthz); None disables it"
    )
    sidecar_http_port: int = Field(default=8000, description="sidecar HTTP port (the pod's front door)")
    sidecar_grpc_port: int = Field(
        default=50051, description="sidecar gRPC port (state stream for the router)"
    )
    sidecar_metrics_port: int = Field(
        default=9464,
        description="the sidecar's /metrics port (port name 'metrics'; it names tenants): scraped by the "
        "chart's PodMonitor, absent from the pods' Service, reached only by Prometheus (NetworkPolicy)",
    )
    sidecar_calibration_port: int = Field(
        default=9465,
        description="the sidecar's port for its peers' bound-calibration exchange (port name 'calibration'; "
        "in the '<name>-peers' headless Service only, reached only by engine pods (NetworkPolicy), calls "
        "authenticated with the tag key)",
    )
    engine_port: int = Field(default=8001, description="vLLM's OpenAI server port inside the pod")
    plugin_metrics_port: int = Field(
        default=9400,
        description="the vLLM scheduler plugin's Prometheus port (slofleet_plugin_degraded: 1 while it "
        "falls back to vLLM's stock order); the chart's PodMonitor scrapes it",
    )
    drain_s: int = Field(
        default=120,
        description="seconds a terminating pod gets to drain in-flight requests before it is killed",
    )
    request_timeout_s: float = Field(default=30.0, description="timeout of every Kubernetes API call")
    tag_key_secret: str | None = Field(
        default=None,
        description="Secret (key 'keys': current and previous key) the sidecar signs engine SLO tags with, "
        "the vLLM plugin verifies them by and every gRPC call to a sidecar is authenticated with; unsigned "
        "or forged tags are scheduled best-effort. None: tags unsigned, gRPC open",
    )
    tag_key_namespace: str | None = Field(
        default=None,
        description="namespace of the tag-key Secret the operator rotates (the chart's release namespace); "
        "the copies in the namespaces it manages follow it. None: no rotation",
    )
    tag_key_rotation_s: float = Field(
        default=86400.0,
        description="rotate the tag key once the current one is this old (seconds; 0: never; at least "
        f"{int(MIN_PERIOD_S)} s, so a key outlives every signature made with it)",
    )
    plugin_check_s: float = Field(
        default=30.0,
        ge=0,
        description="how often the operator reads each engine pod's plugin-metrics port and reports a "
        "plugin that fell back to vLLM's stock order (condition PluginDegraded, an Event); 0: never",
    )
    tag_key_check_s: float = Field(
        default=30.0, gt=0, description="how often the operator checks the tag key's age (seconds)"
    )
    scale_period_s: float = Field(
        default=15.0,
        gt=0,
        description="seconds between two decisions of the scaling loop for each ModelDeployment whose "
        "replicas.max exceeds replicas.min (the HPA's sync period)",
    )
    metrics_port: int | None = Field(
        default=None, description="port of the operator's /metrics (scaling decisions); None: not served"
    )
    router_policy: str | None = Field(
        default=None,
        description="SLOPolicy the router in front follows; ModelDeployments whose policy lacks one of "
        "its tiers are reported (condition RouterCompatible, a Warning Event)",
    )
    router_namespace: str | None = Field(
        default=None, description="namespace of the router's SLOPolicy and of the ModelDeployments it serves"
    )

    @field_validator("tag_key_rotation_s")
    @classmethod
    def _period_covers_signatures(cls, value: float) -> float:
        if value != 0 and value < MIN_PERIOD_S:
            raise ValueError(f"tag_key_rotation_s must be 0 (never) or at least {int(MIN_PERIOD_S)} s")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> OperatorSettings:
        """Settings from ``SLOFLEET_OPERATOR_<FIELD>`` variables (namespaces comma-separated), then overrides.

        ``ValueError`` (pydantic's) names the field when a value does not parse.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is None or raw == "":
                continue
            if name == "namespaces":
                values[name] = tuple(ns.strip() for ns in raw.split(",") if ns.strip())
            else:
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)

    def describe(self) -> str:
        """A one-line summary for the startup log (no secrets exist in settings)."""
        scope = ",".join(self.namespaces) if self.namespaces else "cluster-wide"
        peering = f"peering={self.peering} priority={self.priority}" if self.peering else "standalone"
        return f"scope={scope} image={self.image} {peering} field_manager={self.field_manager}"
