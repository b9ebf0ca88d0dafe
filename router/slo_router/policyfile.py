"""``--policy-file`` followed live: the router re-reads its SLOPolicy file when its content changes.

A Kubernetes ConfigMap volume is updated in place (an atomic symlink swap) within a minute of the
ConfigMap's edit, so a `helm upgrade` that changes the policy reaches every router without a restart
and without a checksum annotation. The file is compared by content, not by mtime (the swap keeps
mtimes of the old and new targets unrelated). A version that fails validation is logged with what to
change and the last good policy stays in force, the same rule as ``--policy-name``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slo_router.config import RouterConfig, from_policy

log = logging.getLogger(__name__)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def reload_once(
    path: Path, state: Any, seen: str | None, adjust: Callable[[RouterConfig], RouterConfig]
) -> str | None:
    """Apply the file if its content differs from ``seen``; returns the digest now in force (or seen)."""
    from slo_core.crd.loads import parse_policy

    digest = _digest(path)
    if digest is None or digest == seen:
        return seen
    try:
        policy = parse_policy(path.read_text(encoding="utf-8"), str(path))
        config = adjust(from_policy(policy.spec, require_keys=state.config.require_keys))
        state.apply_config(config, str(path))
    except (ValueError, OSError) as exc:
        log.error("policy file %s changed but was not applied; the last good version stays: %s", path, exc)
        return digest  # do not repeat the same complaint every poll
    log.info(
        "policy file %s reloaded: %d tiers, %d tenants, routing %s",
        path,
        len(config.tiers),
        len(config.tenants),
        config.routing_policy,
    )
    return digest


async def follow_policy_file(
    state: Any,
    path: str | Path,
    *,
    adjust: Callable[[RouterConfig], RouterConfig] = lambda config: config,
    every_s: float = 2.0,
) -> None:
    """Background job: poll the file's content every ``every_s`` and apply each new valid version."""
    p = Path(path)
    seen = _digest(p)  # the version read at start is in force already
    while True:
        await asyncio.sleep(every_s)
        seen = reload_once(p, state, seen, adjust)
