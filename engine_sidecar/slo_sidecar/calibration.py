"""Online calibration of the length bounds in the sidecar: strata, checkpoint, peers, metrics.

The calibration itself is ``slo_core.predict.calibration`` (the simulator runs the same code). Here:

- **Strata**: a request's stratum is ``<model>/<kind>`` (``--calibration-strata kind``, default),
  ``<model>/<tenant>`` or ``<model>/<kind>/<tenant>``.
- **Restart**: the state is written to ``calibration.json`` in ``--state-dir`` with every checkpoint
  (atomically) and read back at start; a corrupt file is moved aside and calibration starts afresh.
- **Replicas**: ``GET /slofleet/calibration`` returns this replica's own recent scores (numbers and
  stratum names, never text); with ``--calibration-peers`` the sidecar fetches its peers' every
  ``--calibration-sync-s`` seconds and merges them (union by origin and sequence number: idempotent
  and commutative, so any peer list converges and a peer fetched twice counts once). A peer entry
  ``dns+http://svc:port`` resolves every address of a (headless) Service, so one flag serves every
  replica of a ModelDeployment (the operator renders ``<name>-peers`` and ``--calibration-port``, a
  port only the ModelDeployment's engine pods may reach). A peer's answer is size-capped and
  validated; scores are clipped.
- **Peers authenticate** (with ``--tag-key-file``, as the operator renders it): the request carries
  an ``x-slofleet-auth`` call token (``slo_core.wire.callauth``, the gRPC services' scheme) for
  ``PEER_METHOD``, and the answer one over the SHA-256 of its body, so neither an outsider can read a
  replica's scores nor a pod without the key feed them (401 ``unauthenticated`` / answer refused,
  both counted).
- **Metrics**: ``slofleet_sidecar_bound_coverage_ratio{stratum,stage}`` (share of completions whose
  true length was within the bound issued at that stage, last 200), ``..._bound_correction_factor``
  (e^θ: the factor on the forest's remaining-length bound) and ``..._calibration_scores`` (how many
  recent scores back it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from slo_core.predict.calibration import (
    CalibratedEstimator,
    CalibrationParams,
    OnlineCalibrator,
    Plan,
)
from slo_core.predict.estimator import OutputBoundEstimator
from slo_core.wire.callauth import METADATA_KEY, call_token, check_call_token
from slo_core.wire.keyring import KeyRing

log = logging.getLogger(__name__)

STATE_FILE = "calibration.json"
PEER_PATH = "/slofleet/calibration"
MAX_PEER_BYTES = 4 << 20  # a peer's state larger than this is refused
PEER_METHOD = "GET /slofleet/calibration"  # what a peer's call token is bound to
Keys = Callable[[], KeyRing]


def answer_method(body: bytes) -> str:
    """What the token on an answer is bound to: the answer's own bytes."""
    return f"{PEER_METHOD} answer {hashlib.sha256(body).hexdigest()}"


def sign_answer(keys: Keys, body: bytes) -> str:
    now = time.time()
    return call_token(keys().signing_key(now), answer_method(body), now)


