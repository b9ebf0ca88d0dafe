"""Run the emulated API server and a kopf operator in threads; drive them with the real kubectl.

The emulator gets its own thread and event loop, so synchronous clients (kubectl subprocesses, the
official client, Helm) never block the loop that serves them; kopf gets another thread, because on exit
it cancels every task of the loop it runs in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml
from kube.emulator import ApiEmulator

T = TypeVar("T")

ADMIN_TOKEN = "admin-token"
KUBECTL = os.environ.get("KUBECTL", "/usr/bin/kubectl")


class Cluster:
    """An emulated API server in a thread, with kubeconfigs per user and a kubectl runner."""

    def __init__(self, workdir: Path, users: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.users = {ADMIN_TOKEN: "admin", **(users or {})}
        self.emulator: ApiEmulator | None = None
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="kube-emulator", daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> Cluster:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the emulated API server did not start")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # surfaced to the test thread
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with ApiEmulator(users=self.users) as emulator, kmock.Server(emulator) as server:
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the emulator's loop (a consistent view of its state) and return its result."""
        assert self._loop is not None

        async def run() -> T:
            return fn()

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(10)

    # ------------------------------------------------------------------------------- kubeconfigs

    def kubeconfig(self, token: str = ADMIN_TOKEN, name: str = "admin") -> Path:
        path = self.workdir / f"kubeconfig-{name}.yaml"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulated", "cluster": {"server": self.url}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [
                {"name": name, "context": {"cluster": "emulated", "user": name, "namespace": "default"}}
            ],
            "current-context": name,
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True, timeout_s: float = 30) -> str:
        """Run the real kubectl against the emulator as the admin user; returns stdout."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig()), "HOME": str(self.workdir)}
        proc = subprocess.run(
            [KUBECTL, *args],
            check=False,
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc.stdout if check else proc.stdout + proc.stderr

    def get(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        """An object as kubectl sees it, or ``None`` when it does not exist."""
        out = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def wait_for(self, predicate: Callable[[], T], timeout_s: float = 10, what: str = "condition") -> T:
        """Poll ``predicate`` until it returns something truthy."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = predicate()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
            time.sleep(0.1)


class OperatorThread:
    """A kopf operator (standalone, cluster-wide) in its own thread; ``stop()`` ends it cleanly."""

    def __init__(self, operator_coro: Callable[[threading.Event, threading.Event], Any]) -> None:
        self._coro = operator_coro
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="kopf-operator", daemon=True)
        self.error: BaseException | None = None

    def _main(self) -> None:
        try:
            asyncio.run(self._coro(self._stop, self._ready))
        except BaseException as exc:
            self.error = exc

    def start(self, timeout_s: float = 10) -> OperatorThread:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._ready.is_set():
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the operator did not start: {self.error!r}")
            time.sleep(0.05)
        return self

    def stop(self, timeout_s: float = 10) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError("the operator did not stop")

    @contextlib.contextmanager
    def running(self) -> Iterator[OperatorThread]:
        self.start()
        try:
            yield self
        finally:
            self.stop()
