"""Endpoint discovery: a static YAML file (local fleets), re-read when it changes.

File format::

    endpoints:
      - id: pod-a                        # unique
        url: http://127.0.0.1:8101       # the pod's sidecar (proxy mode) or engine (engine mode)
        grpc: 127.0.0.1:9101             # the sidecar's gRPC state stream (optional)
        mode: proxy                      # proxy (default) | engine: see EndpointSpec
        models: [llama-3.1-8b]
        max_context_tokens: 8192
        gpu_class: h100
        lora_adapters: []
        profile: h100/llama-3-8b

Pods appear and leave without a restart: :func:`watch_static_file` applies the difference to the
router's endpoint table (keeping the state and circuit breaker of endpoints that stay).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from slo_router.endpoints import EndpointSpec, EndpointState

log = logging.getLogger(__name__)

_FIELDS = {
    "id",
    "url",
    "grpc",
    "models",
    "max_context_tokens",
    "gpu_class",
    "lora_adapters",
    "profile",
    "deployment",
    "mode",
}
MODES = ("proxy", "engine")


def parse_endpoints(doc: Any, source: str) -> list[EndpointSpec]:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("endpoints"), list):
        raise ValueError(f"{source}: expected 'endpoints:' with a list of endpoints")
    specs: list[EndpointSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(doc["endpoints"]):
        where = f"{source}: endpoints[{i}]"
        if not isinstance(item, Mapping):
            raise ValueError(f"{where} must be a mapping")
        unknown = set(item) - _FIELDS
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(_FIELDS)}")
        url = item.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"{where}: 'url' must be an http(s) URL of the pod's sidecar or engine")
        mode = str(item.get("mode") or "proxy")
        if mode not in MODES:
            raise ValueError(f"{where}: 'mode' must be one of {list(MODES)}, got {mode!r}")
        ep_id = str(item.get("id") or url)
        if ep_id in seen:
            raise ValueError(f"{where}: duplicate endpoint id {ep_id!r}")
        seen.add(ep_id)
        specs.append(
            EndpointSpec(
                endpoint_id=ep_id,
                http_url=url.rstrip("/"),
                grpc_target=item.get("grpc"),
                models=tuple(item.get("models") or ()),
                max_context_tokens=int(item.get("max_context_tokens") or (1 << 30)),
                gpu_class=str(item.get("gpu_class") or ""),
                lora_adapters=tuple(item.get("lora_adapters") or ()),
                profile=item.get("profile"),
                deployment=str(item.get("deployment") or ""),
                mode=mode,
            )
        )
    return specs


def load_endpoints_file(path: str | Path) -> list[EndpointSpec]:
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read endpoints file {p}: {exc}") from None
    return parse_endpoints(doc, str(p))


def apply_specs(table: dict[str, EndpointState], specs: list[EndpointSpec]) -> tuple[list[str], list[str]]:
    """Make ``table`` match ``specs``; returns (added ids, removed ids)."""
    wanted = {s.endpoint_id: s for s in specs}
    removed = [k for k in table if k not in wanted]
    for k in removed:
        del table[k]
    added = []
    for k, spec in wanted.items():
        current = table.get(k)
        if current is None:
            table[k] = EndpointState(spec)
            added.append(k)
        elif current.spec != spec:
            current.spec = spec
    return added, removed


async def watch_static_file(
    path: str | Path, table: dict[str, EndpointState], interval_s: float = 1.0
) -> None:
    """Re-read the endpoints file whenever its mtime changes; a bad edit keeps the last good set."""
    p = Path(path)
    last_mtime: float | None = None
    while True:
        try:
            mtime = p.stat().st_mtime
            if mtime != last_mtime:
                last_mtime = mtime
                added, removed = apply_specs(table, load_endpoints_file(p))
                if added or removed:
                    log.info("endpoints changed: +%s -%s", added, removed)
        except (OSError, ValueError) as exc:
            log.warning("keeping the last good endpoints: %s", exc)
        await asyncio.sleep(interval_s)