class CalibrationHub:
    """The sidecar's calibrated estimator plus its strata, persistence, peers and gauges."""

    def __init__(
        self,
        estimator: OutputBoundEstimator,
        *,
        origin: str,
        strata: str = "kind",
        model: str = "",
        window: int = 200,
    ) -> None:
        params = CalibrationParams(window=window)
        self.calibrator = OnlineCalibrator(estimator.params.quantile, params, origin=origin)
        self.estimator = CalibratedEstimator(estimator, self.calibrator)
        self.strata = strata
        self.model = model
        self.peer_scores = 0
        self.peer_errors = 0

    def stratum(self, model: str, kind: str, tenant: str) -> str:
        """``<model>/<kind>``, ``<model>/<tenant>`` or ``<model>/<kind>/<tenant>`` (--calibration-strata)."""
        model = (model or self.model or "-")[:100]
        if self.strata == "tenant":
            return f"{model}/{tenant[:64]}"
        if self.strata == "kind+tenant":
            return f"{model}/{kind}/{tenant[:64]}"
        return f"{model}/{kind}"

    def plan(  # noqa: PLR0917 - the admission's facts
        self, prompt_text: str | None, prompt_tokens: int, kind: str, max_tokens: int, model: str, tenant: str
    ) -> Plan:
        """One forest pass (CPU work: call it off the event loop)."""
        stratum = self.stratum(model, kind, tenant)
        return self.estimator.plan(prompt_text, prompt_tokens, kind, max_tokens, stratum)

    @staticmethod
    def forest_bound(plan: Plan) -> int:
        """The uncalibrated submission bound (equal to ``OutputBoundEstimator.bound`` on the same query)."""
        return max(1, min(math.ceil(plan.raw[0]), plan.max_tokens))

    def bound_at(self, plan: Plan, generated_tokens: int) -> int:
        return self.estimator.bound_at(plan, generated_tokens)

    def observe(
        self, plan: Plan, output_tokens: int, issued_at_submission: int, arrived_s: float | None = None
    ) -> None:
        """A natural end; ``arrived_s``: what ``calibrator.untrack`` returned (orders the windows)."""
        self.estimator.observe(plan, output_tokens, [issued_at_submission], arrived_s)

    # ---- persistence ------------------------------------------------------------------------
    def save(self, state_dir: Path) -> Path:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".calibration-", suffix=".json", dir=state_dir)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.calibrator.to_json(), f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            target = state_dir / STATE_FILE
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    def load(self, state_dir: Path) -> bool:
        """Restore a saved state; True when one was loaded. A corrupt file is moved aside."""
        path = state_dir / STATE_FILE
        if not path.exists():
            return False
        try:
            self.calibrator.load_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            os.replace(path, path.with_suffix(".json.corrupt"))
            log.error("calibration state %s is unusable (%s); moved aside, starting uncalibrated", path, exc)
            return False
        log.info("restored the bound calibration from %s (%d cells)", path, len(self.calibrator.snapshot()))
        return True

    # ---- peers ------------------------------------------------------------------------------
    def merge_peer(self, doc: dict[str, Any]) -> int:
        added = self.calibrator.merge(doc)
        self.peer_scores += added
        return added


