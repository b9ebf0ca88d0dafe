"""``slofleet sidecar`` as a process: a bad policy file stops it with a message; a good one serves, and
SIGTERM drains, checkpoints and exits 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import httpx
import pytest

from slo_lab.fake_engine import FakeEngine, serve_fake_engine

SLOFLEET = str(Path(sys.executable).with_name("slofleet"))
POLICY = """\
apiVersion: slofleet.io/v1alpha1
kind: SLOPolicy
metadata: {name: cli}
spec:
  priorityClasses: [{name: std, weight: 1}]
  tiers: [{name: chat, kind: latency, ttftS: 2, tbtS: 0.5, priorityClass: std}]
  defaultTier: chat
  scheduling: {name: SCHED}
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _sidecar(*args: str) -> asyncio.subprocess.Process:
    cmd = [
        SLOFLEET,
        "--log-level",
        "WARNING",
        "sidecar",
        "--host",
        "127.0.0.1",
        "--predictor",
        "fallback",
        *args,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )


@pytest.mark.slow
async def test_cli_serves_then_drains_and_checkpoints_on_sigterm(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(POLICY.replace("SCHED", "no-such-policy"))
    proc = await _sidecar(
        "--port", str(_port()), "--engine-url", "http://127.0.0.1:9", "--policy-file", str(bad)
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2 and b"unknown engine policy 'no-such-policy'" in err

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("SCHED", "edf"))
    eng = FakeEngine()
    async with serve_fake_engine(eng) as url, httpx.AsyncClient(timeout=10) as http:
        port = _port()
        base = f"http://127.0.0.1:{port}"
        state_dir = str(tmp_path / "s")
        proc = await _sidecar(
            "--port", str(port), "--engine-url", url, "--policy-file", str(policy), "--state-dir", state_dir,
            "--grpc-port", str(_port()),
        )  # fmt: skip
        for _ in range(300):
            try:
                if (await http.get(base + "/ready")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
        health = (await http.get(base + "/health")).json()
        assert health["policy"] == "edf" and health["predictor"] == "fallback"
        body = {"model": eng.model, "prompt": "hi", "max_tokens": 5, "ignore_eos": True}
        answer = await http.post(base + "/v1/completions", json=body)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 5
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
    state = json.loads((tmp_path / "s" / "state.json").read_text())
    assert state["in_flight"] == [] and len(state["history"]["rows"]) == 1
    assert (tmp_path / "s" / "predictor.json").exists()
    assert b"Traceback" not in err
