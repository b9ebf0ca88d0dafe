"""Running engine-sim: in the current event loop, in a background thread, or as the CLI's process."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

import uvicorn
from starlette.applications import Starlette

from .app import create_app
from .runner import EngineRunner
from .settings import EngineSimSettings


class _Server(uvicorn.Server):
    """uvicorn's server, minus re-raising a caught SIGTERM/SIGINT after the graceful shutdown (which
    would end the process by that signal instead of exit code 0)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


@dataclass(frozen=True)
class EngineSimServer:
    """A running engine-sim: ``url`` (``http://host:port``), ``base_url`` for the openai client."""

    host: str
    port: int
    app: Starlette
    server: uvicorn.Server

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def runner(self) -> EngineRunner:
        runner: EngineRunner = self.app.state.runner
        return runner

    @property
    def model(self) -> str:
        return self.runner.model_name


def _settings(settings: EngineSimSettings | None, fields: dict[str, Any]) -> EngineSimSettings:
    base = settings.model_dump() if settings is not None else {}
    return EngineSimSettings(**{**base, **fields})


@asynccontextmanager
async def serve_engine_sim(
    settings: EngineSimSettings | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    graceful_s: float = 2.0,
    **fields: Any,
) -> AsyncIterator[EngineSimServer]:
    """Serve engine-sim in this event loop (``port=0``: a free port); fields override ``settings``."""
    app = create_app(_settings(settings, fields))
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", timeout_graceful_shutdown=int(max(1, graceful_s))
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("engine-sim stopped while starting")
            await asyncio.sleep(0.01)
        yield EngineSimServer(host, sock.getsockname()[1], app, server)
    finally:
        # end every live request first so open streams finish instead of holding the shutdown
        await app.state.runner.stop()
        server.should_exit = True
        await task
        sock.close()


class EngineSimThread:
    """``with EngineSimThread(speedup=20) as sim: ...`` — engine-sim in a background thread (sync tests)."""

    def __init__(
        self,
        settings: EngineSimSettings | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        **fields: Any,
    ) -> None:
        self._settings = _settings(settings, fields)
        self._host = host
        self._port = port
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.server: EngineSimServer | None = None

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with serve_engine_sim(self._settings, host=self._host, port=self._port) as srv:
                self.server = srv
                self._started.set()
                await self._stop.wait()
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._started.set()

    def __enter__(self) -> EngineSimServer:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main()), name="engine-sim", daemon=True
        )
        self._thread.start()
        if not self._started.wait(30) or self.server is None:
            raise RuntimeError(f"engine-sim did not start: {self._error!r}")
        return self.server

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(15)


async def serve_forever(app: Starlette, host: str, port: int, log_level: str = "info") -> None:
    """The CLI's server: until SIGINT/SIGTERM (uvicorn's handlers), then a short graceful drain."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    await _Server(config).serve()
