"""What a local fleet is made of: engine groups, the sidecars' mode, the router, the policy file."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_PROFILE = "h100-llama3-8b-tp1"


class EngineGroup(BaseModel):
    """``count`` identical engines: simulated (engine-sim with a GPU profile) or one existing vLLM URL."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(1, ge=1, le=64, description="number of engines in this group")
    profile: str = Field(DEFAULT_PROFILE, description="performance profile of the simulated GPU and model")
    model: str | None = Field(None, description="served model name (default: the profile's model)")
    speedup: float = Field(
        1.0, gt=0, le=1000, description="simulated GPU speed relative to the profile (0.1 = ten times slower)"
    )
    max_num_seqs: int = Field(256, ge=1, description="most requests running at once in one engine")
    url: str | None = Field(
        None, description="an already running vLLM server (http://host:port); no engine-sim is started"
    )

    @model_validator(mode="after")
    def _one_url_one_engine(self) -> EngineGroup:
        if self.url is not None and self.count != 1:
            raise ValueError("an engine group with a url is one engine: set count: 1 or drop the url")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        return self


class FleetSpec(BaseModel):
    """A whole local fleet; every field has a working default."""

    model_config = ConfigDict(extra="forbid")

    engines: list[EngineGroup] = Field(default_factory=lambda: [EngineGroup(count=2)], min_length=1)
    host: str = Field("127.0.0.1", description="address the router listens on")
    port: int = Field(8000, ge=0, le=65535, description="router port (0: any free port)")
    policy_file: Path | None = Field(
        None, description="SLOPolicy YAML (default: the chat/agent example shipped with slofleet)"
    )
    engine_policy: str | None = Field(
        None, description="override the SLOPolicy's engine scheduling policy (e.g. fcfs for a stock fleet)"
    )
    routing_policy: str | None = Field(
        None, description="override the SLOPolicy's routing policy (e.g. round-robin for a stock fleet)"
    )
    mode: Literal["engine", "proxy"] = Field(
        "engine",
        description="engine: the router sends straight to each engine (signed SLO tags), whose policy runs "
        "inside it with bounds from its sidecar, as the vLLM plugin does; proxy: the sidecar holds and "
        "releases requests in front of a stock engine",
    )
    keys_file: Path | None = Field(None, description="API keys per tenant; without it the router is open")
    workdir: Path | None = Field(
        None, description="logs, endpoint file and sidecar state (default: a temp dir)"
    )

    @property
    def engine_count(self) -> int:
        return sum(g.count for g in self.engines)


def load_fleet_spec(path: str | Path) -> FleetSpec:
    """Read a fleet YAML file; errors name the field and what to change."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    try:
        return FleetSpec.model_validate(doc)
    except ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors()]
        raise ValueError(f"{path}: invalid fleet config:\n  " + "\n  ".join(problems)) from None
