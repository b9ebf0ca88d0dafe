"""Running a sidecar: HTTP (uvicorn) and gRPC on one event loop, background duties, drain on SIGTERM.

:func:`running_sidecar` is the in-process starter tests and benchmarks use (ephemeral loopback ports);
:func:`serve_forever` is what ``slofleet sidecar`` runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import uvicorn

from slo_sidecar import calibration, lifecycle
from slo_sidecar.app import create_app, create_calibration_app, create_metrics_app
from slo_sidecar.engine_client import new_session, probe
from slo_sidecar.grpc_service import start_grpc
from slo_sidecar.service import Sidecar

log = logging.getLogger(__name__)


@dataclass
class Running:
    """A started sidecar: its core and where it listens."""

    sidecar: Sidecar
    http_url: str
    grpc_target: str
    server: uvicorn.Server
    metrics_url: str = ""  # with a metrics port: where /metrics is served ("" : on http_url)
    calibration_url: str = ""  # with a calibration port: where peers fetch the calibration ("": http_url)


class _Server(uvicorn.Server):
    """uvicorn, but SIGTERM/SIGINT start a drain first (the sidecar stops admitting, then exits)."""

    def __init__(self, config: uvicorn.Config, sc: Sidecar, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.sc = sc
        self.drain_timeout_s = drain_timeout_s
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_task is not None:  # a second signal: stop now
            self.force_exit = True
            self.should_exit = True
            return
        log.info("signal %d: draining (up to %.0f s)", sig, self.drain_timeout_s)
        loop = asyncio.get_event_loop()
        self._drain_task = loop.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        await lifecycle.drain(self.sc, self.drain_timeout_s)
        self.should_exit = True


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


@asynccontextmanager
async def running_sidecar(
    sc: Sidecar,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    grpc_port: int | None = 0,
    state_dir: Path | None = None,
    policy_file: Path | None = None,
    reload_every_s: float = 1.0,
    metrics_port: int | None = None,
    calibration_port: int | None = None,
) -> AsyncIterator[Running]:
    """Start the sidecar on this event loop; on exit drain it, checkpoint and stop everything."""
    if state_dir is not None:
        lifecycle.restore(sc, state_dir)
    sock = _listen(host, port)
    http_port = sock.getsockname()[1]
    if not sc.knobs.pod:
        sc.knobs = sc.knobs.model_copy(update={"pod": f"{host}:{http_port}"})
    sc.client = httpx.AsyncClient(limits=httpx.Limits(max_connections=4096, max_keepalive_connections=512))
    sc.session = new_session()
    await probe(sc.client, sc.engine_url, sc.engine)
    jobs: list[Coroutine[Any, Any, None]] = [sc.scheduler.run(), lifecycle.probe_loop(sc)]
    if state_dir is not None:
        jobs.append(lifecycle.checkpoint_loop(sc, state_dir))
    if policy_file is not None:
        jobs.append(lifecycle.watch_config(sc, policy_file, reload_every_s))
    peers = [p.strip() for p in sc.knobs.calibration_peers.split(",") if p.strip()]
    if sc.calibration is not None and peers:
        jobs.append(calibration.sync_loop(sc.calibration, peers, sc.knobs.calibration_sync_s, sc.keys))
    tasks = [asyncio.create_task(j) for j in jobs]
    grpc_server, bound_grpc = (None, 0)
    if grpc_port is not None:
        grpc_server, bound_grpc = await start_grpc(sc, host, grpc_port)
    side: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []
    metrics_url = calibration_url = ""
    if metrics_port is not None:  # /metrics on its own port, off the public one
        metrics_url = _side_server(create_metrics_app(sc), host, metrics_port, side)
    if calibration_port is not None:  # the peers' calibration route on a port only peers may reach
        calibration_url = _side_server(create_calibration_app(sc), host, calibration_port, side)
    config = uvicorn.Config(
        create_app(sc, metrics_route=metrics_port is None, calibration_route=calibration_port is None),
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=5,
        access_log=False,
        http="httptools",  # measured: h11 was a large share of the relay's CPU per chunk
    )
    server = _Server(config, sc, sc.knobs.drain_timeout_s)
    serve_task = asyncio.create_task(server._serve(sockets=[sock]))
    while not server.started and not serve_task.done():
        await asyncio.sleep(0.01)
    try:
        yield Running(
            sc, f"http://{host}:{http_port}", f"{host}:{bound_grpc}", server, metrics_url, calibration_url
        )
    finally:
        for side_server, side_task in side:
            side_server.should_exit = True
            await side_task
        if not server.should_exit:
            await lifecycle.drain(sc, sc.knobs.drain_timeout_s)
            server.should_exit = True
        await serve_task
        await _stop(sc, tasks, grpc_server, state_dir)
        sock.close()


def _side_server(
    app: Any, host: str, port: int, side: list[tuple[uvicorn.Server, asyncio.Task[None]]]
) -> str:
    """Serve ``app`` on its own port (appended to ``side``); returns its base URL."""
    sock = _listen(host, port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
    side.append((server, asyncio.create_task(server._serve(sockets=[sock]))))
    return f"http://{host}:{sock.getsockname()[1]}"


async def _stop(
    sc: Sidecar, tasks: list[asyncio.Task[None]], grpc_server: Any, state_dir: Path | None
) -> None:
    if grpc_server is not None:
        await grpc_server.stop(grace=0.5)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if state_dir is not None:
        await lifecycle.checkpoint(sc, state_dir, clean=not sc.jobs)
    if sc.client is not None:
        await sc.client.aclose()
        sc.client = None
    if sc.session is not None:
        await sc.session.close()
        sc.session = None


async def serve_forever(
    sc: Sidecar,
    *,
    host: str,
    port: int,
    grpc_port: int | None,
    state_dir: Path | None,
    policy_file: Path | None,
    metrics_port: int | None = None,
    calibration_port: int | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (then drain, checkpoint and return)."""
    async with running_sidecar(
        sc,
        host=host,
        port=port,
        grpc_port=grpc_port,
        state_dir=state_dir,
        policy_file=policy_file,
        metrics_port=metrics_port,
        calibration_port=calibration_port,
    ) as run:
        log.info(
            "sidecar (%s mode) on %s, gRPC %s, engine %s",
            sc.knobs.mode,
            run.http_url,
            run.grpc_target,
            sc.engine_url,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, run.server.handle_exit, sig, None)
        while not run.server.should_exit:
            await asyncio.sleep(0.1)
