"""The sidecar's background duties: engine probes, checkpoints and restore, config hot reload, drain.

A policy file that fails validation never replaces the running config: the reason shows on
``/health`` (``config_error``) and in a log line, and the previous config keeps serving. Drain
(SIGTERM) stops admitting, hands waiting requests back with 503 (the router retries elsewhere), lets
released ones finish for up to ``drain_timeout_s`` and then ends the rest with an explicit error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from slo_sidecar.config import ConfigError, parse_policy_file
from slo_sidecar.engine_client import probe
from slo_sidecar.errors import overloaded
from slo_sidecar.estimators import QRF_FILE
from slo_sidecar.history import read_state, write_state
from slo_sidecar.service import Sidecar

log = logging.getLogger(__name__)


async def probe_loop(sc: Sidecar, every_s: float = 1.0) -> None:
    """Probe the engine every ``every_s``; idle compound programs end (their pattern joins the history)."""
    assert sc.client is not None
    while True:
        was = sc.engine.healthy
        await probe(sc.client, sc.engine_url, sc.engine)
        sc.tracker.expire_programs()
        if was != sc.engine.healthy:
            log.warning("engine %s is %s", sc.engine_url, "healthy" if sc.engine.healthy else sc.engine.error)
        await asyncio.sleep(every_s)


# ---- persistence ------------------------------------------------------------------------------
async def checkpoint(sc: Sidecar, state_dir: Path, *, clean: bool = False) -> Path:
    """Write history and the predictor; ``clean``: nothing is in flight any more (orderly stop)."""
    name = getattr(sc.estimator, "checkpoint_name", QRF_FILE)
    predictor = state_dir / name
    save = getattr(sc.estimator, "save", None)
    if save is not None and (getattr(sc.estimator, "learns_online", False) or not predictor.exists()):
        state_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(save, predictor)
    extra = {
        "saved_unix_s": time.time(),
        "predictor": sc.estimator_source,
        "predictor_file": name if predictor.exists() else None,
        "config_digest": sc.config.digest,
    }
    in_flight = [] if clean else list(sc.jobs)
    if sc.calibration is not None:
        await asyncio.to_thread(sc.calibration.save, state_dir)
    return await asyncio.to_thread(write_state, state_dir, sc.history, in_flight, extra)


def restore(sc: Sidecar, state_dir: Path) -> None:
    """Load the last checkpoint; requests it lists as in flight were lost by the previous process."""
    if sc.calibration is not None:
        sc.calibration.load(state_dir)
    doc = read_state(state_dir, sc.history)
    if doc is None:
        return
    lost = doc.get("in_flight") or []
    if lost:
        sc.metrics.lost_on_restart.inc(len(lost))
        log.error(
            "the previous sidecar stopped with %d accepted requests in flight at its last checkpoint; "
            "their clients saw the connection fail",
            len(lost),
        )
    log.info("restored %d history rows from %s", len(sc.history.rows), state_dir)


async def checkpoint_loop(sc: Sidecar, state_dir: Path) -> None:
    while True:
        await asyncio.sleep(sc.knobs.checkpoint_every_s)
        try:
            await checkpoint(sc, state_dir)
        except OSError as exc:
            log.error("checkpoint to %s failed: %s", state_dir, exc)


# ---- hot reload -------------------------------------------------------------------------------
def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


async def reload_once(sc: Sidecar, path: Path) -> bool:
    """Re-read the policy file; True when a new config took effect."""
    try:
        cfg = await asyncio.to_thread(parse_policy_file, path)
    except ConfigError as exc:
        sc.config_error = f"{exc} (still serving config {sc.config.digest or 'default'})"
        sc.metrics.config_reloads.labels("invalid").inc()
        log.error("policy file rejected, keeping the last good config: %s", exc)
        return False
    sc.config_error = ""
    if cfg.digest == sc.config.digest:
        return False
    old = sc.config
    sc.config = cfg
    if (cfg.policy_name, cfg.policy_params) != (old.policy_name, old.policy_params):
        sc.scheduler.set_policy(cfg.make_policy())
    sc.metrics.config_reloads.labels("applied").inc()
    log.info(
        "policy file applied: digest %s, policy %s, tiers %s", cfg.digest, cfg.policy_name, sorted(cfg.tiers)
    )
    return True


async def watch_config(sc: Sidecar, path: Path, every_s: float = 1.0) -> None:
    """Poll the mounted file (Kubernetes swaps ConfigMap files by symlink, so inotify is unreliable)."""
    last = _stamp(path)
    while True:
        await asyncio.sleep(every_s)
        stamp = _stamp(path)
        if stamp != last:
            last = stamp
            await reload_once(sc, path)


# ---- drain ------------------------------------------------------------------------------------
def _engine_busy(sc: Sidecar) -> bool:
    """Engine mode: the engine still reports requests (the router streams them from it directly; the
    engine's container waits for this sidecar to exit before it stops, so they finish first)."""
    mirror = sc.mirror
    return mirror.seen and mirror.fresh(5.0) and len(mirror.report.requests) > 0


async def drain(sc: Sidecar, timeout_s: float) -> None:
    """Stop admitting; hand waiting requests back; let running ones finish within ``timeout_s``."""
    sc.draining = True
    for job in list(sc.scheduler.waiting):
        if not job.live.started:
            job.reject(
                overloaded("this pod is shutting down; send the request to another replica", "draining", 1)
            )
    deadline = time.monotonic() + timeout_s
    while (sc.jobs or _engine_busy(sc)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for job in list(sc.jobs.values()):
        job.emit("error", overloaded("this pod shut down before the request finished", "draining", 1))
    if sc.jobs:
        log.warning("drain timed out: %d requests ended with an error", len(sc.jobs))
        await asyncio.sleep(0.1)