async def expand_peers(peers: list[str]) -> list[str]:
    """Base URLs of the peers: ``dns+http://host:port`` becomes one URL per address of ``host``."""
    out: list[str] = []
    for peer in peers:
        if not peer.startswith("dns+"):
            out.append(peer.rstrip("/"))
            continue
        url = urlsplit(peer[4:])
        if url.hostname is None:
            continue
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            infos = await asyncio.to_thread(socket.getaddrinfo, url.hostname, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            log.warning("calibration peers: cannot resolve %s (%s)", url.hostname, exc)
            continue
        for addr in sorted({str(i[4][0]) for i in infos}):
            host = f"[{addr}]" if ":" in addr else addr
            out.append(f"{url.scheme}://{host}:{port}")
    return out


async def fetch_peer(client: httpx.AsyncClient, base_url: str, keys: Keys | None = None) -> dict[str, Any]:
    """A peer's own scores (size-capped; raises httpx.HTTPError or ValueError). With ``keys`` the call
    carries a token and the answer must carry one over its body made with the same key ring."""
    headers = {}
    if keys is not None:
        now = time.time()
        headers[METADATA_KEY] = call_token(keys().signing_key(now), PEER_METHOD, now)
    async with client.stream("GET", base_url + PEER_PATH, headers=headers, timeout=5.0) as resp:
        resp.raise_for_status()
        chunks, size = [], 0
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > MAX_PEER_BYTES:
                raise ValueError(f"calibration state of {base_url} exceeds {MAX_PEER_BYTES} bytes")
            chunks.append(chunk)
        token = resp.headers.get(METADATA_KEY)
    body = b"".join(chunks)
    if keys is not None:
        why = check_call_token(token, answer_method(body), keys().verify_keys, time.time())
        if why is not None:
            raise ValueError(f"calibration answer of {base_url} not authenticated: {why}")
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError("calibration state is not an object")
    return doc


async def sync_once(
    hub: CalibrationHub, client: httpx.AsyncClient, peers: list[str], keys: Keys | None = None
) -> int:
    """Fetch every peer once and merge; returns the number of new scores."""
    added = 0
    for url in await expand_peers(peers):
        try:
            added += hub.merge_peer(await fetch_peer(client, url, keys))
        except (httpx.HTTPError, ValueError) as exc:
            hub.peer_errors += 1
            log.debug("calibration peer %s: %s", url, exc)
    return added


async def sync_loop(hub: CalibrationHub, peers: list[str], every_s: float, keys: Keys | None = None) -> None:
    async with httpx.AsyncClient() as client:
        while True:
            await asyncio.sleep(every_s)
            await sync_once(hub, client, peers, keys)


async def state_endpoint(request: Request) -> Response:
    """``GET /slofleet/calibration``: this replica's own scores, for its peers (numbers and stratum
    names, no text); with a key ring only to a caller with a call token, and the answer signed."""
    sc = request.app.state.sidecar
    hub: CalibrationHub | None = sc.calibration
    if hub is None:
        off = {"error": {"message": "online calibration is off", "code": "no_calibration"}}
        return JSONResponse(off, 404)
    keys: Keys | None = sc.keys
    if keys is None:
        return JSONResponse(hub.calibrator.to_json(origin_only=True))
    why = check_call_token(request.headers.get(METADATA_KEY), PEER_METHOD, keys().verify_keys, time.time())
    if why is not None:
        if sc.calibration_gauges is not None:
            sc.calibration_gauges.peer_refused.labels(why).inc()
        log.debug("calibration state refused to %s: %s", request.client, why)
        error = {"message": f"slofleet: {why}", "type": "authentication_error", "code": "unauthenticated"}
        refused = {"error": error}
        return JSONResponse(refused, 401)
    body = json.dumps(hub.calibrator.to_json(origin_only=True), separators=(",", ":")).encode()
    return Response(body, media_type="application/json", headers={METADATA_KEY: sign_answer(keys, body)})


class CalibrationGauges:
    """The calibration's Prometheus gauges (filled from a snapshot at scrape time)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p, labels = "slofleet_sidecar_", ("stratum", "stage")
        self.coverage = Gauge(
            p + "bound_coverage_ratio",
            "share of recent completions (last 200) within the length bound issued at this stage",
            labels,
            registry=registry,
        )
        self.factor = Gauge(
            p + "bound_correction_factor",
            "online calibration's factor on the forest's remaining-length bound (1 = forest as trained)",
            labels,
            registry=registry,
        )
        self.scores = Gauge(
            p + "calibration_scores",
            "recent completions (this replica's and its peers') behind the correction",
            labels,
            registry=registry,
        )
        self.peer_scores = Gauge(
            p + "calibration_peer_scores", "scores merged from peer replicas since start", registry=registry
        )
        self.peer_refused = Counter(
            p + "calibration_peer_refused",
            "calls for this replica's calibration refused (401: no, stale or wrong call token), by reason",
            ["reason"],
            registry=registry,
        )
        self.peer_errors = Gauge(
            p + "calibration_peer_errors",
            "peer fetches that failed since start (unreachable, refused, unauthenticated or invalid answer)",
            registry=registry,
        )

    def update(self, hub: CalibrationHub) -> None:
        for g in (self.coverage, self.factor, self.scores):
            g.clear()
        for cell in hub.calibrator.snapshot():
            labels = (cell["stratum"], str(cell["stage"] * hub.estimator.every_tokens))
            if cell["coverage_recent"] is not None:
                self.coverage.labels(*labels).set(cell["coverage_recent"])
            self.factor.labels(*labels).set(cell["factor"])
            self.scores.labels(*labels).set(cell["scores"])
        self.peer_scores.set(hub.peer_scores)
        self.peer_errors.set(hub.peer_errors)
