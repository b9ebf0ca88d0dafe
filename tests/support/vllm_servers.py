"""Starting and driving real vLLM servers (CPU build, .venv-vllm) and an engine-mode sidecar (.venv) for
the tests under tests/vllm: one place for what several of those modules use."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from repo_paths import ROOT

from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags

SCHEDULER_CLS = "slo_vllm_plugin.scheduler.SLOScheduler"
PROMPT = "def add(a, b):\n    return a + b\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 420.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not healthy after {timeout_s} s:\n{log.read_text()[-4000:]}")


@dataclass
class VLLMServer:
    url: str
    trace: Path

    def events(self, kind: str) -> list[dict[str, Any]]:
        lines = self.trace.read_text().splitlines() if self.trace.exists() else []
        return [e for e in map(json.loads, lines) if e["event"] == kind]


def start_vllm(
    model: Path, workdir: Path, port: int | None = None, **env: str
) -> tuple[subprocess.Popen[bytes], VLLMServer, Path]:
    port = port or free_port()
    trace = workdir / "engine-trace.jsonl"
    log = workdir / "vllm.log"
    child_env = {
        **os.environ,
        "TMPDIR": str(workdir),
        "VLLM_CACHE_ROOT": str(workdir / "cache"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "SLOFLEET_ENGINE_TRACE": str(trace),
        "VLLM_SERVER_DEV_MODE": "1",  # the /pause and /resume endpoints the tests queue requests with
        **env,
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "512", "--enforce-eager", "--kv-cache-memory-bytes", str(64 << 20),
        "--max-num-seqs", "1", "--scheduler-cls", SCHEDULER_CLS,
    ]  # fmt: skip
    with log.open("wb") as fh:
        # its own process group: stopping it also stops vLLM's EngineCore and worker processes
        proc = subprocess.Popen(
            cmd, env=child_env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
    except Exception:
        stop(proc)
        raise
    return proc, VLLMServer(url, trace), log


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group (vLLM and the sidecar drain), SIGKILL it if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def xargs(deadline_s: float, key: str) -> dict[str, Any]:
    tags = EngineTags(SLOTargets(RequestKind.DEADLINE, deadline_s=deadline_s), request_key=key)
    return tags.to_xargs()


def complete(client: openai.OpenAI, max_tokens: int, extra_body: dict[str, Any]) -> int:
    out = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=max_tokens, extra_body={"ignore_eos": True, **extra_body}
    )
    assert out.usage is not None
    return out.usage.completion_tokens


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def queue_while_paused(
    server: VLLMServer, send: Callable[[str, float], int], deadlines: dict[str, float]
) -> list[int]:
    """Queue requests in a paused engine, one at a time in the order given, then resume it.

    The engine is paused in vLLM's ``keep`` mode: it takes requests into the scheduler's waiting queue
    but schedules none. Each request is sent once the previous one has reached the queue (its
    ``arrive`` trace event), so the arrival order is exactly the order of ``deadlines`` however slow
    the machine; on resume the scheduler admits the queue one at a time (one sequence slot). Nothing
    here depends on timing, unlike holding the slot with a long request, which a loaded two-core
    machine can finish before the queue has formed. Returns the requests' completion lengths.
    """
    seen_before = len(server.events("arrive"))
    admitted_before = len(server.events("admit"))

    def arrived() -> list[str]:
        return [e["key"] for e in server.events("arrive")[seen_before:]]

    httpx.post(f"{server.url}/pause", params={"mode": "keep"}, timeout=30).raise_for_status()
    try:
        with ThreadPoolExecutor(max_workers=len(deadlines)) as pool:
            futures = []
            for key, dl in deadlines.items():
                futures.append(pool.submit(send, key, dl))
                done = futures[-1]
                wait_for(lambda key=key, done=done: key in arrived() or done.done(), f"{key} to be queued")
            assert arrived() == list(deadlines), "the requests reached the engine in the order sent"
            assert len(server.events("admit")) == admitted_before, "a paused engine admits nothing"
            httpx.post(f"{server.url}/resume", timeout=30).raise_for_status()
            return [f.result(timeout=120) for f in futures]
    finally:
        httpx.post(f"{server.url}/resume", timeout=30)  # idempotent; never leave the engine paused


MAIN_PYTHON = ROOT / ".venv" / "bin" / "python"
SIDECAR_POLICY = """\
apiVersion: slofleet.io/v1alpha1
kind: SLOPolicy
metadata: {name: plugin-test}
spec:
  priorityClasses: [{name: standard, weight: 1}]
  # the tier's deadline is the strictest a client may ask for; the test's requests loosen it (10-40 s)
  tiers: [{name: batch, kind: deadline, deadlineS: 5, priorityClass: standard}]
  defaultTier: batch
  scheduling: {name: edf}
  routing: {name: round-robin}
"""


@dataclass
class Fleet:
    server: VLLMServer
    sidecar_url: str


def start_sidecar(workdir: Path, engine_port: int, grpc_port: int) -> tuple[subprocess.Popen[bytes], str]:
    if not MAIN_PYTHON.exists():
        pytest.skip("the main virtual environment (.venv, made by scripts/test.sh) runs the sidecar")
    policy = workdir / "policy.yaml"
    policy.write_text(SIDECAR_POLICY)
    port = free_port()
    cmd = [
        str(MAIN_PYTHON), "-m", "slo_core.cli", "sidecar", "--host", "127.0.0.1", "--port", str(port),
        "--engine-url", f"http://127.0.0.1:{engine_port}", "--policy-file", str(policy),
        "--grpc-port", str(grpc_port), "--mode", "engine", "--state-dir", str(workdir / "state"),
    ]  # fmt: skip
    log = (workdir / "sidecar.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"
